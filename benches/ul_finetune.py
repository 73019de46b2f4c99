#!/usr/bin/env python3
"""Ultralytics 8.4.190's fine-tuning from a checkpoint, the peer half of benches/finetune_vs_ultralytics.sh (run with
the peers' venv python):

    python benches/ul_finetune.py WEIGHTS_PT DATA_YAML SEED OUT_DIR [EPOCHS] [IMGSZ]

`YOLO(WEIGHTS_PT).train(...)` with the settings the Sluice side gets on its command line: EPOCHS (30) at IMGSZ
(192), batch 16, cache ram, 2 workers, CPU, amp off, the optimizer the OPTIMIZER environment variable names (default
auto), Ultralytics' defaults otherwise (close_mosaic 10). The trainer builds the checkpoint's model for the data's
class count and takes every tensor whose name and shape fit ("Transferred 349/355 items"). Prints one JSON line {seed, wall_s, map50, map}; results.csv lands in
OUT_DIR/ft-s<SEED>.
"""
import json
import os
import sys
import time

import torch
from ultralytics import YOLO

weights, data, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 30
imgsz = int(sys.argv[6]) if len(sys.argv) > 6 else 192
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
m = YOLO(weights)
t0 = time.time()
r = m.train(data=data, epochs=epochs, imgsz=imgsz, batch=16, cache="ram", seed=seed, workers=2, device="cpu",
            project=out, name=f"ft-s{seed}", exist_ok=True, plots=False, verbose=False, amp=False,
            optimizer=os.environ.get("OPTIMIZER", "auto"))
print(json.dumps({"seed": seed, "wall_s": time.time() - t0, "map50": r.box.map50, "map": r.box.map}))
