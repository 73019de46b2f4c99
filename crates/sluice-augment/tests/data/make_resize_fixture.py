"""The fixture of `tests/letterbox_parity.rs`'s `resize_matches_cv2_bit_for_bit`: `cv2.resize(INTER_LINEAR)` of a
64 x 80 noise image to 51 x 64 (the scale Ultralytics' `LetterBox` takes for it at imgsz 64), where the weights are
not multiples of 2^4 and cv2's own rounding shows.

  resize_src_64x80.png   the source: uniform noise from numpy's generator seeded 0
  resize_cv2_51x64.png   cv2.resize(src, (51, 64), interpolation=cv2.INTER_LINEAR), RGB

Run from the peers' venv (opencv-python as Ultralytics 8.4.190 installs it): `python make_resize_fixture.py`.
"""

import os

import cv2
import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, size=(80, 64, 3), dtype=np.uint8)
    Image.fromarray(src).save(os.path.join(HERE, "resize_src_64x80.png"))
    out = cv2.resize(src, (51, 64), interpolation=cv2.INTER_LINEAR)
    Image.fromarray(out).save(os.path.join(HERE, "resize_cv2_51x64.png"))
    print("cv2", cv2.__version__)


if __name__ == "__main__":
    main()
