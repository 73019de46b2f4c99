"""Two steps of Ultralytics 8.4.190's `MuSGD` on a Muon group, for the optimizer's unit test
(`optim::optimizer`, `musgd_muon_group_matches_ultralytics`):

  musgd_one_step.json   two parameters of a Muon group, a conv filter (8, 4, 3, 3) and a matrix (6, 10), their
                        initial values, the gradients of two steps, and the parameters after each step of
                        `MuSGD(groups, muon=0.2, sgd=1.0)` (Ultralytics' `build_optimizer` weights) at lr 0.01,
                        momentum 0.9, Nesterov, weight decay 5e-4; `spread` is, per step, the largest difference of
                        the step's update from the same step with Newton-Schulz in float32 instead of bfloat16,
                        over the update's largest magnitude: the rounding the bfloat16 iteration itself allows.

Run from the peers' venv: `python make_musgd_one_step.py`.
"""

import json
import os

import torch
import ultralytics
from ultralytics.optim import MuSGD
import ultralytics.optim.muon as muon

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = [(8, 4, 3, 3), (6, 10)]
HYPER = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "nesterov": True, "use_muon": True}


def run(init, grads, ns_dtype):
    params = [torch.nn.Parameter(t.clone()) for t in init]
    original = muon.zeropower_via_newtonschulz5
    if ns_dtype == torch.float32:
        def ns32(G, eps=1e-7):
            X = G.reshape(-1, G.size(-2), G.size(-1)).float()
            X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
            if G.size(-2) > G.size(-1):
                X = X.transpose(-2, -1)
            a, b, c = 3.4445, -4.7750, 2.0315
            for _ in range(5):
                A = X @ X.transpose(-2, -1)
                B = torch.baddbmm(A, A, A, beta=b, alpha=c)
                X = torch.baddbmm(X, B, X, beta=a)
            if G.size(-2) > G.size(-1):
                X = X.transpose(-2, -1)
            return X.reshape(G.shape)
        muon.zeropower_via_newtonschulz5 = ns32
    try:
        opt = MuSGD([{"params": params, **HYPER}], muon=0.2, sgd=1.0)
        after = []
        for g in grads:
            for p, gi in zip(params, g):
                p.grad = gi.clone()
            opt.step()
            after.append([p.detach().clone() for p in params])
        return after
    finally:
        muon.zeropower_via_newtonschulz5 = original


def main():
    assert ultralytics.__version__ == "8.4.190", ultralytics.__version__
    gen = torch.Generator().manual_seed(0)
    init = [0.1 * torch.randn(s, generator=gen) for s in SHAPES]
    grads = [[torch.randn(s, generator=gen) * (0.5 + i) for s in SHAPES] for i in range(2)]
    ref = run(init, grads, torch.bfloat16)
    f32 = run(init, grads, torch.float32)
    spread = []
    prev = init
    for step in range(2):
        worst = 0.0
        for p0, a, b in zip(prev, ref[step], f32[step]):
            u = a - p0
            worst = max(worst, float((a - b).abs().max() / u.abs().max()))
        spread.append(worst)
        prev = ref[step]
    out = {
        "shapes": SHAPES,
        "hyper": HYPER,
        "muon": 0.2,
        "sgd": 1.0,
        "init": [t.flatten().tolist() for t in init],
        "grads": [[t.flatten().tolist() for t in g] for g in grads],
        "after": [[t.flatten().tolist() for t in step] for step in ref],
        "spread": spread,
    }
    with open(os.path.join(HERE, "musgd_one_step.json"), "w") as f:
        json.dump(out, f)
    print("spread (bfloat16 vs float32 Newton-Schulz, relative to the update):", spread)


if __name__ == "__main__":
    main()
