"""Ultralytics side of the device check's training matrix: yolov8n from scratch at 640 on the same data, epochs and
batch as the Sluice run beside it, in f32 (`amp=False`) or with its default AMP (float16 autocast, GradScaler).

Usage: python3 ul_matrix.py DATA.yaml PRECISION BATCH EPOCHS OUT.json   (PRECISION: f32 or amp)
Writes, per epoch, the median, shortest and longest interval between consecutive batch ends (the
`on_train_batch_end` callback; the same definition as Sluice's `step_interval_ms`), the images/s of the median
step, and the run's peak reserved and allocated device memory.

The device has no network, and Ultralytics' AMP check downloads a model to compare fp16 with fp32 outputs; it is
replaced by `True` here (the check only guards against GPUs whose fp16 is broken).
"""
import json
import os
import sys
import time

data, precision, batch, epochs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
# UL_DEVICE / UL_IMGSZ: a dry run of this script on a CPU machine (the device check uses the defaults).
device, imgsz = os.environ.get("UL_DEVICE", "0"), int(os.environ.get("UL_IMGSZ", "640"))
result = {"data": data, "precision": precision, "batch": batch, "epochs": epochs, "imgsz": imgsz, "device": device}
try:
    import torch
    import ultralytics
    from ultralytics import YOLO
    import ultralytics.engine.trainer as trainer_module

    trainer_module.check_amp = lambda model: True
    result["ultralytics"] = ultralytics.__version__
    ends = []
    model = YOLO("yolov8n.yaml")
    model.add_callback("on_train_epoch_start", lambda t: ends.append((t.epoch, time.perf_counter(), "start")))
    model.add_callback("on_train_batch_end", lambda t: ends.append((t.epoch, time.perf_counter(), "batch")))
    project = os.path.join(os.path.dirname(out), "ultralytics_matrix")
    name = f"{precision}_b{batch}"
    cuda = torch.cuda.is_available() and device != "cpu"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model.train(data=data, epochs=epochs, imgsz=imgsz, batch=batch, device=device, workers=12, cache="ram", plots=False,
                project=project, name=name, exist_ok=True, seed=0, amp=precision == "amp", val=False, verbose=False)
    result["wall_s"] = time.perf_counter() - t
    if cuda:
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    per_epoch = []
    for e in range(epochs):
        ts = [x[1] for x in ends if x[0] == e]
        gaps = sorted(b - a for a, b in zip(ts, ts[1:]))
        if not gaps:
            continue
        n = len(gaps)
        median = gaps[n // 2] if n % 2 else (gaps[n // 2 - 1] + gaps[n // 2]) / 2
        per_epoch.append({"epoch": e + 1, "median_ms": median * 1e3, "min_ms": gaps[0] * 1e3,
                          "max_ms": gaps[-1] * 1e3, "steps": n, "images_per_s_at_median": batch / median})
    result["step_interval"] = per_epoch
except Exception as e:  # noqa: BLE001
    result["error"] = repr(e)
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result))
