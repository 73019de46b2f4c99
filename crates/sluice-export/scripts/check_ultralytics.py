#!/usr/bin/env python3
"""Checks a Sluice ONNX export with Ultralytics' own ONNX backend (onnxruntime through `AutoBackend`) against the
PyTorch model it came from. Needs the peers' venv (Ultralytics 8.4.190, torch, onnxruntime; `bash
../shared/peers/setup.sh`) and a built `sluice` binary; not run in CI.

    ~/.cache/sluice-peers/venv/bin/python crates/sluice-export/scripts/check_ultralytics.py \\
        --sluice target/release/sluice --images ../shared/datasets/coco128/images/train2017 [--n 16]

For each model (the tiny float32 fixture of sluice-model's `.pt` tests, and a seeded yolov8n saved by `YOLO.save`
in float16) it writes the `.pt`, runs `sluice export --weights M.pt --imgsz 320` (fixed) and `--dynamic`, then:
  1. raw output: onnxruntime on N letterboxed images against the PyTorch eval forward (max |diff| / max(1, |y|));
  2. `YOLO("M.onnx").predict(...)` against `YOLO("M.pt").predict(...)` at conf 1e-5 (rect=False, max_det 10000 for both, so no near-tie is cut at the 300th box): the share of PyTorch boxes
     that the ONNX run finds with the same class and IoU > 0.99, and the largest confidence difference;
  3. the metadata Ultralytics read back (names, stride, imgsz, task);
  4. the `--half` export (float16 input and output) in onnxruntime against the float32 PyTorch forward (printed).
Exits 1 when a raw difference exceeds 1e-4 or fewer than 99% of the boxes match.
"""

import argparse
import copy
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
# The untrained models' class scores sit near the head's bias prior (about 1e-4 for 80 classes).
CONF = 1e-5
FIXTURE = os.path.join(HERE, "..", "..", "sluice-model", "tests", "fixtures", "pt", "v8t_float.pt")


def letterbox(path, imgsz):
    from ultralytics.data.augment import LetterBox
    import cv2

    im = cv2.imread(path)
    im = LetterBox((imgsz, imgsz), auto=False)(image=im)
    return np.ascontiguousarray(im[..., ::-1].transpose(2, 0, 1)).astype(np.float32) / 255.0


def box_iou(a, b):
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(2)
    area = lambda x: (x[:, 2] - x[:, 0]) * (x[:, 3] - x[:, 1])
    return inter / (area(a)[:, None] + area(b)[None, :] - inter + 1e-9)


def check(pt, sluice, images, imgsz, tmp):
    import onnxruntime as ort
    from ultralytics import YOLO

    ok = True
    model = YOLO(pt).model.float().eval()
    for dynamic in (False, True):
        onnx = os.path.join(tmp, os.path.basename(pt).replace(".pt", "_dyn.onnx" if dynamic else ".onnx"))
        cmd = [sluice, "export", "--weights", pt, "--imgsz", str(imgsz), "--output", onnx] + (["--dynamic"] if dynamic else [])
        subprocess.run(cmd, check=True)
        sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
        worst = 0.0
        batch = 4 if dynamic else 1
        for i in range(0, len(images), batch):
            x = np.stack([letterbox(p, imgsz) for p in images[i : i + batch]])
            if len(x) != batch:
                continue
            with torch.no_grad():
                y = model(torch.from_numpy(x))
            y = (y[0] if isinstance(y, (list, tuple)) else y).numpy()
            z = sess.run(["output0"], {"images": x})[0]
            worst = max(worst, float((np.abs(y - z) / np.maximum(1.0, np.abs(y))).max()))
        print(f"{os.path.basename(onnx)}: raw output vs PyTorch on {len(images)} images (batch {batch}): "
              f"worst relative difference {worst:.2e}")
        ok &= worst < 1e-4

        m_pt, m_onnx = YOLO(pt), YOLO(onnx, task="detect")
        found = total = 0
        conf_diff = 0.0
        for p in images:
            # rect=False: the same square letterbox for both (predict() pads the .pt input only to a multiple of 32).
            a = m_pt.predict(p, imgsz=imgsz, conf=CONF, rect=False, max_det=10000, verbose=False)[0].boxes
            b = m_onnx.predict(p, imgsz=imgsz, conf=CONF, rect=False, max_det=10000, verbose=False)[0].boxes
            if len(a) == 0:
                continue
            iou = box_iou(a.xyxy.numpy(), b.xyxy.numpy()) if len(b) else np.zeros((len(a), 0))
            for j in range(len(a)):
                total += 1
                cand = np.where((iou[j] > 0.99) & (b.cls.numpy() == a.cls.numpy()[j]))[0] if iou.shape[1] else []
                if len(cand):
                    found += 1
                    conf_diff = max(conf_diff, float(np.abs(b.conf.numpy()[cand] - a.conf.numpy()[j]).min()))
        share = found / max(total, 1)
        meta = m_onnx.predictor.model.metadata if m_onnx.predictor else {}
        print(f"{os.path.basename(onnx)}: YOLO(onnx).predict vs YOLO(pt).predict at conf {CONF}: {found}/{total} "
              f"boxes matched ({100 * share:.2f}%), largest confidence difference {conf_diff:.2e}; metadata read "
              f"back: names {len(meta.get('names', {}))}, stride {meta.get('stride')}, imgsz {meta.get('imgsz')}, "
              f"task {meta.get('task')}")
        ok &= share >= 0.99

    # --half: float16 weights, input and output, run by onnxruntime against the float32 PyTorch forward.
    onnx = os.path.join(tmp, os.path.basename(pt).replace(".pt", "_half.onnx"))
    subprocess.run([sluice, "export", "--weights", pt, "--imgsz", str(imgsz), "--half", "--output", onnx], check=True)
    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    worst = 0.0
    for p in images:
        x = letterbox(p, imgsz)[None]
        with torch.no_grad():
            y = model(torch.from_numpy(x))
        y = (y[0] if isinstance(y, (list, tuple)) else y).numpy()
        z = sess.run(["output0"], {"images": x.astype(np.float16)})[0].astype(np.float32)
        worst = max(worst, float((np.abs(y - z) / np.maximum(1.0, np.abs(y))).max()))
    print(f"{os.path.basename(onnx)}: float16 raw output vs PyTorch float32 on {len(images)} images: worst relative "
          f"difference {worst:.2e}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", required=True, help="the sluice binary")
    ap.add_argument("--images", required=True, help="a folder of JPEG images")
    ap.add_argument("--n", type=int, default=16, help="how many images")
    ap.add_argument("--imgsz", type=int, default=320)
    args = ap.parse_args()
    images = sorted(glob.glob(os.path.join(args.images, "*.jpg")))[: args.n]
    if not images:
        sys.exit(f"{args.images}: no .jpg images")
    from ultralytics import YOLO

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tiny = os.path.join(tmp, "v8t_float.pt")
        subprocess.run(["cp", FIXTURE, tiny], check=True)
        torch.manual_seed(0)
        n = YOLO("yolov8n.yaml")
        n.model.eval()
        yolov8n = os.path.join(tmp, "yolov8n_seed0.pt")
        n.save(yolov8n)
        for pt in (tiny, yolov8n):
            ok &= check(pt, args.sluice, images, args.imgsz, tmp)
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
