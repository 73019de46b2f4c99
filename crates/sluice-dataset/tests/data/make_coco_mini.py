"""Makes coco128-mini/instances_mini.json: the entries of the reference fixtures' eval/coco128train_gt.json (COCO
ground truth written from coco128's YOLO labels by the fixture generator m10_metrics_fixture.py) for the six
images of coco128-mini, with the crowd flag of coco128train_gt_crowd.json. Run from this folder:
    python3 make_coco_mini.py [FIXTURES_EVAL_DIR]
The folder defaults to $SLUICE_FIXTURES/eval, where SLUICE_FIXTURES defaults to $SLUICE_SHARED/fixtures and
SLUICE_SHARED to ../shared beside the repository (the same rule as sluice_testkit::locations).
"""

import json
import os
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", ".."))
SHARED = os.environ.get("SLUICE_SHARED") or os.path.join(REPO, "..", "shared")
FIXTURES = os.environ.get("SLUICE_FIXTURES") or os.path.join(SHARED, "fixtures")
src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(FIXTURES, "eval")
gt = json.load(open(f"{src}/coco128train_gt.json"))
crowd = {a["id"]: a["iscrowd"] for a in json.load(open(f"{src}/coco128train_gt_crowd.json"))["annotations"]}
keep = {250, 359, 472, 536, 562, 643}
out = {
    "images": [i for i in gt["images"] if i["id"] in keep],
    "annotations": [dict(a, iscrowd=crowd[a["id"]]) for a in gt["annotations"] if a["image_id"] in keep],
    "categories": gt["categories"],
}
json.dump(out, open("coco128-mini/instances_mini.json", "w"), indent=None, separators=(",", ":"))
print(len(out["images"]), "images", len(out["annotations"]), "annotations",
      sum(a["iscrowd"] for a in out["annotations"]), "crowd")
