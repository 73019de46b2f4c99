"""The reference for `tests/predict.rs`'s end-to-end prediction: Ultralytics 8.4.190's `predict` of the YOLO26
checkpoint `sluice-model/tests/fixtures/pt/y26t.pt` (tiny, 3 classes, as Ultralytics initialised it) on two
images with `nms=False` (end-to-end: the one-to-one head's top-k rows, no NMS), imgsz 64, conf 0.001:

  img.png          80 x 80: noise from numpy's generator seeded 0, with a brighter rectangle
  img_wide.png     80 x 64, made the same way: letterboxed with padding, and mapped back by `scale_boxes`' per-axis
                   gains of the rounded resize (64 / 80 across, 51 / 64 down)
  predict_e2e.json per image, Ultralytics' boxes in the original image's pixels (x1, y1, x2, y2), scores and
                   classes, in its order (descending score)

Run from the peers' venv: `python make_predict_e2e.py`.
"""

import json
import os

import numpy as np
import ultralytics
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
WEIGHTS = os.path.join(HERE, "..", "..", "..", "..", "sluice-model", "tests", "fixtures", "pt", "y26t.pt")


def main():
    assert ultralytics.__version__ == "8.4.190", ultralytics.__version__
    model = ultralytics.YOLO(WEIGHTS)
    images = []
    for name, (h, w) in (("img.png", (80, 80)), ("img_wide.png", (64, 80))):
        rng = np.random.default_rng(0)
        img = rng.integers(0, 160, size=(h, w, 3), dtype=np.uint8)
        img[20:44, 25:60] = 220
        path = os.path.join(HERE, name)
        Image.fromarray(img).save(path)
        r = model.predict(path, imgsz=64, conf=0.001, nms=False, verbose=False)[0]
        rows = [
            {"bbox": [float(v) for v in b], "score": float(s), "class": int(c)}
            for b, s, c in zip(r.boxes.xyxy.tolist(), r.boxes.conf.tolist(), r.boxes.cls.tolist())
        ]
        images.append({"file": name, "shape": list(r.orig_shape), "rows": rows})
        print(name, len(rows), "rows")
    with open(os.path.join(HERE, "predict_e2e.json"), "w") as f:
        json.dump({"imgsz": 64, "conf": 0.001, "images": images}, f, indent=1)

if __name__ == "__main__":
    main()
