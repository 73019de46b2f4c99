"""Ultralytics side of Sluice's device check: yolov8n from scratch, 640, batch 32, on the same data and epochs.

Usage: python3 ul_train.py DATA.yaml EPOCHS OUT.json
Writes the run's wall seconds, the per-epoch cumulative times from results.csv, training images/s (images per
epoch over the mean epoch time after the first) and the final metrics.
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
except Exception as e:  # noqa: BLE001
    result["error"] = repr(e)
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result))
