"""MuSGD parity fixture: Ultralytics 8.4.190's first ten MuSGD steps on YOLO11 and YOLO26, and its Muon update.

Usage (from the repository root, with the peers' venv: Ultralytics 8.4.190 + torch on the CPU):

    export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$HOME/.cache/sluice-peers/ultralytics_cfg OMP_NUM_THREADS=2 MKL_NUM_THREADS=2
    ~/.cache/sluice-peers/venv/bin/python crates/sluice-train/tests/data/musgd_parity/make_musgd_parity.py \
        --data datasets/synthetic/data.yaml

It runs the recorder of `../step_parity/make_step_parity.py` (same hooks, same settings: configs/quick.yaml's
90 epochs, batch 16, close_mosaic 10, seed 0, deterministic, CPU, imgsz 64) with `optimizer=MuSGD` on Ultralytics'
yolo11.yaml and yolo26.yaml at the multipliers of configs/models/yolo11-tiny.yaml and yolo26-tiny.yaml, for ten
batches: during warmup the accumulation is 1, so every batch is a MuSGD step. The dataloader does not depend on the
model, so the batches are the first ten of the step-parity fixture's `mosaic` run; the script checks that and
stores no images. Files written beside this script (README.md there describes them):

  musgd_parity.json: runs.<run>.init_f16   the initial state dicts (floats as float16, exact) as key ->
                                            [dtype, shape, SHA-256]; the test draws the weights from the seed
  musgd_parity.npz   per run the sampled indices and the checkpoint digests and samples (as step_parity.npz);
                     `ns_in_<k>` / `ns_out_<k>`: random matrices and Ultralytics' `zeropower_via_newtonschulz5` of
                     them (bfloat16 values as float32); `mu_grad_<k>` / `mu_out_<k>`: a `muon_update` call on four
                     conv-shaped gradients of one column count (its bucketing transposes some of them)
  musgd_parity.json  versions, per run the tensor names, param groups and per-batch records
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "step_parity"))
import make_step_parity as sp  # noqa: E402

RUNS = {"y11": (10, 10, [1, 2, 6, 10]), "y26": (10, 10, [1, 2, 6, 10])}
FAMILY = {"y11": "yolo11", "y26": "yolo26"}
NS_SHAPES = [(8, 72), (64, 16), (24, 24)]
MU_SHAPES = [(128, 8, 3, 3), (32, 8, 3, 3), (4, 8, 3, 3), (16, 8, 3, 3)]


def muon_cases(arrays):
    from ultralytics.optim.muon import muon_update, zeropower_via_newtonschulz5

    g = torch.Generator().manual_seed(7)
    for k, shape in enumerate(NS_SHAPES):
        x = torch.randn(*shape, generator=g)
        arrays[f"ns_in_{k}"] = x.numpy()
        arrays[f"ns_out_{k}"] = np.ascontiguousarray(zeropower_via_newtonschulz5(x).float().numpy())
    grads = [torch.randn(*s, generator=g) * 1e-2 for s in MU_SHAPES]
    moms = [torch.randn(*s, generator=g) * 1e-2 for s in MU_SHAPES]
    for k, (gr, m) in enumerate(zip(grads, moms)):
        arrays[f"mu_grad_{k}"] = gr.numpy()
        arrays[f"mu_mom_{k}"] = m.numpy().copy()
    outs = muon_update(grads, moms, beta=0.85, nesterov=True)
    for k, (o, m) in enumerate(zip(outs, moms)):
        arrays[f"mu_out_{k}"] = np.ascontiguousarray(o.float().numpy())
        arrays[f"mu_mom_after_{k}"] = m.numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(sp.REPO, "datasets", "synthetic", "data.yaml"))
    ap.add_argument("--out", default=HERE)
    a = ap.parse_args()
    import ultralytics

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    tmp = tempfile.mkdtemp(prefix="musgd_parity_")
    try:
        data, data_src = sp.copy_data(a.data, tmp)
        recs = {name: sp.run(name, data, sp.model_yaml(tmp, FAMILY[name]), tmp, runs=RUNS, optimizer="MuSGD")
                for name in RUNS}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    ref = np.load(os.path.join(HERE, "..", "step_parity", "step_parity.npz"))
    arrays = {}
    meta = {"versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                         "ultralytics": ultralytics.__version__, "numpy": np.__version__},
            "dataset": {"names": data_src["names"]}, "images": "step_parity.npz, run mosaic", "runs": {}}
    for name, r in recs.items():
        imgs = np.stack([b["img"] for b in r["batches"]])
        assert np.array_equal(imgs, ref["mosaic_img"][: len(imgs)]), f"{name}: batches differ from step_parity's"
        tg = np.concatenate([np.concatenate([np.full((len(b["targets"]), 1), i, np.float32), b["targets"]], 1)
                             for i, b in enumerate(r["batches"])]).astype(np.float32)
        ref_tg = ref["mosaic_targets"]
        assert np.array_equal(tg, ref_tg[ref_tg[:, 0] < len(imgs)]), f"{name}: targets differ from step_parity's"
        ri = r["init"]
        arrays[f"{name}_sample_idx"] = ri["idx"]
        for k, c in r["checkpoints"].items():
            for key, v in c.items():
                arrays[f"{name}_{k}_{key}"] = v
        meta["runs"][name] = {"family": FAMILY[name], "close_mosaic": RUNS[name][0], "checkpoints": RUNS[name][2],
                              "tensor_names": ri["names"], "train_images": ri["train_images"],
                              "init_f16": sp.init_manifest(ri["state_dict"]),
                              "optimizer": ri["optimizer"], "groups": ri["groups"], "accumulate": ri["accumulate"],
                              "batches_per_epoch": ri["nb"], "warmup_iterations": ri["warmup_iterations"],
                              "args": ri["args"], "per_batch": r["per_batch"]}
    muon_cases(arrays)
    np.savez_compressed(os.path.join(a.out, "musgd_parity.npz"), **arrays)
    json.dump(meta, open(os.path.join(a.out, "musgd_parity.json"), "w"), indent=1)
    for name, r in recs.items():
        print(name, meta["runs"][name]["optimizer"], "groups",
              [(g["param_group"], g["n_params"], g["initial_lr"], g["weight_decay"]) for g in r["init"]["groups"]])
        for b in r["per_batch"]:
            print(f"  ni {b['ni']:3d} acc {b['accumulate']} step {int(b['stepped'])} norm {b['grad_norm']} "
                  f"items {['%.5f' % v for v in b['loss_items']]} lr {['%.3e' % g['lr'] for g in b['groups']]}")
    for f in os.listdir(a.out):
        print(f, os.path.getsize(os.path.join(a.out, f)))


if __name__ == "__main__":
    main()
