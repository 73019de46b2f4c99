#!/usr/bin/env python3
"""Ultralytics' trainer on Sluice's batches: the cross-feeding experiment of the AdamW parity study (needs the peers'
venv: `bash $PEERS_DIR/setup.sh`; run with its python).

Usage: ul_on_sluice_batches.py DATA_YAML BATCHES_DIR SEED OUT_DIR [OPTIMIZER] [--save-init FILE [--init-only]]
  DATA_YAML    the embedded default's generated set (datasets/synthetic/data.yaml)
  BATCHES_DIR  Sluice's training batches of the whole run, written by
               `sluice data samples --batches BATCHES_DIR --seed SEED --imgsz 192 --batch 16 --epochs 90 --samples 36000`
  SEED         Ultralytics' seed (its initial weights; the batches are Sluice's seed's)
  OUT_DIR      where the run folder goes (OUT_DIR/x<SEED>)
  OPTIMIZER    Ultralytics' optimizer key, `auto` (AdamW at this length) by default
  --save-init  also write Ultralytics' initial weights of this seed (before the first step) as safetensors with
               Ultralytics' key names, which `sluice train --weights FILE` starts from; with --init-only, stop there

Settings are ul_quick_family.py's for yolov8 (configs/quick.yaml with `optimizer: auto`): Ultralytics' yolov8n.yaml at
the scale t = [0.33, 0.125, 1024] (Sluice's configs/models/yolov8-tiny.yaml), imgsz 192, 90 epochs, batch 16,
close_mosaic 10, cache ram, 2 workers, CPU, amp off, 2 torch threads (OMP_NUM_THREADS). The trainer is Ultralytics' DetectionTrainer unchanged except
`preprocess_batch`, which swaps the batch its own loader made for Sluice's batch of the same epoch and index (pixels,
classes, boxes) before Ultralytics' own preprocessing. Ultralytics' loader still runs (its batches are dropped), so
the wall time is not a figure. Validation is Ultralytics' own. Prints one JSON line {seed, map50, map}.
"""
import json
import os
import sys
import tempfile

import numpy as np
import torch
import yaml
from ultralytics import YOLO
from ultralytics.models.yolo.detect import DetectionTrainer
from ultralytics.nn.tasks import yaml_model_load

args = sys.argv[1:]
init_only = "--init-only" in args
save_init = None
if "--save-init" in args:
    i = args.index("--save-init")
    save_init = args[i + 1]
    del args[i : i + 2]
args = [a for a in args if a != "--init-only"]
data, batches_dir, seed, out = args[0], args[1], int(args[2]), args[3]
optimizer = args[4] if len(args) > 4 else "auto"
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
with open(os.path.join(batches_dir, "batches.jsonl")) as f:
    INDEX = {(r["epoch"], r["batch"]): r for r in map(json.loads, f)}


def sluice_batch(epoch, k):
    """Sluice's batch `k` of `epoch`, as Ultralytics' collate_fn lays a batch out."""
    r = INDEX.get((epoch, k))
    if r is None:
        raise SystemExit(f"{batches_dir}: no batch {k} of epoch {epoch}")
    stem = os.path.join(batches_dir, f"e{epoch:04d}_b{k:05d}")
    n, h, w = r["images"], r["height"], r["width"]
    img = np.fromfile(stem + ".u8", dtype=np.uint8).reshape(n, 3, h, w)
    rows = np.fromfile(stem + ".f32", dtype="<f4").reshape(-1, 6)
    return {
        "img": torch.from_numpy(img),
        "batch_idx": torch.from_numpy(rows[:, 0].copy()),
        "cls": torch.from_numpy(rows[:, 1:2].copy()),
        "bboxes": torch.from_numpy(rows[:, 2:6].copy()),
    }


class SluiceBatchesTrainer(DetectionTrainer):
    """Ultralytics' detection trainer, fed Sluice's batches in Sluice's order."""

    _position = (-1, 0)

    def preprocess_batch(self, batch):
        if self.model.training:  # validation calls its own validator's preprocess, never this
            epoch, k = self._position
            k = k + 1 if epoch == self.epoch else 0
            self._position = (self.epoch, k)
            ours = sluice_batch(self.epoch, k)
            if ours["img"].shape[0] != batch["img"].shape[0]:
                raise SystemExit(f"epoch {self.epoch} batch {k}: {ours['img'].shape[0]} images against "
                                 f"Ultralytics' {batch['img'].shape[0]}")
            batch.update(ours)
        return super().preprocess_batch(batch)


d = yaml_model_load("yolov8n.yaml")
d["scales"] = {"t": [0.33, 0.125, 1024]}
d.pop("scale", None)
d.pop("yaml_file", None)
cfg = os.path.join(tempfile.mkdtemp(), "yolov8t.yaml")
with open(cfg, "w") as f:
    yaml.safe_dump(d, f, sort_keys=False)
m = YOLO(cfg)


class InitSaved(Exception):
    """Raised once the initial weights are written under --init-only."""


def write_init(trainer):
    from safetensors.torch import save_file

    sd = {k: v.detach().float().contiguous() for k, v in trainer.model.state_dict().items() if v.is_floating_point()}
    save_file(sd, save_init)
    print(f"initial weights of seed {seed}: {save_init} ({len(sd)} tensors)", file=sys.stderr)
    if init_only:
        raise InitSaved


if save_init:
    m.add_callback("on_pretrain_routine_end", write_init)
try:
    r = m.train(trainer=SluiceBatchesTrainer, data=data, epochs=90, imgsz=192, batch=16, close_mosaic=10, cache="ram",
                seed=seed, workers=2, device="cpu", project=out, name=f"x{seed}", exist_ok=True, plots=False,
                verbose=False, amp=False, optimizer=optimizer)
except InitSaved:
    sys.exit(0)
print(json.dumps({"seed": seed, "map50": r.box.map50, "map": r.box.map}))
