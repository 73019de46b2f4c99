"""The reference for Sluice's seed-0 yolov8n (`Yolo::new_seeded(yolov8n, nc 80, seed 0)`, which the model tests
build instead of loading a 12.7 MB file): Ultralytics 8.4.190's `DetectionModel('yolov8n.yaml', nc=80)` after
`torch.manual_seed(0)`, its state dict described key by key as dtype, shape and the SHA-256 of the tensor's
little-endian bytes, so the test holds every value bit for bit. Run with the peers' venv (torch, ultralytics):

    python make_yolov8n_seed0.py yolov8n_seed0.json
"""
import hashlib
import json
import sys

import torch
from ultralytics.nn.tasks import DetectionModel

DTYPES = {torch.float32: "F32", torch.int64: "I64"}

torch.manual_seed(0)
m = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
keys = {}
for k, v in m.state_dict().items():
    a = v.detach().contiguous().numpy()
    keys[k] = [DTYPES[v.dtype], list(v.shape), hashlib.sha256(a.astype(a.dtype.newbyteorder("<")).tobytes()).hexdigest()]
with open(sys.argv[1], "w") as f:
    f.write('{"model":"yolov8n.yaml","nc":80,"seed":0,"keys":{\n')
    f.write(",\n".join(json.dumps(k) + ":" + json.dumps(v, separators=(",", ":")) for k, v in keys.items()))
    f.write("\n}}\n")
