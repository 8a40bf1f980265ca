"""The part of ONNX's protobuf schema that the external-data check reads, parsed by protobuf without importing onnx.

`file_check.check_onnx_file` walks every tensor of a `.onnx` file (initializers, sparse initializers, node attributes,
subgraphs, local functions) and reads where its bytes are kept. Importing onnx to parse the file costs ~40 ms of CPU
per process (its package imports its helpers, NumPy types and ml_dtypes), a seventh of loading a published target to
its first output (benchmarks/load_published.py). These message classes are built here from the field numbers and
types of `onnx/onnx-ml.proto` (onnx 1.23, proto2, as onnx declares it), for exactly the fields the check reads; protobuf
itself parses the file, skipping every other field as onnx's own classes would read and ignore it.
tests/test_safety.py checks every field against onnx's descriptors, so a field read here is the field onnx reads.
"""

from __future__ import annotations

from functools import lru_cache

PACKAGE = "hfexport_onnx_subset"
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL

# message -> (field, number, type, repeated): a type is a message of this table or a scalar protobuf type name.
FIELDS = {
    "ModelProto": [("graph", 7, "GraphProto", False), ("functions", 25, "FunctionProto", True)],
    "FunctionProto": [("node", 7, "NodeProto", True)],
    "GraphProto": [("node", 1, "NodeProto", True), ("initializer", 5, "TensorProto", True),
                   ("sparse_initializer", 15, "SparseTensorProto", True)],
    "NodeProto": [("attribute", 5, "AttributeProto", True)],
    "AttributeProto": [("name", 1, "string", False), ("t", 5, "TensorProto", False), ("g", 6, "GraphProto", False),
                       ("tensors", 10, "TensorProto", True), ("graphs", 11, "GraphProto", True),
                       ("sparse_tensor", 22, "SparseTensorProto", False),
                       ("sparse_tensors", 23, "SparseTensorProto", True)],
    "TensorProto": [("dims", 1, "int64", True), ("data_type", 2, "int32", False), ("name", 8, "string", False),
                    ("external_data", 13, "StringStringEntryProto", True),
                    ("data_location", 14, "TensorProto.DataLocation", False)],
    "SparseTensorProto": [("values", 1, "TensorProto", False), ("indices", 2, "TensorProto", False)],
    "StringStringEntryProto": [("key", 1, "string", False), ("value", 2, "string", False)],
}
DATA_LOCATION = {"DEFAULT": 0, "EXTERNAL": EXTERNAL}  # an enum, closed as in proto2: other values read as DEFAULT

# TensorProto.DataType -> bytes per element (what onnx.helper.tensor_dtype_to_np_dtype's itemsize gives); STRING and
# UNDEFINED have no fixed size and are absent. PACKED: sub-byte types stored several to a byte.
ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
            17: 1, 18: 1, 19: 1, 20: 1, 21: 1, 22: 1, 23: 1, 24: 1, 25: 1, 26: 1, 27: 1, 28: 1}
PACKED = {21: 2, 22: 2, 23: 2, 25: 4, 26: 4}  # UINT4, INT4, FLOAT4E2M1: two a byte; UINT2, INT2: four


@lru_cache(maxsize=1)
def model_proto():
    """The `ModelProto` class of this subset (a private descriptor pool: onnx's own classes are untouched)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    scalars = {"string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
               "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
               "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32}
    file = descriptor_pb2.FileDescriptorProto(name=f"{PACKAGE}.proto", package=PACKAGE, syntax="proto2")
    for message, fields in FIELDS.items():
        proto = file.message_type.add(name=message)
        if message == "TensorProto":
            enum = proto.enum_type.add(name="DataLocation")
            for name, number in DATA_LOCATION.items():
                enum.value.add(name=name, number=number)
        for name, number, kind, repeated in fields:
            field = proto.field.add(name=name, number=number, label=(
                descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED if repeated
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL))
            if kind in scalars:
                field.type = scalars[kind]
            elif kind == "TensorProto.DataLocation":
                field.type, field.type_name = descriptor_pb2.FieldDescriptorProto.TYPE_ENUM, f".{PACKAGE}.{kind}"
            else:
                field.type, field.type_name = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.ModelProto"))
