"""Rebinding: a checkpoint's new weights written into a previous export's graphs instead of exporting again.

`weight_map` records, at every full export, which parameters each stored tensor of the artifacts holds and how
(identity, transpose, reshape, cast, concatenation), verified by exact comparison; `apply` writes the new weights
through it. One module per format (`onnx`, `openvino`, `pt2`, `pte`) lists the stored tensors of the files a
target saved and writes new bytes in place, whatever the graph files are named.
"""
