#!/usr/bin/env python3
"""The step-cost ledgers turned into predicted step times, checked against the device runs we have.

A training step's time is modelled as

    t = bytes moved / BW + kernel launches * c

with one effective memory bandwidth BW and one cost per launch c for the whole step. The two are fitted to Sluice's
two measured steps on an H200 (docs/gpu-results.md, 640, batch 32, f32): BatchNorm+SiLU composed from candle's ops
(224-230 ms) and fused (84-109 ms), using the ledgers of those two variants (`sluice bench step-cost` and
`--composed-batch-norm`). The fitted model then predicts Ultralytics' step from PyTorch's ledger
(benches/step_cost_pytorch.py), which was measured at about 40-60 ms on the same machine: a prediction within about
30 % of that is the check. Standard library only.

    python3 benches/step_cost_model.py docs/step-cost/37cd43a

reads `sluice_yolov8n_640_b32_f32_sgd.json` and `sluice_yolov8n_640_b32_f32_sgd_composed_bn.json` from the folder,
`pytorch_yolov8n_640_b32_f32_sgd.json` from the folder or its parent, and prints the fit and the predictions
(`--json` for one object). A further Sluice ledger (`--also FILE`) is priced with the same fit.
"""

import json
import os
import sys

# Measured steady steps (ms): low, high. docs/gpu-results.md, "Training (runs 2, 6 and 7)".
MEASURED = {
    "composed_bn": (224.0, 230.0),
    "fused_bn": (84.0, 109.0),
    "ultralytics": (40.0, 60.0),
}


def train_totals(path):
    doc = json.load(open(path))
    t = doc["train_total"]
    return t["bytes_read"] + t["bytes_written"], t["launches"]


def peer_path(folder):
    name = "pytorch_yolov8n_640_b32_f32_sgd.json"
    here = os.path.join(folder, name)
    return here if os.path.exists(here) else os.path.join(os.path.dirname(os.path.normpath(folder)), name)


def main():
    also = [sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--also"]
    args = [a for i, a in enumerate(sys.argv[1:]) if not a.startswith("--") and sys.argv[i] != "--also"]
    folder = args[0] if args else "docs/step-cost"
    as_json = "--json" in sys.argv
    ledgers = {
        "composed_bn": train_totals(os.path.join(folder, "sluice_yolov8n_640_b32_f32_sgd_composed_bn.json")),
        "fused_bn": train_totals(os.path.join(folder, "sluice_yolov8n_640_b32_f32_sgd.json")),
        "ultralytics": train_totals(peer_path(folder)),
    }
    mid = {k: (lo + hi) / 2 for k, (lo, hi) in MEASURED.items()}
    # Two equations, two unknowns (1/BW in ms per byte, c in ms per launch), from Sluice's two runs.
    (b1, l1), (b2, l2) = ledgers["composed_bn"], ledgers["fused_bn"]
    t1, t2 = mid["composed_bn"], mid["fused_bn"]
    det = b1 * l2 - b2 * l1
    inv_bw = (t1 * l2 - t2 * l1) / det
    c = (b1 * t2 - b2 * t1) / det
    rows = []
    for path in also:
        ledgers[os.path.basename(path)] = train_totals(path)
    for name, (b, l) in ledgers.items():
        pred = b * inv_bw + l * c
        lo, hi = MEASURED.get(name, (None, None))
        rows.append(
            {
                "step": name,
                "bytes_gb": b / 1e9,
                "launches": l,
                "predicted_ms": pred,
                "measured_ms": [lo, hi],
                "error_vs_mid": pred / mid[name] - 1 if name in mid else None,
                "memory_ms": b * inv_bw,
                "launch_ms": l * c,
            }
        )
    fit = {"bandwidth_gb_s": (1 / inv_bw) / 1e6 if inv_bw > 0 else None, "launch_us": c * 1e3}
    if as_json:
        print(json.dumps({"fit": fit, "rows": rows}, indent=1))
        return
    bw = f"{fit['bandwidth_gb_s']:.0f} GB/s" if fit["bandwidth_gb_s"] else "not positive"
    print(f"fit on Sluice's two runs: effective bandwidth {bw}, {fit['launch_us']:.1f} us per launch")
    print(f"{'step':<12} {'GB moved':>9} {'launches':>9} {'memory ms':>10} {'launch ms':>10} {'predicted':>10} {'measured':>10} {'error':>7}")
    for r in rows:
        m = f"{r['measured_ms'][0]:.0f}-{r['measured_ms'][1]:.0f}" if r["measured_ms"][0] else "-"
        err = f"{r['error_vs_mid']:>+7.0%}" if r["error_vs_mid"] is not None else f"{'-':>7}"
        print(
            f"{r['step']:<12} {r['bytes_gb']:>9.1f} {r['launches']:>9} {r['memory_ms']:>10.1f} {r['launch_ms']:>10.1f} "
            f"{r['predicted_ms']:>10.1f} {m:>10} {err}"
        )


if __name__ == "__main__":
    main()
