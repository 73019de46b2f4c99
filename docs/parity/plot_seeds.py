"""Per-epoch mAP50-95 of Sluice and Ultralytics over several seeds of one config: one plot (mean and min-max band of
each) and a Markdown table of the final validation of `best` per seed, with the means, standard deviations, the pooled
standard deviation and the check "Sluice's mean >= Ultralytics' mean - one pooled sd", then per span of epochs the
mean difference of the curves, the seeds' spread per epoch and each curve's jitter from one epoch to the next.

Usage (matplotlib and numpy, e.g. the peers' venv of ../shared/peers/setup.sh):
    python docs/parity/plot_seeds.py --sluice RUNS/sluice --ultralytics RUNS/ul --seeds 0 1 2 --out docs/parity/seeds.png \
        [--title "configs/quick.yaml"]
where RUNS/sluice/s<seed>/ holds a `sluice train --config configs/quick.yaml --seed <seed> --name s<seed> --json` run
with its JSON summary in RUNS/sluice-s<seed>.json, and RUNS/ul/s<seed>/ a run of ../shared/peers/m15_ul_quick.py with
its JSON line in RUNS/ul-s<seed>.json (its figures are Ultralytics' final validation of best.pt).
"""
import argparse
import csv
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def curve(path, metric="metrics/mAP50-95(B)"):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    key = next(k for k in rows[0] if k.strip() == metric)
    return np.array([float(r[key]) for r in rows])


def spans(a, edges):
    """Per span of epochs: the mean paired difference Sluice - Ultralytics, the seeds' standard deviation per epoch
    (averaged over the span) of each and their ratio, and each curve's jitter from one epoch to the next (the sd of
    its second differences, which removes the trend), averaged over the seeds."""
    for metric in ("metrics/mAP50(B)", "metrics/mAP50-95(B)"):
        c = {}
        for name, root in (("s", a.sluice), ("u", a.ultralytics)):
            cs = [curve(os.path.join(root, f"s{s}", "results.csv"), metric) for s in a.seeds]
            n = min(len(x) for x in cs)
            c[name] = np.stack([x[:n] for x in cs])
        n = min(c["s"].shape[1], c["u"].shape[1])
        print(f"\n{metric.split('/')[1][:-3]} per span of epochs: mean difference, seeds' sd per epoch (Sluice, "
              "Ultralytics, ratio), epoch-to-epoch jitter (Sluice, Ultralytics)")
        for lo, hi in zip(edges[:-1], edges[1:]):
            hi = min(hi, n)
            s, u = c["s"][:, lo:hi], c["u"][:, lo:hi]
            sd_s, sd_u = s.std(0, ddof=1).mean(), u.std(0, ddof=1).mean()
            lo2, hi2 = max(lo, 1), min(hi, n - 1)

            def jitter(x):
                return np.mean([np.std(r[lo2:hi2] - (r[lo2 - 1 : hi2 - 1] + r[lo2 + 1 : hi2 + 1]) / 2) for r in x])

            print(f"  epochs {lo + 1}-{hi}: {(s - u).mean():+.4f}; {sd_s:.4f} {sd_u:.4f} {sd_u / sd_s:.2f}; "
                  f"{jitter(c['s']):.4f} {jitter(c['u']):.4f}")


def final(kind, root, seed):
    with open(os.path.join(os.path.dirname(root), f"{os.path.basename(root)}-s{seed}.json")) as f:
        d = json.loads(f.read().strip().splitlines()[-1])
    if kind == "sluice":
        return d["best_metrics"]["map50"], d["best_metrics"]["map50_95"], d["best_epoch"], d["wall_s"]
    return d["map50"], d["map"], None, d["wall_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", required=True)
    ap.add_argument("--ultralytics", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="configs/quick.yaml")
    ap.add_argument("--spans", type=int, nargs="+", default=[20, 40, 60, 80, 90],
                    help="epoch edges of the spans the per-epoch comparison is reported over")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    finals = {}
    for name, root, colour in (("Ultralytics 8.4.190", a.ultralytics, "tab:blue"), ("Sluice", a.sluice, "tab:orange")):
        curves = [curve(os.path.join(root, f"s{s}", "results.csv")) for s in a.seeds]
        n = min(len(c) for c in curves)
        c = np.stack([c[:n] for c in curves])
        x = np.arange(1, n + 1)
        ax.plot(x, c.mean(0), color=colour, label=f"{name} (mean of {len(a.seeds)} seeds)")
        ax.fill_between(x, c.min(0), c.max(0), color=colour, alpha=0.25, linewidth=0)
        kind = "sluice" if root == a.sluice else "ul"
        finals[name] = [final(kind, root, s) for s in a.seeds]
    ax.set_xlabel("epoch")
    ax.set_ylabel("mAP50-95 (val, EMA weights)")
    ax.set_title(f"{a.title}: per-epoch mAP50-95 (min-max band)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(a.out)
    print("| trainer | " + " | ".join(f"seed {s}: mAP50 / mAP50-95" for s in a.seeds) + " | mean mAP50 / mAP50-95 | sd |")
    print("|---|" + "---|" * (len(a.seeds) + 2))
    stats = {}
    for name, rows in finals.items():
        m50 = np.array([r[0] for r in rows])
        m95 = np.array([r[1] for r in rows])
        stats[name] = (m50, m95)
        cells = " | ".join(f"{r[0]:.3f} / {r[1]:.3f}" for r in rows)
        print(f"| {name} | {cells} | {m50.mean():.3f} / {m95.mean():.3f} | {m50.std(ddof=1):.3f} / {m95.std(ddof=1):.3f} |")
    (u50, u95), (s50, s95) = stats["Ultralytics 8.4.190"], stats["Sluice"]
    for label, u, s in (("mAP50", u50, s50), ("mAP50-95", u95, s95)):
        pooled = np.sqrt((u.var(ddof=1) + s.var(ddof=1)) / 2)
        print(f"\n{label}: Sluice mean {s.mean():.4f}, Ultralytics mean {u.mean():.4f}, pooled sd {pooled:.4f}: "
              f"Sluice >= Ultralytics - pooled sd: {s.mean() >= u.mean() - pooled}; above Ultralytics' mean: "
              f"{s.mean() > u.mean()}")
    spans(a, a.spans)


if __name__ == "__main__":
    main()
