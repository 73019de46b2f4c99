"""PyTorch side of `gpu convs` (sluice-infer's device-check test): the same layers, repetitions and samples with torch.nn.functional.conv2d.

Usage: python3 convs_torch.py SLUICE_CONVS.json OUT.json
Reads the shapes, dtypes, repetition and sample counts Sluice's run wrote, times the same forward and training pass
(`y = conv2d(x, w, stride, pad)`, then `(y * r).sum().backward()`) the same way (host clock around
torch.cuda.synchronize, the two passes interleaved), once with cuDNN's heuristics (torch.backends.cudnn.benchmark
off, PyTorch's default and what Sluice does) and once with benchmark on (cuDNN times every algorithm once per
shape, as Ultralytics' trainer asks for), and prints each layer's PyTorch / Sluice ratios.
"""
import json
import statistics
import sys
import time

src, out = sys.argv[1], sys.argv[2]
result = {"source": src}
try:
    import torch
    import torch.nn.functional as F

    sl = json.load(open(src))
    samples = sl["samples"]
    dev = torch.device("cuda:0")
    result.update(torch=torch.__version__, cudnn=torch.backends.cudnn.version(), gpu=torch.cuda.get_device_name(0),
                  allow_tf32=torch.backends.cudnn.allow_tf32)
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16}

    def per_rep(reps, f):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps * 1e3

    def spread(v):
        return {"median": statistics.median(v), "min": min(v), "max": max(v)}

    rows = []
    for benchmark in (False, True):
        torch.backends.cudnn.benchmark = benchmark
        for row in sl["rows"]:
            n, c, h, w, o, k, s, p = row["geom"]
            dt = dtypes[row["dtype"]]
            ho = (h + 2 * p - k) // s + 1
            x = torch.randn(n, c, h, w, device=dev).to(dt).requires_grad_(row["input_grad"])
            wt = torch.randn(o, c, k, k, device=dev).mul(0.1).to(dt).requires_grad_(True)
            r = torch.randn(n, o, ho, ho, device=dev).to(dt)
            yv = torch.randn(n, o, ho, ho, device=dev).to(dt).requires_grad_(True)

            def loss():
                yv.grad = None
                (yv * r).sum().backward()

            def fwd():
                with torch.no_grad():
                    F.conv2d(x, wt, stride=s, padding=p)

            def fwdbwd():
                x.grad = None
                wt.grad = None
                (F.conv2d(x, wt, stride=s, padding=p) * r).sum().backward()

            for _ in range(3):
                fwd()
                fwdbwd()
            reps = row["reps"]
            f, fb, ls = [], [], []
            for i in range(samples):
                ls.append(per_rep(reps, loss))
                order = [(fwd, f), (fwdbwd, fb)]
                for fn, acc in order[i % 2:] + order[: i % 2]:
                    acc.append(per_rep(reps, fn))
            entry = {"layer": row["layer"], "dtype": row["dtype"], "geom": row["geom"], "benchmark": benchmark,
                     "reps": reps, "fwd_ms": spread(f), "fwdbwd_ms": spread(fb),
                     "bwd_ms": statistics.median([a - b for a, b in zip(fb, f)]), "loss_ms": spread(ls),
                     "conv_bwd_ms": statistics.median([a - b - c for a, b, c in zip(fb, f, ls)])}
            ours = row.get("sluice")
            if ours:
                entry["torch_over_sluice_fwd"] = entry["fwd_ms"]["median"] / ours["fwd_ms"]["median"]
                entry["torch_over_sluice_fwdbwd"] = entry["fwdbwd_ms"]["median"] / ours["fwdbwd_ms"]["median"]
                entry["torch_over_sluice_conv_bwd"] = entry["conv_bwd_ms"] / ours["conv_bwd_ms"]
            rows.append(entry)
            print(f'{row["layer"]:<20} {row["dtype"]:<5} bench={int(benchmark)} torch fwd {entry["fwd_ms"]["median"]:.3f} '
                  f'f+b {entry["fwdbwd_ms"]["median"]:.3f} ms; torch/sluice fwd '
                  f'{entry.get("torch_over_sluice_fwd", float("nan")):.2f} f+b '
                  f'{entry.get("torch_over_sluice_fwdbwd", float("nan")):.2f} conv bwd '
                  f'{entry.get("torch_over_sluice_conv_bwd", float("nan")):.2f}; loss {entry["loss_ms"]["median"]:.3f} '
                  f'(Sluice/candle {row["loss_ms"]["median"]:.3f})', flush=True)
            del x, wt, r, yv
    result["rows"] = rows
except Exception as e:  # noqa: BLE001
    result["error"] = repr(e)
    print(result["error"])
json.dump(result, open(out, "w"), indent=1)
