#!/usr/bin/env python3
"""Ultralytics 8.4.190 on Sluice's embedded default with another model family, for the comparison beside
`sluice train --config configs/quick.yaml --model configs/models/<family>-tiny.yaml` (needs the peers' venv:
`bash $PEERS_DIR/setup.sh`; run with its python):

    ~/.cache/sluice-peers/venv/bin/python benches/ul_quick_family.py FAMILY DATA_YAML [SEED] [OUT_DIR]

FAMILY is yolov8, yolo11 or yolo26: Ultralytics' own `<family>.yaml` with the one scale t = [depth, 0.125, 1024] at
the family's n depth (0.33 for yolov8, 0.5 for yolo11 and yolo26), which is Sluice's `configs/models/<family>-tiny.yaml`.
The settings are configs/quick.yaml's, as the peers' m15_ul_quick.py runs them: imgsz 192, 90 epochs, batch 16,
close_mosaic 10, cache ram, 2 workers, CPU, amp off, optimizer auto (AdamW at this length; the OPTIMIZER environment
variable names another, e.g. MuSGD), 2 torch threads (OMP_NUM_THREADS). Prints one JSON line {family, seed, optimizer,
wall_s, map50, map}; results.csv lands in OUT_DIR/<family>-s<seed> (with -<optimizer> when OPTIMIZER is set).
"""
import json
import os
import sys
import tempfile
import time

import torch
import yaml
from ultralytics import YOLO
from ultralytics.nn.tasks import yaml_model_load

family, data = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
out = sys.argv[4] if len(sys.argv) > 4 else os.path.join(os.getcwd(), "runs", "ul_family")
depth = {"yolov8": 0.33, "yolo11": 0.5, "yolo26": 0.5}[family]
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
d = yaml_model_load(f"{family}n.yaml")
d["scales"] = {"t": [depth, 0.125, 1024]}
d.pop("scale", None)
d.pop("yaml_file", None)
tmp = tempfile.mkdtemp()
cfg = os.path.join(tmp, f"{family}t.yaml")
with open(cfg, "w") as f:
    yaml.safe_dump(d, f, sort_keys=False)
optimizer = os.environ.get("OPTIMIZER", "auto")
name = f"{family}-s{seed}" + ("" if optimizer == "auto" else f"-{optimizer}")
m = YOLO(cfg)
t0 = time.time()
r = m.train(data=data, epochs=90, imgsz=192, batch=16, close_mosaic=10, cache="ram", seed=seed, workers=2,
            device="cpu", project=out, name=name, exist_ok=True, plots=False, verbose=False, amp=False,
            optimizer=optimizer)
print(json.dumps({"family": family, "seed": seed, "optimizer": optimizer, "wall_s": time.time() - t0,
                  "map50": r.box.map50, "map": r.box.map}))
