"""Ultralytics 8.4.190's mosaic + random perspective pixels for scripted parameters: the fixture of
tests/mosaic_pixels.rs.

Usage (the peers' venv of ../shared/peers/setup.sh; from the repository root):
    YOLO_OFFLINE=1 $PEERS_VENV/bin/python crates/sluice-augment/tests/data/make_mosaic_pixels_fixture.py \
        crates/sluice-augment/tests/data/mosaic_pixels 48 10

Each case makes four source images at the training size (long side imgsz; smooth colour waves with three sharp
rectangles), a mosaic centre, a scale and a translation, then runs Ultralytics' own `Mosaic` and
`RandomPerspective` (no rotation, shear or perspective, as its defaults) on them with `random` scripted to return
exactly those draws (the call order of make_mosaic_fixture.py), and writes OUT.bin (the source images and each
output, HWC u8, back to back) and OUT.json (sizes, offsets and parameters).
"""
import json
import sys
import random as pyrandom
import numpy as np
from ultralytics.data import augment
from ultralytics.utils.instance import Instances

from make_mosaic_fixture import Scripted  # beside this script: Ultralytics' `random`, scripted

IMGSZ = int(sys.argv[2]) if len(sys.argv) > 2 else 48
CASES = int(sys.argv[3]) if len(sys.argv) > 3 else 10
OUT = sys.argv[1]

class Stub:
    """The dataset interface Mosaic reads: four fixed images at the training size (one placeholder box)."""

    cache = "ram"; buffer = []
    def __init__(self, images): self.images = images
    def __len__(self): return len(self.images)
    def get_image_and_label(self, i):
        im = self.images[i]
        h, w = im.shape[:2]
        return {"img": im.copy(), "im_file": f"image{i}.jpg", "ori_shape": (h, w), "resized_shape": (h, w),
                "cls": np.zeros((1, 1), np.float32),
                "instances": Instances(np.array([[0.5, 0.5, 0.5, 0.5]], np.float32), np.zeros((0, 1000, 2), np.float32), None, bbox_format="xywh", normalized=True)}

def random_image(rng, nrng):
    long = IMGSZ
    short = rng.randint(IMGSZ // 3, IMGSZ)
    w, h = (long, short) if rng.random() < 0.5 else (short, long)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        fx, fy, ph = nrng.uniform(0.05, 0.6), nrng.uniform(0.05, 0.6), nrng.uniform(0, 6.3)
        img[..., c] = 128 + 100 * np.sin(fx * xx + fy * yy + ph)
    for _ in range(3):
        x0, y0 = nrng.integers(0, w - 4), nrng.integers(0, h - 4)
        img[y0:y0 + nrng.integers(3, 12), x0:x0 + nrng.integers(3, 12)] = nrng.integers(0, 256, 3)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)

rng = pyrandom.Random(11); nrng = np.random.default_rng(11)
cases = []; blob = bytearray()
for k in range(CASES):
    images = [random_image(rng, nrng) for _ in range(4)]
    yc, xc = rng.uniform(IMGSZ / 2, 1.5 * IMGSZ), rng.uniform(IMGSZ / 2, 1.5 * IMGSZ)
    scale = round(rng.uniform(0.5, 1.5), 6)
    tx, ty = round(rng.uniform(0.4, 0.6), 6), round(rng.uniform(0.4, 0.6), 6)
    ds = Stub(images)
    mosaic = augment.Mosaic(ds, imgsz=IMGSZ, p=1.0)
    persp = augment.RandomPerspective(degrees=0.0, translate=0.1, scale=0.5, shear=0.0, perspective=0.0, size=(IMGSZ, IMGSZ))
    script = Scripted([0.0, 1, 2, 3, yc, xc, 0.0, 0.0, 0.0, scale, 0.0, 0.0, tx, ty])
    saved = augment.random; augment.random = script
    try:
        out = persp(mosaic(ds.get_image_and_label(0)))["img"]
    finally:
        augment.random = saved
    assert not script.values
    entry = {"images": [], "centre": [int(xc), int(yc)], "scale": scale, "translate": [tx, ty]}
    for im in images:
        entry["images"].append({"w": im.shape[1], "h": im.shape[0], "offset": len(blob)}); blob += im.tobytes()
    assert out.shape == (IMGSZ, IMGSZ, 3), out.shape
    entry["out_offset"] = len(blob); blob += np.ascontiguousarray(out).tobytes()
    cases.append(entry)
open(OUT + ".bin", "wb").write(bytes(blob))
json.dump({"imgsz": IMGSZ, "ultralytics": "8.4.190", "cases": cases}, open(OUT + ".json", "w"))
print(len(cases), len(blob))
