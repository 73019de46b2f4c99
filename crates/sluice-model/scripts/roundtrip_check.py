#!/usr/bin/env python3
"""The whole weight round trip between Ultralytics and Sluice, with figures; exits 1 on any mismatch.

    YOLO_OFFLINE=1 python roundtrip_check.py --sluice target/debug/sluice [--work DIR] [--cases n:80,n:6,s:3]
                                             [--no-train]

Needs torch, safetensors, numpy and ultralytics (it never downloads: models are built from Ultralytics' YAMLs) and
a `sluice` binary. For each case `scale:nc`:

 1. Ultralytics side: `DetectionModel('yolov8<scale>.yaml', nc)` after `torch.manual_seed(0)`, BatchNorms
    calibrated as the reference fixtures' "bncal" model (random affine, running statistics of one batch; without
    it the activations of a randomly initialised YOLOv8 vanish and the outputs test little), saved with
    `YOLO.save` as Ultralytics writes it (float16 `model`); for the first case also as the trainer writes
    `last.pt` (float16 `ema`, `model` None).
 2. `convert_weights.py to-safetensors`; the file must hold exactly Ultralytics' loaded (float32) state_dict.
 3. `sluice model run` (unfused and `--fuse`) on a seeded (2, 3, 256, 320) input against Ultralytics' eval
    forward of the loaded checkpoint (and of `model.fuse()`): max abs difference of the boxes (px), class
    probabilities and raw logits, within the reference fixtures' float32 tolerances.
 4. `convert_weights.py to-pt --cfg` back (float32, and `--half`): `YOLO()` opens it, its tensors equal the
    original's bit for bit (float32: after the exact float16 upcast; `--half`: the original float16 bits), and
    its forward equals the original's exactly. For the first case: a fused checkpoint, another scale's --cfg and
    `check` of files differing in one element must be refused.
 5. Sluice side (unless --no-train): `sluice data gen` (64 images of 64 px, 6 classes) and a one-epoch
    `sluice train` from the converted nc-6 weights; `convert_weights.py to-pt --prefix ema.` of its
    `weights/last.safetensors` must load in Ultralytics with the checkpoint's `ema.*` tensors bit for bit, the
    default prefix of a checkpoint must be `ema.`, `--prefix model.` must give the `model.*` tensors, `to-safetensors`
    of the exported .pt must give the EMA tensors back bit for bit, and `sluice model run` on those must match
    Ultralytics' forward of the exported .pt; a one-epoch run of `configs/models/yolov8-tiny.yaml` (a custom
    scale) must export with `--cfg` that YAML and load in Ultralytics with its EMA tensors bit for bit.
"""

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CONVERT = os.path.join(HERE, "convert_weights.py")
TINY_YAML = os.path.normpath(os.path.join(HERE, "..", "..", "..", "configs", "models", "yolov8-tiny.yaml"))
# Ultralytics must never reach the network; keep its settings out of $HOME unless told otherwise.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", os.path.join(tempfile.gettempdir(), "sluice-roundtrip-ultralytics-cfg"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.nn.tasks import DetectionModel, load_checkpoint  # noqa: E402

# Float32 tolerances of the reference fixtures' bncal model (their README, $SLUICE_FIXTURES/README.md, model/).
TOL = {"boxes_px": 0.05, "probs": 1e-4, "raw_boxes": 1e-3, "raw_scores": 1e-3}

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print(f"  MISMATCH {msg}")


def run(cmd, **kw):
    print("  $ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.stdout.write(p.stdout + p.stderr)
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return p


def convert(*args):
    return run([sys.executable, CONVERT, *args])


def bits(t):
    if not t.is_floating_point():
        return t
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_tensors(what, a, b):
    """Same keys, dtypes, shapes and bit patterns."""
    keys = set(a) ^ set(b)
    if keys:
        fail(f"{what}: keys differ, e.g. {sorted(keys)[:3]}")
        return False
    bad = [k for k in a
           if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not torch.equal(bits(a[k]), bits(b[k]))]
    if bad:
        fail(f"{what}: {len(bad)} of {len(a)} tensors differ, e.g. {bad[:3]}")
        return False
    print(f"  ok {what}: {len(a)} tensors bit-identical")
    return True


def bn_calibrate(model, affine_seed=2, cal_seed=3, cal_shape=(2, 3, 160, 160)):
    """The reference fixtures' "bncal" procedure (peers/common.py), on a smaller calibration batch."""
    torch.manual_seed(affine_seed)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.weight.data = torch.empty(m.num_features).uniform_(0.5, 1.5)
        m.bias.data = torch.randn(m.num_features) * 0.1
        m.momentum = 1.0
    torch.manual_seed(cal_seed)
    model.train()
    with torch.no_grad():
        model(torch.rand(*cal_shape))
    for m in bns:
        m.momentum = 0.03
    return model.eval()


def ultralytics_forward(model, x, float64=False):
    """Eval forward; with float64, of a float64 copy (the float32 rounding noise of Ultralytics itself)."""
    if float64:
        model = copy.deepcopy(model).double()
    with torch.no_grad():
        y, raw = model(torch.from_numpy(x).double() if float64 else torch.from_numpy(x))
    return {"y": y.float().numpy(), "raw_boxes": raw["boxes"].float().numpy(),
            "raw_scores": raw["scores"].float().numpy()}


def sluice_forward(sluice, scale, nc, weights, x_path, out_dir, fuse=False):
    os.makedirs(out_dir, exist_ok=True)
    y_path = os.path.join(out_dir, "y.npy")
    cmd = [sluice, "model", "run", "--model", f"yolov8{scale}", "--nc", str(nc), "--weights", weights,
           "--input", x_path, "--output", y_path, "--raw-dir", out_dir, "--json"] + (["--fuse"] if fuse else [])
    summary = json.loads(run(cmd).stdout)
    return {"y": np.load(y_path), "raw_boxes": np.load(os.path.join(out_dir, "raw_boxes.npy")),
            "raw_scores": np.load(os.path.join(out_dir, "raw_scores.npy")), "forward_ms": summary.get("forward_ms")}


def diffs(a, b):
    return {
        "boxes_px": float(np.abs(a["y"][:, :4] - b["y"][:, :4]).max()),
        "probs": float(np.abs(a["y"][:, 4:] - b["y"][:, 4:]).max()),
        "raw_boxes": float(np.abs(a["raw_boxes"] - b["raw_boxes"]).max()),
        "raw_scores": float(np.abs(a["raw_scores"] - b["raw_scores"]).max()),
    }


def compare(what, ours, ref, ref64):
    """Max abs differences of Sluice's outputs from Ultralytics' float32 ones, next to Ultralytics' own float32
    noise (its float32 outputs against its float64 ones); fails above the fixtures' tolerances."""
    if ours["y"].shape != ref["y"].shape:
        fail(f"{what}: output shape {ours['y'].shape}, Ultralytics {ref['y'].shape}")
        return {}
    fig = diffs(ours, ref)
    noise = diffs(ref, ref64)
    scale = {"max_prob": float(ref["y"][:, 4:].max()), "raw_boxes_std": float(ref["raw_boxes"].std()),
             "raw_scores_range": [float(ref["raw_scores"].min()), float(ref["raw_scores"].max())]}
    print(f"  FIGURE {what}: max |sluice - ultralytics| boxes {fig['boxes_px']:.3g} px, probs {fig['probs']:.3g}, "
          f"raw box logits {fig['raw_boxes']:.3g}, raw class logits {fig['raw_scores']:.3g} "
          f"(Ultralytics: max prob {scale['max_prob']:.3f}, raw box logit std {scale['raw_boxes_std']:.2f}, "
          f"class logits "
          f"{scale['raw_scores_range'][0]:.1f}..{scale['raw_scores_range'][1]:.1f})")
    print(f"         Ultralytics float32 vs float64: boxes {noise['boxes_px']:.3g} px, probs {noise['probs']:.3g}, "
          f"raw box logits {noise['raw_boxes']:.3g}, raw class logits {noise['raw_scores']:.3g}")
    fig["ultralytics_f32_vs_f64"] = noise
    for k, tol in TOL.items():
        if not fig[k] <= tol:
            fail(f"{what}: {k} differs by {fig[k]:.3g} > {tol:g}")
    return fig


def forward_identical(what, a, b, x):
    ya, yb = ultralytics_forward(a, x), ultralytics_forward(b, x)
    bad = [k for k in ya if not np.array_equal(ya[k], yb[k])]
    if bad:
        fail(f"{what}: forward differs in {bad}")
    else:
        print(f"  ok {what}: Ultralytics forward bit-identical")


def refused(what, args, needle):
    """The converter must exit non-zero with a message containing `needle`."""
    p = subprocess.run([sys.executable, CONVERT, *args], capture_output=True, text=True)
    msg = (p.stdout + p.stderr).strip().splitlines()
    if p.returncode == 0 or needle not in (p.stdout + p.stderr):
        fail(f"{what}: exit {p.returncode}, said {msg[-1:] if msg else ''}")
    else:
        print(f"  ok refused {what}: {msg[-1]}")


def negative_checks(d, model, pt, st):
    """Files the converter must refuse rather than convert into something Sluice or Ultralytics misreads."""
    fused = os.path.join(d, "fused.pt")
    torch.save({"model": copy.deepcopy(model).fuse(verbose=False).half(), "ema": None}, fused)
    refused("a fused checkpoint", ["to-safetensors", fused, os.path.join(d, "fused.safetensors")], "fused")
    refused("another scale's --cfg", ["to-pt", st, os.path.join(d, "wrong.pt"), "--cfg", "yolov8s"], "does not fit")
    other = load_file(st)
    k = "model.0.bn.running_mean"
    other[k] = other[k].clone()
    other[k][0] = -other[k][0] if other[k][0] != 0 else 1.0
    changed = os.path.join(d, "changed.safetensors")
    save_file(other, changed)
    refused("check of files differing in one element", ["check", st, changed], "1 keys differ")


def trainer_style_checkpoint(model, cfg):
    """What Ultralytics' BaseTrainer.save_model writes as last.pt (float16 EMA, no 'model'), less the optimizer."""
    import ultralytics

    return {"epoch": 0, "best_fitness": None, "model": None, "ema": copy.deepcopy(model).half(), "updates": 1,
            "optimizer": None, "train_args": {"model": cfg, "task": "detect"}, "version": ultralytics.__version__}


def case(sluice, work, scale, nc, x, x_path, trainer_style):
    cfg = f"yolov8{scale}.yaml"
    print(f"\n== yolov8{scale}, nc {nc}")
    d = os.path.join(work, f"yolov8{scale}_nc{nc}")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(0)
    model = bn_calibrate(DetectionModel(cfg, nc=nc, verbose=False))
    pts = {}
    y = YOLO(cfg)
    y.model = model
    pts["YOLO.save"] = os.path.join(d, "yolo_save.pt")
    y.save(pts["YOLO.save"])
    if trainer_style:
        pts["trainer last.pt"] = os.path.join(d, "trainer_last.pt")
        torch.save(trainer_style_checkpoint(model, cfg), pts["trainer last.pt"])
    figs = {}
    for style, pt in pts.items():
        print(f" -- {style}: {os.path.basename(pt)}")
        ref_model, _ = load_checkpoint(pt)  # as YOLO(pt) loads it: float32, eval
        ref_sd = {k: v.clone() for k, v in ref_model.state_dict().items()}
        st = pt[:-3] + ".safetensors"
        convert("to-safetensors", pt, st)
        same_tensors("to-safetensors vs Ultralytics' loaded state_dict", load_file(st), ref_sd)
        ref = ultralytics_forward(ref_model, x)
        ours = sluice_forward(sluice, scale, nc, st, x_path, os.path.join(d, "run"))
        ref64 = ultralytics_forward(ref_model, x, float64=True)
        figs[style] = compare(f"yolov8{scale} nc {nc} ({style}), eval", ours, ref, ref64)
        fused_model = copy.deepcopy(ref_model).fuse(verbose=False)
        fused_ref = ultralytics_forward(fused_model, x)
        ours_fused = sluice_forward(sluice, scale, nc, st, x_path, os.path.join(d, "run_fused"), fuse=True)
        figs[style + " fused"] = compare(f"yolov8{scale} nc {nc} ({style}), fused", ours_fused, fused_ref,
                                         ultralytics_forward(fused_model, x, float64=True))
        print(f"  sluice model run forward: {ours['forward_ms']:.0f} ms unfused, "
              f"{ours_fused['forward_ms']:.0f} ms fused")

        # Back to .pt: float32 (default) and float16 (--half, as Ultralytics saves).
        orig = torch.load(pt, map_location="cpu", weights_only=False)
        orig_sd = (orig.get("ema") or orig.get("model")).state_dict()
        for half in (False, True):
            back = pt[:-3] + ("_back_half.pt" if half else "_back.pt")
            convert("to-pt", st, back, "--cfg", f"yolov8{scale}", *(["--half"] if half else []))
            ym = YOLO(back)
            if ym.task != "detect" or ym.model.yaml.get("nc") != nc or len(ym.model.names) != nc:
                fail(f"{back}: YOLO() gives task {ym.task}, nc {ym.model.yaml.get('nc')}")
            raw = torch.load(back, map_location="cpu", weights_only=False)["model"].state_dict()
            if half:
                same_tensors("to-pt --half vs the original float16 checkpoint", raw, orig_sd)
            else:
                same_tensors("to-pt vs Ultralytics' loaded state_dict", raw, ref_sd)
            forward_identical(f"YOLO({os.path.basename(back)}) vs YOLO({os.path.basename(pt)})", ym.model, ref_model, x)
        # And the script's own `check` agrees.
        print("  " + convert("check", st, pt, "--float32").stdout.strip())
        if trainer_style and style == "YOLO.save":
            negative_checks(d, ref_model, pt, st)
    return figs, pts


def sluice_side(sluice, work, st6, x, x_path):
    """A Sluice training checkpoint -> Ultralytics (--prefix ema.) and back."""
    print("\n== Sluice training checkpoint (yolov8n, nc 6) -> Ultralytics")
    d = os.path.join(work, "sluice_train")
    shutil.rmtree(d, ignore_errors=True)
    data = os.path.join(d, "data")
    # 64 images in batches of 32: Ultralytics' accumulation (nbs 64) makes that one optimizer step and one EMA
    # update (a one-epoch run has no warmup), so the EMA, the trained model and the initial weights all differ.
    run([sluice, "data", "gen", "--out", data, "--train", "64", "--val", "4", "--imgsz", "64", "--seed", "0"])
    run([sluice, "train", "--data", os.path.join(data, "data.yaml"), "--model", "yolov8n", "--weights", st6,
         "--epochs", "1", "--imgsz", "64", "--batch", "32", "--workers", "1", "--seed", "0", "--project", d,
         "--name", "run", "--exist-ok", "--json"], cwd=d)
    last = os.path.join(d, "run", "weights", "last.safetensors")
    with safe_open(last, framework="pt") as f:
        fmt = (f.metadata() or {}).get("format")
        ck = {k: f.get_tensor(k) for k in f.keys()}
    print(f"  {os.path.basename(last)}: format {fmt}, {len(ck)} tensors "
          f"({sum(k.startswith('ema.') for k in ck)} ema., {sum(k.startswith('model.') for k in ck)} model.)")
    ema = {k[4:]: v for k, v in ck.items() if k.startswith("ema.")}
    raw = {k[6:]: v for k, v in ck.items() if k.startswith("model.")}
    start = load_file(st6)
    moved = sum(not torch.equal(ema[k], start[k]) for k in start if start[k].is_floating_point())
    apart = sum(not torch.equal(ema[k], raw[k]) for k in ema)
    print(f"  the EMA differs from the initial weights in {moved} tensors, from the trained model in {apart}")
    if moved == 0 or apart == 0:
        fail("training left the EMA equal to the initial or the trained weights: a mix-up would go unseen")

    ema_pt, default_pt, model_pt = (os.path.join(d, n) for n in ("ema.pt", "default.pt", "model.pt"))
    convert("to-pt", last, ema_pt, "--prefix", "ema.", "--cfg", "yolov8n")
    convert("to-pt", last, default_pt, "--cfg", "yolov8n")
    convert("to-pt", last, model_pt, "--prefix", "model.", "--cfg", "yolov8n")
    for name, pt, want in (("--prefix ema.", ema_pt, ema), ("no --prefix (default ema.)", default_pt, ema),
                           ("--prefix model.", model_pt, raw)):
        ym = YOLO(pt)
        same_tensors(f"to-pt {name} in YOLO() vs the checkpoint", ym.model.state_dict(), want)
    # Back to safetensors from the exported .pt: the EMA tensors again, and Sluice's forward matches Ultralytics'.
    ema_st = os.path.join(d, "ema.safetensors")
    convert("to-safetensors", ema_pt, ema_st)
    same_tensors("to-safetensors of the exported .pt vs the checkpoint's ema.*", load_file(ema_st), ema)
    ref_model, _ = load_checkpoint(ema_pt)
    ours = sluice_forward(sluice, "n", 6, ema_st, x_path, os.path.join(d, "run_out"))
    if os.path.isfile(TINY_YAML):
        # A custom scale (a Sluice model YAML of multipliers): Ultralytics builds it and loads it strictly.
        # (`sluice model run` takes the named scales only, so there is no forward comparison for it.)
        run([sluice, "train", "--data", os.path.join(data, "data.yaml"), "--model", TINY_YAML, "--epochs", "1",
             "--imgsz", "64", "--batch", "32", "--workers", "1", "--seed", "0", "--project", d, "--name", "tiny",
             "--exist-ok", "--json"], cwd=d)
        tiny_last, tiny_pt = os.path.join(d, "tiny", "weights", "last.safetensors"), os.path.join(d, "tiny.pt")
        convert("to-pt", tiny_last, tiny_pt, "--cfg", TINY_YAML)
        ym = YOLO(tiny_pt)
        with safe_open(tiny_last, framework="pt") as f:
            want = {k[4:]: f.get_tensor(k) for k in f.keys() if k.startswith("ema.")}
        same_tensors(f"to-pt --cfg {os.path.basename(TINY_YAML)} in YOLO() vs the checkpoint's ema.*",
                     ym.model.state_dict(), want)
        with torch.no_grad():
            ym.model(torch.from_numpy(x))
    return compare("Sluice-trained EMA (yolov8n nc 6), eval", ours, ultralytics_forward(ref_model, x),
                   ultralytics_forward(ref_model, x, float64=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", required=True, help="the sluice binary")
    ap.add_argument("--work", help="working folder (default: a temporary one, removed afterwards)")
    ap.add_argument("--cases", default="n:80,n:6,s:3", help="scale:nc,... (the Sluice-side check needs n:6)")
    ap.add_argument("--no-train", action="store_true", help="skip the Sluice training-checkpoint check")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sluice = os.path.abspath(args.sluice)
    work = os.path.abspath(args.work) if args.work else tempfile.mkdtemp(prefix="sluice-roundtrip-")
    os.makedirs(work, exist_ok=True)
    import ultralytics

    print(f"torch {torch.__version__}, ultralytics {ultralytics.__version__}, numpy {np.__version__}; "
          f"{run([sluice, '--version']).stdout.strip()}; work {work}")
    torch.manual_seed(1)
    x = torch.rand(2, 3, 256, 320).numpy()
    x_path = os.path.join(work, "x.npy")
    np.save(x_path, x)
    cases = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
    figures, st6 = {}, None
    for i, (scale, nc) in enumerate(cases):
        figs, pts = case(sluice, work, scale, nc, x, x_path, trainer_style=i == 0)
        figures[f"yolov8{scale} nc {nc}"] = figs
        if (scale, nc) == ("n", 6):
            st6 = pts["YOLO.save"][:-3] + ".safetensors"
    if not args.no_train:
        if st6 is None:
            raise SystemExit("the Sluice-side check trains from the n:6 case: add it to --cases or pass --no-train")
        figures["sluice-trained ema"] = sluice_side(sluice, work, st6, x, x_path)
    print("\nFIGURES " + json.dumps(figures))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"\n{len(FAILURES)} MISMATCHES:\n  " + "\n  ".join(FAILURES))
        sys.exit(1)
    print("\nround trip OK")


if __name__ == "__main__":
    main()
