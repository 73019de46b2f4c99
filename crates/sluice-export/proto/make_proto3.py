"""Writes `onnx.proto3`, the proto3 form of ONNX's schema, from the `onnx` package's `onnx.in.proto` with ONNX's own
translation (`onnx.gen_proto.translate`, what ONNX's build runs to make its `onnx.proto3`):

    python make_proto3.py        # with `pip install onnx==1.23.2`, e.g. the peers' venv
"""
import os

import onnx
from onnx.gen_proto import translate

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(os.path.dirname(onnx.__file__), "onnx.in.proto"), encoding="utf-8") as f:
    source = f.read()
with open(os.path.join(HERE, "onnx.proto3"), "w", newline="", encoding="utf-8") as f:
    f.write(translate(source, proto=3, onnx_ml=False, package_name="onnx"))
print("onnx", onnx.__version__)
