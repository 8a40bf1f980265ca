"""The deployment runtimes of OpenVINO exports: OpenVINO GenAI, optimum-intel."""
