"""Regenerates the decode conformance fixtures in this folder from four coco128 images.

Run from this folder with Pillow and opencv-python-headless installed:
    python make_fixtures.py [COCO128_TRAIN_IMAGES_DIR]
The folder defaults to $SLUICE_COCO128/images/train2017, where SLUICE_COCO128 defaults to $SLUICE_DATASETS/coco128,
SLUICE_DATASETS to $SLUICE_SHARED/datasets and SLUICE_SHARED to ../shared beside the repository (the same rule as
sluice_testkit::locations).
References are what Pillow (libjpeg-turbo inside) and OpenCV (as Ultralytics' load_image) produce.
"""
import os
import shutil
import sys

import cv2
import numpy as np
from PIL import Image, ImageOps

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
SHARED = os.environ.get("SLUICE_SHARED") or os.path.join(REPO, "..", "shared")
DATASETS = os.environ.get("SLUICE_DATASETS") or os.path.join(SHARED, "datasets")
COCO128 = os.environ.get("SLUICE_COCO128") or os.path.join(DATASETS, "coco128")
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(COCO128, "images", "train2017")
ids = ["000000000536", "000000000643", "000000000562", "000000000472"]
for i in ids:
    shutil.copyfile(f"{src}/{i}.jpg", f"coco_{i[-3:]}.jpg")

# Full-decode references (RGB) for two of the real JPEGs.
for i in ["536", "643"]:
    Image.open(f"coco_{i}.jpg").convert("RGB").save(f"coco_{i}_ref.png", optimize=True)

base = Image.open("coco_643.jpg").convert("RGB")
crop = base.crop((100, 80, 260, 200))  # 160 x 120

# Grayscale, CMYK and progressive JPEGs; references are Pillow's RGB conversions of what it decodes.
crop.convert("L").save("gray.jpg", quality=90)
Image.open("gray.jpg").convert("RGB").save("gray_ref.png")
crop.convert("CMYK").save("cmyk.jpg", quality=90)
Image.open("cmyk.jpg").convert("RGB").save("cmyk_ref.png")
crop.save("progressive.jpg", quality=90, progressive=True)
Image.open("progressive.jpg").convert("RGB").save("progressive_ref.png")

# EXIF orientation 6 (rotate 90 clockwise to display): the stored pixels are the crop rotated back.
stored = crop.transpose(Image.Transpose.ROTATE_90)  # 120 x 160 stored
exif = Image.Exif()
exif[0x0112] = 6
stored.save("exif_orient6.jpg", quality=90, exif=exif.tobytes())
ImageOps.exif_transpose(Image.open("exif_orient6.jpg")).convert("RGB").save("exif_orient6_ref.png")

# PNG with alpha (a gradient mask); decoders drop alpha like cv2.imread(IMREAD_COLOR) and PIL convert("RGB").
rgba = crop.copy()
rgba.putalpha(Image.linear_gradient("L").resize(crop.size))
rgba.save("rgba.png")
crop.save("rgb.png")
# Lossless formats carrying the same pixels as rgb.png.
crop.save("rgb.bmp")
crop.save("rgb.webp", lossless=True)

# Resize references: OpenCV as Ultralytics' load_image calls it (long side to imgsz, ceil, INTER_AREA when
# shrinking, INTER_LINEAR when enlarging or when augmenting).
a = np.asarray(crop)
cv2.imwrite("resize_area_64.png", cv2.cvtColor(cv2.resize(a, (64, 48), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2BGR))
cv2.imwrite("resize_area_80.png", cv2.cvtColor(cv2.resize(a, (80, 60), interpolation=cv2.INTER_AREA), cv2.COLOR_RGB2BGR))
cv2.imwrite("resize_linear_64.png", cv2.cvtColor(cv2.resize(a, (64, 48), interpolation=cv2.INTER_LINEAR), cv2.COLOR_RGB2BGR))
cv2.imwrite("resize_linear_200.png", cv2.cvtColor(cv2.resize(a, (200, 150), interpolation=cv2.INTER_LINEAR), cv2.COLOR_RGB2BGR))

# DCT-scaled decode references at 1/2, 1/4 and 1/8 (libjpeg's scaled IDCT through Pillow's draft mode).
for name, d in [("half", 2), ("quarter", 4), ("eighth", 8)]:
    scaled = Image.open("coco_643.jpg")
    scaled.draft("RGB", (scaled.width // d, scaled.height // d))
    scaled.convert("RGB").save(f"coco_643_{name}_ref.png", optimize=True)

# 1/4-scale references of the grayscale, progressive and EXIF-rotated crops (40 x 30 once upright).
for name in ["gray", "progressive", "exif_orient6"]:
    scaled = Image.open(f"{name}.jpg")
    scaled.draft(scaled.mode, (scaled.width // 4, scaled.height // 4))
    ImageOps.exif_transpose(scaled).convert("RGB").save(f"{name}_quarter_ref.png")
