#!/usr/bin/env python3
"""Convert YOLOv8 weights between Ultralytics/PyTorch `.pt` and Sluice's `.safetensors` (both directions).

Sluice's safetensors files hold exactly Ultralytics' `DetectionModel.state_dict()`: the same key names
(`model.0.conv.weight`, ..., `model.22.dfl.conv.weight`), float tensors as float32, `num_batches_tracked` as int64
scalars. So the conversion is only a change of container:

  pt -> safetensors   python convert_weights.py to-safetensors yolov8n.pt yolov8n.safetensors
                      Accepts an Ultralytics checkpoint (a dict with 'ema' or 'model' holding the nn.Module; needs
                      `pip install ultralytics` to unpickle it) or a plain state_dict saved with torch.save.
  safetensors -> pt   python convert_weights.py to-pt yolov8n.safetensors yolov8n_sd.pt
                      Writes the plain state_dict (torch.save); with --cfg yolov8n.yaml --nc 80 it instead builds
                      `DetectionModel(cfg, nc)`, loads the state_dict strictly and writes an Ultralytics checkpoint
                      that `YOLO("yolov8n_sd.pt")` opens.
  check               python convert_weights.py check a.safetensors b.safetensors
                      Exits 1 unless both files hold the same keys, shapes, dtypes and bit-identical values.

Requirements: torch and safetensors (`pip install torch safetensors`), plus ultralytics for Ultralytics
checkpoints and --cfg. The Rust side of the round trip (load -> save gives back the same tensors, and the file has
the same key set as Ultralytics' state_dict) is tested without Python in `tests/weights.rs`.
"""

import argparse
import sys


def _state_dict_from_pt(path):
    import torch

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(ckpt, dict) and any(k in ckpt for k in ("ema", "model")):
        module = ckpt.get("ema") or ckpt.get("model")
        sd = module.state_dict() if hasattr(module, "state_dict") else module
    elif hasattr(ckpt, "state_dict"):
        sd = ckpt.state_dict()
    else:
        sd = ckpt
    if not isinstance(sd, dict):
        sys.exit(f"{path}: no state_dict found (got {type(sd).__name__})")
    return sd


def to_safetensors(src, dst):
    from safetensors.torch import save_file

    sd = _state_dict_from_pt(src)
    out = {k: (v.float() if v.is_floating_point() else v).contiguous().clone() for k, v in sd.items()}
    save_file(out, dst, metadata={"source": f"converted from {src}"})
    print(f"{dst}: {len(out)} tensors")


def to_pt(src, dst, cfg=None, nc=None):
    import torch
    from safetensors.torch import load_file

    sd = load_file(src)
    if cfg is None:
        torch.save(sd, dst)
        print(f"{dst}: state_dict with {len(sd)} tensors")
        return
    import ultralytics
    from ultralytics.nn.tasks import DetectionModel

    model = DetectionModel(cfg, nc=nc, verbose=False)
    model.load_state_dict(sd, strict=True)
    ckpt = {"model": model, "ema": None, "updates": None, "optimizer": None, "epoch": -1,
            "train_args": {"model": cfg, "nc": nc}, "version": ultralytics.__version__}
    torch.save(ckpt, dst)
    print(f"{dst}: Ultralytics checkpoint of {cfg} (nc {nc}), {len(sd)} tensors")


def check(a, b):
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    bad = sorted(set(x) ^ set(y))
    for k in sorted(set(x) & set(y)):
        if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not bool((x[k] == y[k]).all()):
            bad.append(k)
    if bad:
        print(f"{len(bad)} keys differ, e.g. {bad[:5]}")
        sys.exit(1)
    print(f"identical: {len(x)} tensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("to-safetensors")
    p.add_argument("src")
    p.add_argument("dst")
    p = sub.add_parser("to-pt")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--cfg", help="Ultralytics model yaml, e.g. yolov8n.yaml (writes a full checkpoint)")
    p.add_argument("--nc", type=int, default=80)
    p = sub.add_parser("check")
    p.add_argument("a")
    p.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "to-safetensors":
        to_safetensors(args.src, args.dst)
    elif args.cmd == "to-pt":
        to_pt(args.src, args.dst, args.cfg, args.nc)
    else:
        check(args.a, args.b)


if __name__ == "__main__":
    main()
