"""Compares the distribution of what Ultralytics' training loader and Sluice's deliver, on the same data and settings.

Usage (from the repository root, with the peers' venv of ../shared/peers/setup.sh, which has Ultralytics 8.4.190):
    cargo build --release -p sluice-cli
    YOLO_OFFLINE=1 $PEERS_VENV/bin/python crates/sluice-loader/scripts/augment_distribution.py \
        [--data datasets/synthetic/data.yaml] [--imgsz 192] [--samples 2000] [--epochs 90] [--close-mosaic 10]

For each phase (mosaic on: epochs from 0; mosaic off: the last `close_mosaic` epochs) it draws `--samples` training
samples from each loader with Ultralytics' default augmentation, and compares, each with its sampling error:
boxes per image, the share of empty images, box width and height (as fractions of the side) at five quantiles,
the share of each class among the boxes, and the per-channel pixel mean and standard deviation. The flip share is
read from Ultralytics' `RandomFlip` calls; Sluice's flips are drawn in its recipes (p = `fliplr`) and leave no
trace in the output, so the script reports Ultralytics' side only. Sluice's side comes from
`sluice data samples` (SLUICE_BIN, default target/release/sluice); both sides' statistics are computed here by the
same code. The sampling errors are bootstrapped over samples (the boxes of one sample share its augmentation). Prints a
Markdown table; `|z| > 3` marks a difference outside the sampling error.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np

# Augmentation settings other than Ultralytics' defaults (`--scale`, `--translate`), given to both loaders.
HYP = {}
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def ultralytics_samples(data, imgsz, n, mosaic, epochs, close_mosaic, seed):
    from ultralytics.cfg import get_cfg
    from ultralytics.data import augment
    from ultralytics.data.build import build_yolo_dataset
    from ultralytics.data.utils import check_det_dataset

    random.seed(seed)
    np.random.seed(seed)
    flips = {"calls": 0, "flipped": 0}
    original = augment.RandomFlip.__call__

    def counting(self, labels):
        if self.direction == "horizontal":
            before = labels["img"].copy()
            out = original(self, labels)
            flips["calls"] += 1
            # An image equal to itself mirrored is rare enough (never on these images) to ignore.
            flips["flipped"] += int(not np.array_equal(before, out["img"]))
            return out
        return original(self, labels)

    augment.RandomFlip.__call__ = counting
    cfg = get_cfg(overrides={"imgsz": imgsz, "batch": 16, "data": data, "cache": "ram", "plots": False,
                             "close_mosaic": close_mosaic, "epochs": epochs, **HYP})
    info = check_det_dataset(data)
    ds = build_yolo_dataset(cfg, info["train"], 16, info, mode="train", rect=False, stride=32)
    if not mosaic:
        ds.close_mosaic(hyp=cfg)
    out = []
    while len(out) < n:
        order = list(range(len(ds)))
        random.shuffle(order)
        for i in order:
            if len(out) == n:
                break
            s = ds[i]
            img = s["img"].numpy().astype(np.float64) / 255.0  # (3, H, W), RGB
            xywh = s["bboxes"].numpy() if len(s["bboxes"]) else np.zeros((0, 4))
            out.append({
                "cls": s["cls"].numpy().reshape(-1).astype(int).tolist(),
                "x": xywh[:, 0].tolist(),
                "y": xywh[:, 1].tolist(),
                "w": xywh[:, 2].tolist(),
                "h": xywh[:, 3].tolist(),
                "mean": img.reshape(3, -1).mean(1).tolist(),
                "sq": (img.reshape(3, -1) ** 2).mean(1).tolist(),
            })
    augment.RandomFlip.__call__ = original
    return out, flips["flipped"] / max(flips["calls"], 1), flips["calls"]


def sluice_samples(data, imgsz, n, mosaic, epochs, close_mosaic, seed):
    bin_ = os.environ.get("SLUICE_BIN", os.path.join(ROOT, "target", "release", "sluice"))
    # As many epochs as the samples need, in the phase asked for: mosaic stays on until the last `close_mosaic`.
    epochs, close = (100_000, close_mosaic) if mosaic else (100_000, 100_000)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "samples.jsonl")
        subprocess.run([bin_, "data", "samples", "--data", data, "--out", path, "--samples", str(n), "--imgsz",
                        str(imgsz), "--epochs", str(epochs), "--close-mosaic", str(close), "--seed", str(seed)]
                       + [a for k, v in HYP.items() for a in (f"--{k}", str(v))], check=True)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    assert all(r["mosaic"] == mosaic for r in rows), "sluice's mosaic phase differs from the one asked for"
    return rows


def statistics(rows, nc, imgsz, reps=200):
    """Each statistic as (value, sampling error).

    The errors come from a bootstrap over samples, not over boxes: the boxes of one sample share its scale,
    translation and source images, so they are not independent draws, and an error computed per box would be too
    small. The same holds for the pixel moments, which are per sample already.
    """
    n = len(rows)
    per_row = np.array([len(r["cls"]) for r in rows])
    w = np.concatenate([r["w"] for r in rows]).astype(float)
    h = np.concatenate([r["h"] for r in rows]).astype(float)
    x = np.concatenate([r["x"] for r in rows]).astype(float)
    y = np.concatenate([r["y"] for r in rows]).astype(float)
    cls = np.concatenate([np.asarray(r["cls"], dtype=int) for r in rows])
    mean = np.array([r["mean"] for r in rows])
    std = np.sqrt(np.maximum(np.array([r["sq"] for r in rows]) - mean ** 2, 0))
    # Boxes cut by the image border (an edge within half a pixel of it): where the clip and the candidate filter act.
    half = 0.5 / imgsz
    edge = ((x - w / 2 < half) | (y - h / 2 < half) | (x + w / 2 > 1 - half) | (y + h / 2 > 1 - half)).astype(float)
    log_area = np.log(w * h)

    def figures(row_weight):
        box_weight = np.repeat(row_weight, per_row)
        nb = box_weight.sum()
        out = {
            "boxes per image": (per_row * row_weight).sum() / row_weight.sum(),
            "empty images (share)": ((per_row == 0) * row_weight).sum() / row_weight.sum(),
            "boxes at the border (share)": (edge * box_weight).sum() / nb,
            "log box area (mean)": (log_area * box_weight).sum() / nb,
        }
        for name, v in (("width", w), ("height", h)):
            rep = np.repeat(v, box_weight)
            for q in (0.1, 0.25, 0.5, 0.75, 0.9):
                out[f"box {name} p{int(q * 100)}"] = float(np.quantile(rep, q))
        counts = np.bincount(cls, weights=box_weight, minlength=nc)
        for c in range(nc):
            out[f"class {c} share of boxes"] = counts[c] / nb
        for i, ch in enumerate("RGB"):
            out[f"pixel mean {ch}"] = (mean[:, i] * row_weight).sum() / row_weight.sum()
            out[f"pixel std {ch}"] = (std[:, i] * row_weight).sum() / row_weight.sum()
        return out

    value = figures(np.ones(n, dtype=np.int64))
    rng = np.random.default_rng(0)
    boot = [figures(rng.multinomial(n, np.full(n, 1.0 / n))) for _ in range(reps)]
    return {k: (v, float(np.std([b[k] for b in boot]))) for k, v in value.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "datasets", "synthetic", "data.yaml"))
    ap.add_argument("--imgsz", type=int, default=192)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=90)
    ap.add_argument("--close-mosaic", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, help="the perspective's scale gain (default: Ultralytics' 0.5)")
    ap.add_argument("--translate", type=float, help="the perspective's translation (default: Ultralytics' 0.1)")
    ap.add_argument("--json", help="also write every figure to this file")
    a = ap.parse_args()
    HYP.update({k: v for k, v in (("scale", a.scale), ("translate", a.translate)) if v is not None})
    import yaml

    with open(a.data) as f:
        nc = len(yaml.safe_load(f)["names"])
    report = {}
    for mosaic in (True, False):
        phase = "mosaic on" if mosaic else "mosaic off"
        ul, flip, flip_calls = ultralytics_samples(a.data, a.imgsz, a.samples, mosaic, a.epochs, a.close_mosaic, a.seed)
        sl = sluice_samples(a.data, a.imgsz, a.samples, mosaic, a.epochs, a.close_mosaic, a.seed)
        su, ss = statistics(ul, nc, a.imgsz), statistics(sl, nc, a.imgsz)
        print(f"\n### {phase}: {a.samples} samples each, imgsz {a.imgsz}\n")
        print(f"Ultralytics' horizontal flip share: {flip:.3f} ± {np.sqrt(flip * (1 - flip) / flip_calls):.3f} "
              f"({flip_calls} calls)\n")
        print("| statistic | Ultralytics | Sluice | difference | z |")
        print("|---|---|---|---|---|")
        rows = []
        for k in su:
            (u, eu), (s, es) = su[k], ss[k]
            se = np.hypot(eu, es)
            z = (s - u) / se if se > 0 else 0.0
            flag = " **outside**" if abs(z) > 3 else ""
            print(f"| {k} | {u:.4f} ± {eu:.4f} | {s:.4f} ± {es:.4f} | {s - u:+.4f} | {z:+.1f}{flag} |")
            rows.append({"statistic": k, "ultralytics": [u, eu], "sluice": [s, es], "z": z})
        report[phase] = {"flip_share_ultralytics": flip, "rows": rows}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
