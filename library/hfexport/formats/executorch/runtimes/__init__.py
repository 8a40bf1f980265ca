"""The deployment runtimes of ExecuTorch exports: ExecuTorch's TextLLMRunner, optimum-executorch."""
