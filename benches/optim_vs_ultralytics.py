"""Peer side of benches/optim_vs_ultralytics.sh: one optimizer step of Ultralytics 8.4.190's own optimizers over
yolov8n's parameters on the CPU, timed as Sluice's `optim` criterion bench times its own (clip to norm 10, the
step, the EMA update), with gradients of N(0, 1e-3) on every parameter.

The optimizer is built by Ultralytics' `BaseTrainer.build_optimizer` (its parameter groups, and for MuSGD its eight
groups and `MuSGD(muon=0.2, sgd=1.0)`), lr 0.01, momentum 0.937, weight decay 5e-4. Prints one JSON line per
optimizer: {"rule", "median_ms", "min_ms", "max_ms", "iters"}.
"""
import json
import os
import statistics
import sys
import time
import types

import torch

WARMUP, ITERS = 3, int(os.environ.get("ITERS", "20"))


def main():
    from ultralytics.engine.trainer import BaseTrainer
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils.torch_utils import ModelEMA

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    for rule in sys.argv[1:] or ["SGD", "AdamW", "MuSGD"]:
        torch.manual_seed(0)
        model = DetectionModel("yolov8n.yaml", nc=80, verbose=False)
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        stub = types.SimpleNamespace(args=types.SimpleNamespace(), data={"nc": 80})
        opt = BaseTrainer.build_optimizer(stub, model, name=rule, lr=0.01, momentum=0.937, decay=5e-4)
        ema = ModelEMA(model)
        times = []
        for i in range(WARMUP + ITERS):
            t = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, max_norm=10.0)
            opt.step()
            ema.update(model)
            if i >= WARMUP:
                times.append((time.perf_counter() - t) * 1e3)
        print(json.dumps({"rule": rule, "median_ms": statistics.median(times), "min_ms": min(times),
                          "max_ms": max(times), "iters": ITERS}), flush=True)


if __name__ == "__main__":
    main()
