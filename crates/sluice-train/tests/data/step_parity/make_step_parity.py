"""Step-for-step parity fixture: the first training batches of Ultralytics 8.4.190 on Sluice's embedded default.

Usage (from the repository root, with the peers' venv: Ultralytics 8.4.190 + torch on the CPU):

    export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$HOME/.cache/sluice-peers/ultralytics_cfg OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
    ~/.cache/sluice-peers/venv/bin/python crates/sluice-train/tests/data/step_parity/make_step_parity.py \
        --data datasets/synthetic/data.yaml

`--data` is the generated synthetic shapes set (`cargo xtask gen-data`); it is copied to a temporary folder first, so
Ultralytics' label caches never land in the repository. The files are written beside this script (README.md there
describes them and what `tests/step_parity.rs` checks).

The run: Ultralytics' `DetectionTrainer` on its yolov8.yaml at the multipliers of configs/models/yolov8-tiny.yaml
(depth 0.33, width 0.125, max 1024 channels), with configs/quick.yaml's settings (90 epochs, batch 16, close_mosaic
10, optimizer auto, seed 0, deterministic, CPU, cache ram) and amp off, plots off, workers 0, at imgsz 64 so the
fixture stays small. Hooks record, without changing Ultralytics' loop:
  * the initial weights (after `_setup_train`, before the first batch), rounded to float16 in the model and in its
    EMA copy before the first batch, so that the float16 file holds them exactly;
  * every batch as its dataloader yields it (uint8 images, batch_idx, cls, normalised xywh boxes);
  * after every batch: the loss items, each param group's lr / momentum / betas / weight decay, `accumulate`,
    whether `optimizer_step` ran and the total gradient norm it clipped (torch's `clip_grad_norm_` value);
  * at the checkpoint batches: per-tensor digests (sum, L2 norm, max abs, in float64) of the model's and the EMA's
    state dict, of both the values and their change since the initial weights, and a fixed sample of elements; and
    the digests of the EMA's lag behind the model (EMA − model).
Two runs: `mosaic` (close_mosaic 10: every recorded batch is a mosaic one) and `closed` (the same run with
close_mosaic 90, so the dataloader closes mosaic at epoch 0: letterboxed batches, the close_mosaic augmentation).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", "..", "..", "..", ".."))
IMGSZ = 64
SAMPLES = 8  # elements sampled per tensor
RUNS = {
    # name: (close_mosaic, batches recorded, checkpoint batches (1-based counts of batches done))
    "mosaic": (10, 24, [1, 2, 10, 24]),
    "closed": (90, 4, [4]),
}


class StopRun(Exception):
    """Raised from a callback once the recorded batches are done: ends Ultralytics' loop without validation."""


# family: (Ultralytics' model YAML under cfg/models, Sluice's tiny multipliers under configs/models)
FAMILIES = {
    "yolov8": ("v8/yolov8.yaml", "yolov8-tiny.yaml"),
    "yolo11": ("11/yolo11.yaml", "yolo11-tiny.yaml"),
    "yolo26": ("26/yolo26.yaml", "yolo26-tiny.yaml"),
}


def model_yaml(tmp, family="yolov8"):
    """Ultralytics' model YAML of `family` with one scale `t` = the multipliers of Sluice's tiny config of it."""
    import ultralytics

    ul_yaml, tiny_yaml = FAMILIES[family]
    tiny = yaml.safe_load(open(os.path.join(REPO, "configs", "models", tiny_yaml)))
    base = yaml.safe_load(open(os.path.join(os.path.dirname(ultralytics.__file__), "cfg", "models", ul_yaml)))
    base["scales"] = {"t": [tiny["depth_multiple"], tiny["width_multiple"], tiny["max_channels"]]}
    path = os.path.join(tmp, f"{family}t.yaml")
    yaml.safe_dump(base, open(path, "w"), sort_keys=False)
    return path


def copy_data(src_yaml, tmp):
    """A private copy of the dataset (images, labels, names) with an absolute `path`."""
    src = os.path.dirname(os.path.abspath(src_yaml))
    d = yaml.safe_load(open(src_yaml))
    dst = os.path.join(tmp, "data")
    for split in ("train", "val"):
        for kind in ("images", "labels"):
            shutil.copytree(os.path.join(src, kind, split), os.path.join(dst, kind, split))
    out = {"path": dst, "train": d["train"], "val": d["val"], "names": d["names"]}
    path = os.path.join(dst, "data.yaml")
    yaml.safe_dump(out, open(path, "w"), sort_keys=False)
    return path, d


def float_items(sd):
    return [(k, v) for k, v in sd.items() if v.dtype.is_floating_point]


def digests(tensors):
    """(T, 3) float64: sum, L2 norm, max abs of each tensor."""
    out = np.zeros((len(tensors), 3))
    for i, t in enumerate(tensors):
        x = t.detach().double().flatten()
        out[i] = [float(x.sum()), float(x.norm()), float(x.abs().max())]
    return out


def samples(tensors, idx):
    out = np.zeros(idx.shape, dtype=np.float32)
    for i, t in enumerate(tensors):
        x = t.detach().float().flatten()
        for j, k in enumerate(idx[i]):
            if k >= 0:
                out[i, j] = float(x[k])
    return out


def init_manifest(sd):
    """The initial state dict (floats as float16, which the hooks made exact) as key -> [dtype, shape, SHA-256 of the
    little-endian bytes]: Sluice draws the same weights from the seed, and the test holds them to these hashes."""
    out = {}
    for k, v in sd.items():
        a = (v.half() if v.dtype.is_floating_point else v).contiguous().numpy()
        out[k] = [str(a.dtype), list(a.shape), hashlib.sha256(a.astype(a.dtype.newbyteorder("<")).tobytes()).hexdigest()]
    return out


def run(name, data, model_cfg, tmp, runs=RUNS, optimizer="auto"):
    from ultralytics.models.yolo.detect import DetectionTrainer

    close_mosaic, n_batches, checkpoints = runs[name]
    overrides = dict(model=model_cfg, data=data, epochs=90, imgsz=IMGSZ, batch=16, close_mosaic=close_mosaic,
                     cache="ram", device="cpu", seed=0, deterministic=True, amp=False, optimizer=optimizer, workers=0,
                     plots=False, val=False, verbose=False, project=os.path.join(tmp, "runs"), name=name,
                     exist_ok=True)
    trainer = DetectionTrainer(overrides=overrides)
    rec = {"batches": [], "per_batch": [], "checkpoints": {}, "init": None}
    state = {"ni": -1, "stepped": False, "grad_norm": None}

    def on_pretrain_routine_end(tr):
        # Round the initial weights to float16 in place (model and EMA, which starts as its copy), so the float16
        # fixture file holds exactly the weights Ultralytics trains from.
        with torch.no_grad():
            for m in (tr.model, tr.ema.ema):
                for _, v in float_items(m.state_dict()):
                    v.copy_(v.half().float())
        sd = {k: v.detach().clone() for k, v in tr.model.state_dict().items()}
        ema = tr.ema.ema.state_dict()
        assert all(torch.equal(sd[k], ema[k]) for k in sd), "EMA starts as the model"
        names = [n for n, _ in float_items(sd)]
        rng = np.random.default_rng(0)
        idx = -np.ones((len(names), SAMPLES), dtype=np.int64)
        for i, n in enumerate(names):
            k = min(SAMPLES, sd[n].numel())
            idx[i, :k] = np.sort(rng.choice(sd[n].numel(), k, replace=False))
        groups = [{"param_group": g.get("param_group"), "n_params": len(g["params"]),
                   "initial_lr": g["initial_lr"], "weight_decay": g["weight_decay"],
                   "betas": list(g.get("betas", [])), "momentum": g.get("momentum")}
                  for g in tr.optimizer.param_groups]
        rec["init"] = {"state_dict": sd, "names": names, "idx": idx, "groups": groups,
                       "optimizer": type(tr.optimizer).__name__, "accumulate": tr.accumulate,
                       "nb": len(tr.train_loader), "train_images": len(tr.train_loader.dataset),
                       "warmup_iterations": tr._get_warmup_iterations(len(tr.train_loader)),
                       "args": {k: getattr(tr.args, k) for k in ("lr0", "lrf", "momentum", "weight_decay",
                                                                   "warmup_epochs", "warmup_momentum",
                                                                   "warmup_bias_lr", "nbs", "cos_lr", "optimizer",
                                                                   "close_mosaic", "epochs", "batch", "imgsz",
                                                                   "seed", "deterministic", "amp", "box", "cls",
                                                                   "dfl")}}

    orig_preprocess = trainer.preprocess_batch

    def preprocess_spy(batch):
        state["ni"] += 1
        state["stepped"], state["grad_norm"] = False, None
        img = batch["img"]
        assert img.dtype == torch.uint8 and tuple(img.shape[1:]) == (3, IMGSZ, IMGSZ), (img.dtype, img.shape)
        rec["batches"].append({"img": img.numpy().copy(),
                               "targets": torch.cat([batch["batch_idx"].view(-1, 1).float(),
                                                     batch["cls"].view(-1, 1).float(),
                                                     batch["bboxes"].float()], 1).numpy().copy()})
        return orig_preprocess(batch)

    trainer.preprocess_batch = preprocess_spy
    orig_step = trainer.optimizer_step

    def optimizer_step_spy():
        # The total norm clip_grad_norm_ computes (torch.linalg.vector_norm of the per-tensor norms).
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        state["stepped"], state["grad_norm"] = True, float(norm)
        orig_step()

    trainer.optimizer_step = optimizer_step_spy

    def on_train_batch_end(tr):
        ni = state["ni"]
        items = tr.loss_items
        items = [float(v) for v in (items.values() if isinstance(items, dict) else items)]
        groups = [{"lr": g["lr"], "momentum": g.get("momentum"), "betas": list(g.get("betas", [])),
                   "weight_decay": g["weight_decay"]} for g in tr.optimizer.param_groups]
        rec["per_batch"].append({"ni": ni, "epoch": tr.epoch, "loss_items": items, "groups": groups,
                                 "accumulate": tr.accumulate, "stepped": state["stepped"],
                                 "grad_norm": state["grad_norm"], "ema_updates": tr.ema.updates})
        done = ni + 1
        if done in checkpoints:
            init = rec["init"]
            names, idx, sd0 = init["names"], init["idx"], init["state_dict"]
            c = {}
            for tag, m in (("model", tr.model), ("ema", tr.ema.ema)):
                sd = m.state_dict()
                now = [sd[n] for n in names]
                delta = [sd[n].double() - sd0[n].double() for n in names]
                c[f"{tag}_digest"] = digests(now)
                c[f"{tag}_delta_digest"] = digests(delta)
                c[f"{tag}_sample"] = samples(now, idx)
                c[f"{tag}_delta_sample"] = samples([d.float() for d in delta], idx)
            # The EMA's lag behind the model, in float64: early in training the EMA is within a percent of the
            # model, so only this difference pins the decay down.
            msd, esd = tr.model.state_dict(), tr.ema.ema.state_dict()
            c["lag_digest"] = digests([esd[n].double() - msd[n].double() for n in names])
            rec["checkpoints"][done] = c
        if done >= n_batches:
            raise StopRun()

    trainer.add_callback("on_pretrain_routine_end", on_pretrain_routine_end)
    trainer.add_callback("on_train_batch_end", on_train_batch_end)
    try:
        trainer.train()
    except StopRun:
        pass
    assert len(rec["batches"]) == n_batches and sorted(rec["checkpoints"]) == checkpoints
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(REPO, "datasets", "synthetic", "data.yaml"))
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    import ultralytics

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    tmp = tempfile.mkdtemp(prefix="step_parity_")
    try:
        data, data_src = copy_data(a.data, tmp)
        cfg = model_yaml(tmp)
        recs = {name: run(name, data, cfg, tmp) for name in RUNS}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    init = recs["mosaic"]["init"]
    for name, r in recs.items():  # both runs start from the same weights (seed 0) and the same optimizer
        assert all(torch.equal(r["init"]["state_dict"][k], init["state_dict"][k]) for k in init["state_dict"]), name

    arrays = {"sample_idx": init["idx"]}
    meta = {"versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "ultralytics": ultralytics.__version__, "numpy": np.__version__},
            "dataset": {"names": data_src["names"], "train_images": init["train_images"]},
            "model": "ultralytics/cfg/models/v8/yolov8.yaml, scale t = configs/models/yolov8-tiny.yaml",
            "tensor_names": init["names"], "init_f16": init_manifest(init["state_dict"]), "runs": {}}
    for name, r in recs.items():
        imgs = np.stack([b["img"] for b in r["batches"]])
        tg = np.concatenate([np.concatenate([np.full((len(b["targets"]), 1), i, np.float32), b["targets"]], 1)
                             for i, b in enumerate(r["batches"])])
        arrays[f"{name}_img"] = imgs
        arrays[f"{name}_targets"] = tg.astype(np.float32)
        for k, c in r["checkpoints"].items():
            for key, v in c.items():
                arrays[f"{name}_{k}_{key}"] = v
        ri = r["init"]
        meta["runs"][name] = {"close_mosaic": RUNS[name][0], "checkpoints": RUNS[name][2],
                              "optimizer": ri["optimizer"], "groups": ri["groups"], "accumulate": ri["accumulate"],
                              "batches_per_epoch": ri["nb"], "warmup_iterations": ri["warmup_iterations"],
                              "args": ri["args"], "per_batch": r["per_batch"]}
    np.savez_compressed(os.path.join(a.out, "step_parity.npz"), **arrays)
    json.dump(meta, open(os.path.join(a.out, "step_parity.json"), "w"), indent=1)
    for name, r in recs.items():
        print(name, meta["runs"][name]["optimizer"], "groups",
              [(g["param_group"], g["n_params"], g["initial_lr"], g["weight_decay"]) for g in r["init"]["groups"]])
        for b in r["per_batch"]:
            print(f"  ni {b['ni']:3d} acc {b['accumulate']} step {int(b['stepped'])} norm {b['grad_norm']} "
                  f"items {['%.5f' % v for v in b['loss_items']]} lr {['%.3e' % g['lr'] for g in b['groups']]}")
    for f in ("step_parity.npz", "step_parity.json"):
        print(f, os.path.getsize(os.path.join(a.out, f)))


if __name__ == "__main__":
    main()
