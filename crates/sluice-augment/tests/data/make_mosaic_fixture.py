"""Ultralytics 8.4.190's mosaic + random perspective labels for scripted parameters: the fixture of
tests/mosaic_parity.rs.

Usage (the peers' venv of ../shared/peers/setup.sh; from the repository root):
    YOLO_OFFLINE=1 $PEERS_VENV/bin/python crates/sluice-augment/tests/data/make_mosaic_fixture.py

Each case draws four source images (random sizes, 0-8 random boxes each, some touching their image's border), a
mosaic centre, a scale and a translation, then runs Ultralytics' own `Mosaic` and `RandomPerspective` (imgsz 64, no
rotation, shear or perspective, as its defaults) on them with `random` scripted to return exactly those draws, and
records the output boxes (xyxy pixels of the 64 x 64 output) with their classes. Writes mosaic_fixture.json beside
this script.
"""
import json
import math
import os
import random as pyrandom

import numpy as np
from ultralytics.data import augment
from ultralytics.utils.instance import Instances

IMGSZ = 64
CASES = 300


class Scripted:
    """Stands in for the `random` module inside ultralytics.data.augment: returns the queued draws in call order."""

    def __init__(self, values):
        self.values = list(values)

    def _next(self):
        return self.values.pop(0)

    def uniform(self, a, b):
        return self._next()

    def randint(self, a, b):
        return self._next()

    def random(self):
        return self._next()


class Stub:
    """The dataset interface Mosaic reads: four fixed images and their labels."""

    cache = "ram"
    buffer = []

    def __init__(self, images):
        self.images = images

    def __len__(self):
        return len(self.images)

    def get_image_and_label(self, i):
        im = self.images[i]
        h0, w0 = im["h"], im["w"]
        r = IMGSZ / max(h0, w0)
        w, h = (min(math.ceil(w0 * r), IMGSZ), min(math.ceil(h0 * r), IMGSZ)) if r != 1 else (w0, h0)
        boxes = np.array([b[1:] for b in im["labels"]], dtype=np.float32).reshape(-1, 4)
        cls = np.array([[b[0]] for b in im["labels"]], dtype=np.float32).reshape(-1, 1)
        return {
            "img": np.zeros((h, w, 3), np.uint8),
            "im_file": f"image{i}.jpg",
            "ori_shape": (h0, w0),
            "resized_shape": (h, w),
            "cls": cls,
            "instances": Instances(boxes, np.zeros((0, 1000, 2), np.float32), None, bbox_format="xywh",
                                   normalized=True),
        }


def random_image(rng):
    w, h = rng.randint(20, 300), rng.randint(20, 300)
    labels = []
    for _ in range(rng.randint(0, 8)):
        bw, bh = rng.uniform(0.02, 0.9), rng.uniform(0.02, 0.9)
        # Some boxes run to the image's edge, as objects cut by the frame do.
        cx = rng.choice([bw / 2, 1 - bw / 2, rng.uniform(bw / 2, 1 - bw / 2)])
        cy = rng.choice([bh / 2, 1 - bh / 2, rng.uniform(bh / 2, 1 - bh / 2)])
        labels.append([rng.randint(0, 5), *(round(v, 6) for v in (cx, cy, bw, bh))])
    return {"w": w, "h": h, "labels": labels}


def main():
    rng = pyrandom.Random(7)
    cases = []
    for k in range(CASES):
        images = [random_image(rng) for _ in range(4)]
        yc, xc = rng.uniform(IMGSZ / 2, 1.5 * IMGSZ), rng.uniform(IMGSZ / 2, 1.5 * IMGSZ)
        scale = round(rng.uniform(0.5, 1.5), 6) if k % 4 else rng.choice([0.5, 1.5])
        tx, ty = round(rng.uniform(0.4, 0.6), 6), round(rng.uniform(0.4, 0.6), 6)
        ds = Stub(images)
        mosaic = augment.Mosaic(ds, imgsz=IMGSZ, p=1.0)
        persp = augment.RandomPerspective(degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0,
                                          size=(IMGSZ, IMGSZ))
        # Call order: the mix-transform's p check, three partner indexes, the centre (y, then x), then the
        # perspective's draws: P[2,0], P[2,1], angle, scale, shear x, shear y, translate x, translate y.
        draws = [0.0, 1, 2, 3, yc, xc, 0.0, 0.0, 0.0, scale, 0.0, 0.0, tx, ty]
        script = Scripted(draws)
        saved = augment.random
        augment.random = script
        try:
            labels = ds.get_image_and_label(0)
            labels = persp(mosaic(labels))
        finally:
            augment.random = saved
        assert not script.values, f"case {k}: {len(script.values)} draws unused"
        inst = labels["instances"]
        inst.convert_bbox("xyxy")
        out = [[int(c[0]), *(round(float(v), 5) for v in b)] for c, b in zip(labels["cls"], inst.bboxes)]
        cases.append({"images": images, "centre": [int(xc), int(yc)], "scale": scale, "translate": [tx, ty],
                      "out": out})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mosaic_fixture.json")
    with open(path, "w") as f:
        json.dump({"imgsz": IMGSZ, "ultralytics": "8.4.190", "cases": cases}, f)
    print(f"wrote {path}: {len(cases)} cases, {sum(len(c['out']) for c in cases)} boxes")


if __name__ == "__main__":
    main()
