"""OpenVINO IR: the engine's OpenVINO export, saved as optimum-intel and OpenVINO GenAI read it."""
