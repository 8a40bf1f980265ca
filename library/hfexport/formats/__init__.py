"""One package per export format (torch.export, ONNX, OpenVINO, ExecuTorch), each holding all of that format."""
