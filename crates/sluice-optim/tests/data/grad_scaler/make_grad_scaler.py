"""Loss-scaling fixture: PyTorch's `torch.amp.GradScaler` driving Ultralytics' optimizer step on one parameter.

Usage (from the repository root, with the peers' venv: Ultralytics 8.4.190 and torch on the CPU):

    export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$HOME/.cache/sluice-peers/ultralytics_cfg
    ~/.cache/sluice-peers/venv/bin/python crates/sluice-optim/tests/data/grad_scaler/make_grad_scaler.py

Writes grad_scaler.json beside this script. The run is Ultralytics 8.4's `optimizer_step` (`scaler.unscale_`,
`clip_grad_norm_(max_norm=10)`, `scaler.step`, `scaler.update`, `zero_grad`) after `scaler.scale(loss).backward()`,
with SGD (lr 0.01, momentum 0.937, Nesterov, no weight decay: Ultralytics' bias group after warmup) on a
two-element parameter and the loss `sum(p * c_k)`, whose gradient is `c_k`. The scaler has its defaults except
`growth_interval=3`, so that growth shows in a short run. Ultralytics' `ModelEMA` follows the parameter, and is
updated after every optimizer step, skipped or not. Some `c_k` are finite but overflow float32 once scaled
(1e34 at scale 2^16), which is the case loss scaling exists for: the step is skipped, the scale halves, and the next
such gradient goes through, clipped.
"""
import json
import os

import torch
from ultralytics.utils.torch_utils import ModelEMA

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    g = torch.Generator().manual_seed(0)
    coeffs = []
    for k in range(40):
        c = (torch.randn(2, generator=g) * 3.0).tolist()
        if k in (5, 6, 17, 30):
            c = [1e34, -2e33]  # overflows at a scale above 2^15
        if k == 22:
            c = [3e38, 1.0]  # overflows at any scale above 1
        coeffs.append([float(x) for x in torch.tensor(c, dtype=torch.float32).tolist()])
    init = [0.25, -0.5]
    model = torch.nn.Module()
    model.p = torch.nn.Parameter(torch.tensor(init, dtype=torch.float32))
    p = model.p
    ema = ModelEMA(model)
    opt = torch.optim.SGD([p], lr=0.01, momentum=0.937, nesterov=True, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cpu", growth_interval=3)
    steps = []
    for c in coeffs:
        loss = (p * torch.tensor(c, dtype=torch.float32)).sum()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        norm = torch.nn.utils.clip_grad_norm_([p], max_norm=10.0)
        found_inf = sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        ema.update(model)
        steps.append(
            {
                "c": c,
                "found_inf": bool(found_inf),
                "grad_norm": float(norm) if torch.isfinite(norm) else None,
                "scale": float(scaler.get_scale()),
                "growth_tracker": int(scaler.state_dict()["_growth_tracker"]),
                "p": [float(x) for x in p.detach().tolist()],
                "ema": [float(x) for x in ema.ema.p.detach().tolist()],
            }
        )
    out = {"torch": torch.__version__, "init": init, "growth_interval": 3, "steps": steps}
    with open(os.path.join(HERE, "grad_scaler.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"{len(steps)} steps, {sum(s['found_inf'] for s in steps)} skipped, final scale {steps[-1]['scale']}")


if __name__ == "__main__":
    main()
