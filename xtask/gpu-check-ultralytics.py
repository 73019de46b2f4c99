"""Ultralytics side of Sluice's device check: yolov8n from scratch, 640, batch 32, on the same data and epochs.

Usage: python3 ul_train.py DATA.yaml EPOCHS OUT.json
Writes the run's wall seconds, the per-epoch cumulative times from results.csv, training images/s (images per
epoch over the mean epoch time after the first) and the final metrics, then the wall time and images/s of a warm
`val` (batch 32) and of a streamed `predict` (batch 32) of its best.pt over the same images.
"""
import csv
import json
import os
import sys
import time

data, epochs, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = {"data": data, "epochs": epochs, "imgsz": 640, "batch": 32}
try:
    from ultralytics import YOLO
    import ultralytics

    result["ultralytics"] = ultralytics.__version__
    try:
        import polars  # noqa: F401
    except ImportError:
        # The device image has no polars (its wheel is too large to carry beside Sluice's binary), and the trainer
        # imports it in one place, to read results.csv back into the checkpoint's metadata. Read the same file
        # with the csv module instead, numbers as floats, as polars would infer them.
        from ultralytics.engine.trainer import BaseTrainer

        def read_results_csv(self):
            def num(v):
                try:
                    return float(v)
                except ValueError:
                    return v

            try:
                rows = list(csv.DictReader(open(self.csv)))
            except OSError:
                return {}
            return {k: [num(r[k]) for r in rows] for k in (rows[0] if rows else {})}

        BaseTrainer.read_results_csv = read_results_csv
        result["note"] = "polars missing: BaseTrainer.read_results_csv reads results.csv with the csv module"
    model = YOLO("yolov8n.yaml")
    project = os.path.join(os.path.dirname(out), "ultralytics_runs")
    t = time.perf_counter()
    r = model.train(data=data, epochs=epochs, imgsz=640, batch=32, device=0, workers=12, cache="ram", plots=False,
                    project=project, name="train", exist_ok=True, seed=0, amp=False, verbose=False)
    result["wall_s"] = time.perf_counter() - t
    result["map50"] = float(r.box.map50)
    result["map50_95"] = float(r.box.map)
    rows = list(csv.DictReader(open(os.path.join(project, "train", "results.csv"))))
    times = [float(row["time"]) for row in rows if "time" in row]
    result["epoch_cumulative_s"] = times
    n_images = len(os.listdir(os.path.join(os.path.dirname(data), "images", "train2017")))
    result["train_images"] = n_images
    if len(times) >= 2:
        per = (times[-1] - times[0]) / (len(times) - 1)
        result["epoch_s_after_first"] = per
        result["images_per_s_incl_val"] = n_images / per
    # Validation and prediction of its own best.pt, the peer figures of `sluice val` / `sluice predict` on the
    # device: one warm-up pass, then a timed one.
    best = YOLO(os.path.join(project, "train", "weights", "best.pt"))
    val_args = dict(data=data, imgsz=640, batch=32, device=0, plots=False, verbose=False, workers=12)
    best.val(**val_args)
    t = time.perf_counter()
    v = best.val(**val_args)
    result["val_wall_s"] = time.perf_counter() - t
    result["val_images_per_s"] = n_images / result["val_wall_s"]
    result["val_map50_95"] = float(v.box.map)
    source = os.path.join(os.path.dirname(data), "images", "train2017")
    t = time.perf_counter()
    n = sum(1 for _ in best.predict(source=source, imgsz=640, batch=32, device=0, stream=True, verbose=False))
    result["predict_wall_s"] = time.perf_counter() - t
    result["predict_images_per_s"] = n / result["predict_wall_s"]
except Exception as e:  # noqa: BLE001
    result["error"] = repr(e)
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result))
