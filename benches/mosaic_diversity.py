"""Which images meet in a mosaic over a run: two loaders' draws side by side, with the values independent uniform
draws give.

Reads JSON lines with `epoch`, `id` and `mosaic` (the mosaic's images, the sample's own first; null or absent when
mosaic is off): `sluice data draws` writes them for Sluice, `benches/ul_mosaic_draws.py` for Ultralytics. Only the
epochs with mosaic count. Prints one markdown table.

Usage: python3 benches/mosaic_diversity.py NAME=FILE [NAME=FILE ...]
"""

import json
import statistics
import sys
from collections import Counter, defaultdict


def load(path):
    """{epoch: {id: [partners]}} over the epochs with mosaic."""
    epochs = defaultdict(dict)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("mosaic"):
                epochs[r["epoch"]][r["id"]] = r["mosaic"][1:]
    return dict(sorted(epochs.items()))


def corr(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx and syy else float("nan")


def stats(epochs):
    ids = sorted({i for e in epochs.values() for i in e})
    n, e_count = len(ids), len(epochs)
    k = len(next(iter(next(iter(epochs.values())).values())))
    counts = []  # per epoch: partner appearances per image
    distinct = []
    self_picks = repeats_next = 0
    for e, draws in epochs.items():
        c = Counter(p for ps in draws.values() for p in ps)
        counts.append([c.get(i, 0) for i in ids])
        distinct.append(len(c))
        self_picks += sum(p == i for i, ps in draws.items() for p in ps)
    order = list(epochs)
    for a, b in zip(order, order[1:]):
        repeats_next += sum(len(set(epochs[a][i]) & set(epochs[b][i])) for i in epochs[a] if i in epochs[b])
    flat = [x for row in counts for x in row]
    lag = [corr(counts[t], counts[t + 1]) for t in range(e_count - 1)]
    pairs = Counter()
    partners_of = defaultdict(set)
    for draws in epochs.values():
        for i, ps in draws.items():
            tiles = [i] + ps
            for x in range(len(tiles)):
                for y in range(x + 1, len(tiles)):
                    if tiles[x] != tiles[y]:
                        pairs[frozenset((tiles[x], tiles[y]))] += 1
            partners_of[i].update(ps)
    total = sum(pairs.values())
    return {
        "images": n,
        "mosaic epochs": e_count,
        "partner draws per image and epoch: mean": statistics.fmean(flat),
        "partner draws per image and epoch: variance": statistics.pvariance(flat),
        "images drawn as partners per epoch: mean": statistics.fmean(distinct),
        "images drawn as partners per epoch: sd": statistics.pstdev(distinct),
        "an image's partner count, epoch t against t+1: correlation": statistics.fmean(lag),
        "partners shared with the image's mosaic of the next epoch: per image and epoch": repeats_next
        / (n * (e_count - 1)),
        "partners that are the image itself: share": self_picks / (n * e_count * k),
        "distinct partners of an image over the run: mean": statistics.fmean(len(partners_of[i]) for i in ids),
        "image pairs that meet: distinct share of meetings": len(pairs) / total,
        "image pairs that meet: most meetings of one pair": max(pairs.values()),
    }


def expected(n, e, k=3):
    """The same under independent uniform draws of k partners (self included) per mosaic."""
    p = 1 / n
    drawn = n * k
    return {
        "partner draws per image and epoch: mean": drawn * p,
        "partner draws per image and epoch: variance": drawn * p * (1 - p),
        "images drawn as partners per epoch: mean": n * (1 - (1 - p) ** drawn),
        "an image's partner count, epoch t against t+1: correlation": 0.0,
        "partners shared with the image's mosaic of the next epoch: per image and epoch": k * k * p,
        "partners that are the image itself: share": p,
        "distinct partners of an image over the run: mean": n * (1 - (1 - p) ** (k * e)),
    }


def main():
    runs = [arg.split("=", 1) for arg in sys.argv[1:]]
    results = [(name, stats(load(path))) for name, path in runs]
    n, e = results[0][1]["images"], results[0][1]["mosaic epochs"]
    exp = expected(n, e)
    names = [name for name, _ in results]
    print("| | " + " | ".join(names) + " | independent uniform draws |")
    print("|---|" + "---|" * (len(names) + 1))
    for key in results[0][1]:
        row = [r[key] for _, r in results]
        fmt = (lambda v: f"{v:.4g}") if any(isinstance(v, float) for v in row) else str
        want = exp.get(key)
        print(f"| {key} | " + " | ".join(fmt(v) for v in row) + f" | {'' if want is None else f'{want:.4g}'} |")


if __name__ == "__main__":
    main()
