"""The reference for `tests/torch_init.rs`: Ultralytics 8.4.190's initial weights of a DetectionModel after
`init_seeds(0)` (what its trainer starts from with `seed=0`), for yolov8n, yolo11n and yolo26n with 6 classes.

Each float tensor of the state dict is written as a digest: its first and last value (float32, exact), and the sum
and sum of squares of its values in float64. Run with the peers' venv (torch, ultralytics 8.4.190):

    python make_torch_init.py torch_init.json
"""
import json
import sys

import torch
from ultralytics.nn.tasks import DetectionModel
from ultralytics.utils.torch_utils import init_seeds

out = {"seed": 0, "nc": 6, "models": {}}
for name in ("yolov8n", "yolo11n", "yolo26n"):
    init_seeds(0, deterministic=True)
    m = DetectionModel(f"{name}.yaml", nc=6, verbose=False)
    digests = {}
    for k, v in m.state_dict().items():
        if not v.is_floating_point():
            continue
        f = v.detach().float().flatten()
        d = f.double()
        digests[k] = [f[0].item(), f[-1].item(), d.sum().item(), (d * d).sum().item()]
    out["models"][name] = digests
with open(sys.argv[1], "w") as f:
    json.dump(out, f, separators=(",", ":"))
    f.write("\n")
