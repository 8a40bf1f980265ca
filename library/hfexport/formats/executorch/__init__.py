"""ExecuTorch `.pte` (+ `.ptd`): the engine's ExecuTorch export and ExecuTorch's LLM runner contract."""
