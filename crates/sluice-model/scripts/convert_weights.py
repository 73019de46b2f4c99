#!/usr/bin/env python3
"""Convert YOLOv8, YOLO11 and YOLO26 weights between Ultralytics/PyTorch `.pt` and Sluice's `.safetensors` (both directions).

Sluice's safetensors files hold exactly Ultralytics' `DetectionModel.state_dict()`: the same key names
(`model.0.conv.weight`, ..., `model.22.dfl.conv.weight`), float tensors as float32, `num_batches_tracked` as int64
scalars. So the conversion is only a change of container:

  pt -> safetensors   python convert_weights.py to-safetensors yolov8n.pt yolov8n.safetensors
                      Accepts an Ultralytics checkpoint (a dict with 'ema' or 'model' holding the nn.Module, as
                      `YOLO.save` and the trainer write it; needs ultralytics to unpickle it) or a plain state_dict
                      saved with torch.save. Ultralytics stores its checkpoints in float16: the file gets those
                      values exactly, as float32. A fused model (`model.fuse()`, Conv+BN folded) is refused: Sluice
                      reads unfused weights only.
  safetensors -> pt   python convert_weights.py to-pt yolov8n.safetensors yolov8n.pt --cfg yolov8n
                      With --cfg (yolov8n ... yolov8x, an Ultralytics model YAML, or a Sluice model YAML of
                      multipliers such as configs/models/yolov8-tiny.yaml) it builds `DetectionModel(cfg, nc)`, loads
                      the state_dict strictly and writes an Ultralytics checkpoint that `YOLO("yolov8n.pt")` opens;
                      without --cfg a plain state_dict (torch.save). nc is read from the weights unless --nc is given.
                      The tensors stay float32 (bit-identical) unless --half (float16, as Ultralytics saves).
                      A Sluice training checkpoint (`runs/<name>/weights/last.safetensors` or `best.safetensors`:
                      `model.<key>`, `ema.<key>`, `optim.*`) is read under --prefix, by default `ema.` (the weights
                      `sluice val` and `sluice predict` use); `--prefix model.` exports the raw trained model.
  check               python convert_weights.py check a.safetensors b.pt [--prefix-a ema.] [--float32]
                      Exits 1 unless both files (.safetensors or .pt, any of the above) hold the same keys, shapes,
                      dtypes and bit-identical values; with --float32, float tensors are compared after the exact
                      float16 -> float32 upcast (an Ultralytics float16 checkpoint against its conversion).

Requirements: torch and safetensors (`pip install torch safetensors`), plus ultralytics for Ultralytics
checkpoints and --cfg. `roundtrip_check.py` beside this script runs the whole round trip against Ultralytics and
`sluice model run`; the Rust side (load -> save gives back the same tensors, Ultralytics' key set) is tested
without Python in `tests/weights.rs`.
"""

import argparse
import os
import sys

# Sluice training checkpoints carry this `format` metadata (sluice-optim/src/checkpoint.rs).
SLUICE_CHECKPOINT_FORMAT = "sluice-train-checkpoint/1"
# The bias of the first class-branch output conv: its length is the class count.
NC_KEY = "model.22.cv3.0.2.bias"
NC_KEY_V11 = "model.23.cv3.0.2.bias"  # YOLO11's Detect head is layer 23


def _load_pt(path):
    """torch.load of an Ultralytics checkpoint or a plain state_dict. Uses Ultralytics' loader when it is
    installed: it maps the module paths of older Ultralytics versions (ultralytics.yolo.*) to the current ones."""
    if not os.path.isfile(path):
        sys.exit(f"{path}: no such file")
    try:
        from ultralytics.nn.tasks import torch_safe_load
    except ImportError:
        torch_safe_load = None
    if torch_safe_load is None or not path.endswith(".pt"):  # it accepts the .pt suffix only
        import torch

        return torch.load(path, map_location="cpu", weights_only=False)
    return torch_safe_load(path)[0]


def _state_dict_from_pt(path):
    ckpt = _load_pt(path)
    if isinstance(ckpt, dict) and any(k in ckpt for k in ("ema", "model")):
        # The trainer writes 'ema' (and 'model': None); YOLO.save writes 'model' (and 'ema': None).
        module = ckpt.get("ema") or ckpt.get("model")
        sd = module.state_dict() if hasattr(module, "state_dict") else module
    elif hasattr(ckpt, "state_dict"):
        sd = ckpt.state_dict()
    else:
        sd = ckpt
    if not isinstance(sd, dict) or not sd:
        sys.exit(f"{path}: no state_dict found (got {type(sd).__name__})")
    return dict(sd)


def _is_fused(sd):
    """Conv+BN folded by Ultralytics' fuse(): Conv modules have `conv.bias` and no `bn.*`."""
    return any(k.endswith(".conv.bias") and not k.startswith("model.22.dfl") for k in sd) and not any(
        ".bn." in k for k in sd
    )


def _read_safetensors(path, prefix=None):
    """The tensors of a safetensors file; for a Sluice training checkpoint only those under `prefix` (default
    `ema.`), with the prefix stripped. Returns (state_dict, prefix used or None)."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        names = list(f.keys())
        if prefix is None and meta.get("format") == SLUICE_CHECKPOINT_FORMAT:
            prefix = "ema."
            print(f"{path}: a Sluice training checkpoint; exporting its EMA weights (--prefix ema.)", file=sys.stderr)
        if prefix:
            names = [n for n in names if n.startswith(prefix)]
            if not names:
                sys.exit(f"{path}: no tensor under the prefix `{prefix}`")
        sd = {n[len(prefix or "") :]: f.get_tensor(n) for n in names}
    return sd, prefix


def _nc_of(sd, path):
    for key in (NC_KEY, NC_KEY_V11):
        if key in sd:
            return int(sd[key].shape[0])
    sys.exit(f"{path}: no `{NC_KEY}` or `{NC_KEY_V11}`, so the class count is unknown; is it a YOLOv8 or YOLO11 "
             "detection model? (pass --nc)")


def _model_dict(cfg):
    """What DetectionModel builds from: an Ultralytics model name or YAML as is; a Sluice model YAML of multipliers
    (`depth_multiple`, `width_multiple`, `max_channels`, `family` yolov8, yolo11 or yolo26, no layer table) as that
    family's Ultralytics YAML with that one scale."""
    name = os.path.basename(cfg)
    if not name.endswith((".yaml", ".yml")):
        return cfg + ".yaml"  # yolov8n -> yolov8n.yaml (Ultralytics ships it)
    if not os.path.isfile(cfg):
        return cfg  # an Ultralytics-shipped name such as yolov8s.yaml
    import yaml

    with open(cfg) as f:
        d = yaml.safe_load(f) or {}
    if "backbone" in d or "head" in d:
        return cfg
    from ultralytics.nn.tasks import yaml_model_load

    family = str(d.get("family", "yolov8")).lower()
    if family not in ("yolov8", "yolo11", "yolo26"):
        sys.exit(f"{cfg}: family {family}: yolov8, yolo11 or yolo26")
    base = yaml_model_load(f"{family}.yaml")
    try:
        mult = [float(d["depth_multiple"]), float(d["width_multiple"]), int(d.get("max_channels", 1024))]
    except KeyError as e:
        sys.exit(f"{cfg}: neither a layer table (backbone/head) nor the multiplier {e}")
    base["scales"] = {"custom": mult}
    base["scale"] = "custom"
    base["yaml_file"] = cfg
    return base


def to_safetensors(src, dst):
    from safetensors.torch import save_file

    sd = _state_dict_from_pt(src)
    if _is_fused(sd):
        sys.exit(f"{src}: a fused model (Conv+BN folded by fuse()); Sluice reads unfused weights, convert the "
                 "checkpoint as saved by training or YOLO.save before fusing")
    dtypes = sorted({str(v.dtype).replace("torch.", "") for v in sd.values() if v.is_floating_point()})
    out = {k: (v.float() if v.is_floating_point() else v).contiguous().clone() for k, v in sd.items()}
    # One metadata key: safetensors writes metadata from a hash map, several keys would reorder between runs.
    save_file(out, dst, metadata={"source": f"converted from {os.path.basename(src)} ({'/'.join(dtypes)})"})
    note = "" if dtypes == ["float32"] else f" (stored as {'/'.join(dtypes)} in the .pt, written as float32)"
    print(f"{dst}: {len(out)} tensors{note}")


def to_pt(src, dst, cfg=None, nc=None, prefix=None, half=False):
    import torch

    sd, prefix = _read_safetensors(src, prefix)
    if half:
        sd = {k: (v.half() if v.is_floating_point() else v) for k, v in sd.items()}
    if cfg is None:
        torch.save(sd, dst)
        print(f"{dst}: state_dict with {len(sd)} tensors (no --cfg: YOLO() cannot open it)")
        return
    import ultralytics
    from ultralytics.nn.tasks import DetectionModel

    if nc is None:
        nc = _nc_of(sd, src)
    model = DetectionModel(_model_dict(cfg), nc=nc, verbose=False)
    want = model.state_dict()
    missing = [k for k in want if k not in sd]
    unexpected = [k for k in sd if k not in want]
    shapes = [f"{k} {tuple(v.shape)} vs {tuple(want[k].shape)}" for k, v in sd.items()
              if k in want and v.shape != want[k].shape]
    if missing or unexpected or shapes:
        sys.exit(f"{src}: does not fit {cfg} with nc {nc} (another scale or class count?): {len(missing)} missing "
                 f"keys {missing[:3]}, {len(unexpected)} unexpected keys {unexpected[:3]}, {len(shapes)} other "
                 f"shapes {shapes[:3]}")
    model.load_state_dict(sd, strict=True)
    if half:
        model.half()
    # The keys of `YOLO.save`'s checkpoint; `train_args` are what `YOLO(dst)` restores as its overrides.
    ckpt = {
        "model": model,
        "ema": None,
        "updates": None,
        "optimizer": None,
        "epoch": -1,
        "train_args": {"model": cfg, "task": "detect"},
        "version": ultralytics.__version__,
        "source": f"convert_weights.py to-pt {os.path.basename(src)}" + (f" --prefix {prefix}" if prefix else ""),
    }
    torch.save(ckpt, dst)
    dtype = "float16" if half else "float32"
    print(f"{dst}: Ultralytics checkpoint of {cfg} (nc {nc}), {len(sd)} tensors, {dtype}")


def _load_any(path, prefix):
    if path.endswith(".safetensors"):
        return _read_safetensors(path, prefix)[0]
    sd = _state_dict_from_pt(path)
    if prefix:
        sd = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
    return sd


def _bits(t):
    """The tensor's bit patterns as integers, so -0.0 vs 0.0 and NaN payloads count as differences."""
    import torch

    if not t.is_floating_point():
        return t
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()])


def check(a, b, prefix_a=None, prefix_b=None, float32=False):
    import torch

    x, y = _load_any(a, prefix_a), _load_any(b, prefix_b)
    bad = sorted(set(x) ^ set(y))
    for k in sorted(set(x) & set(y)):
        u, v = x[k], y[k]
        if float32 and u.is_floating_point() and v.is_floating_point():
            u, v = u.float(), v.float()
        if u.dtype != v.dtype or u.shape != v.shape:
            bad.append(k)
        elif not torch.equal(_bits(u), _bits(v)):
            bad.append(k)
    if bad:
        print(f"{len(bad)} keys differ, e.g. {bad[:5]}")
        sys.exit(1)
    print(f"identical: {len(x)} tensors" + (" (floats compared as float32)" if float32 else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("to-safetensors", help="Ultralytics .pt -> safetensors")
    p.add_argument("src")
    p.add_argument("dst")
    p = sub.add_parser("to-pt", help="safetensors (weights or a Sluice training checkpoint) -> .pt")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--cfg", help="yolov8n|s|m|l|x, an Ultralytics model YAML or a Sluice model YAML of multipliers "
                                 "(writes a checkpoint YOLO() opens; without it a plain state_dict)")
    p.add_argument("--nc", type=int, help="class count (default: read from the weights)")
    p.add_argument("--prefix", help="read only the tensors under this prefix, stripped (default for a Sluice "
                                    "training checkpoint: ema.; model. gives the raw trained model)")
    p.add_argument("--half", action="store_true", help="store float16, as Ultralytics does (rounds float32 weights)")
    p = sub.add_parser("check", help="are two weight files bit-identical?")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--prefix-a")
    p.add_argument("--prefix-b")
    p.add_argument("--float32", action="store_true", help="compare float tensors after upcasting to float32")
    args = ap.parse_args()
    if args.cmd == "to-safetensors":
        to_safetensors(args.src, args.dst)
    elif args.cmd == "to-pt":
        to_pt(args.src, args.dst, args.cfg, args.nc, args.prefix, args.half)
    else:
        check(args.a, args.b, args.prefix_a, args.prefix_b, args.float32)


if __name__ == "__main__":
    main()
