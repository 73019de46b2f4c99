"""Ultralytics 8.4.190's mosaic draws over a run, in the form of `sluice data draws` (benches/mosaic_diversity.py).

Builds the training dataset and loader as `DetectionTrainer` does (`build_yolo_dataset`, `build_dataloader`: 2
workers, cache ram, shuffle) after `init_seeds(SEED)`, iterates EPOCHS epochs with mosaic on, and records in each
worker, for every mosaic, the sample, the three partners `Mosaic.get_indexes` drew and the time. A sample is the
primary of exactly one mosaic per epoch, so its records in time order are its epochs. The trainer also builds the
model before its loader, which moves the workers' seeds; the draws' statistics do not depend on the seed's value.

Usage (from the repository root, in the peers' venv):
    ~/.cache/sluice-peers/venv/bin/python benches/ul_mosaic_draws.py DATA_YAML SEED EPOCHS OUT.jsonl [IMGSZ]
"""

import json
import os
import sys
import tempfile
import time

from ultralytics.cfg import get_cfg
from ultralytics.data import build_dataloader, build_yolo_dataset
from ultralytics.data.augment import Mosaic
from ultralytics.data.utils import check_det_dataset
from ultralytics.utils.torch_utils import init_seeds

data_yaml, seed, epochs, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
imgsz = int(sys.argv[5]) if len(sys.argv) > 5 else 192
record_dir = tempfile.mkdtemp(prefix="ul_mosaic_draws_")

original = Mosaic.get_params


def get_params(self, labels):
    got = []
    draw = self.get_indexes

    def recorded():
        indexes = draw()
        got.append(list(indexes))
        return indexes

    self.get_indexes = recorded
    try:
        params = original(self, labels)
    finally:
        del self.get_indexes
    index = self.dataset.im_files.index(labels["im_file"])
    with open(os.path.join(record_dir, f"{os.getpid()}.jsonl"), "a") as f:
        f.write(json.dumps({"t": time.monotonic_ns(), "id": index, "partners": got[0]}) + "\n")
    return params


Mosaic.get_params = get_params

cfg = get_cfg(overrides=dict(data=data_yaml, imgsz=imgsz, batch=16, workers=2, seed=seed, cache="ram", epochs=epochs,
                             close_mosaic=0, deterministic=True))
init_seeds(seed, deterministic=True)
data = check_det_dataset(data_yaml)
dataset = build_yolo_dataset(cfg, data["train"], 16, data, mode="train", stride=32)
loader = build_dataloader(dataset, 16, 2, shuffle=True, rank=-1, device="cpu")
for _ in range(epochs):
    for _ in loader:  # one epoch, as the trainer's loop reads it
        pass
time.sleep(1.0)  # let the workers' last writes land

records = []
for name in os.listdir(record_dir):
    with open(os.path.join(record_dir, name)) as f:
        records += [json.loads(line) for line in f]
by_id = {}
for r in sorted(records, key=lambda r: r["t"]):
    by_id.setdefault(r["id"], []).append(r["partners"])
with open(out, "w") as f:
    for i, draws in sorted(by_id.items()):
        for epoch, partners in enumerate(draws[:epochs]):
            f.write(json.dumps({"epoch": epoch, "id": i, "mosaic": [i] + partners}) + "\n")
print(f"{len(dataset)} images, {epochs} epochs: wrote {out}", file=sys.stderr)
