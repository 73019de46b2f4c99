#!/usr/bin/env bash
# Fine-tuning beside Ultralytics 8.4.190: both trainers start from the same weights (a Sluice checkpoint trained on
# the shapes set, converted to an Ultralytics `.pt` by crates/sluice-model/scripts/convert_weights.py) and fine-tune
# on another task, the generated signs set (`sluice data gen --preset signs`: four other classes, hexagon, diamond,
# arrow and half-disc, on striped and checked backgrounds, 200 train / 100 val images at 256 px). Both keep the
# source's class-branch width and start its last convolutions fresh ("Transferred 349/355 items"). EPOCHS (30) at
# IMGSZ (192), batch 16, cache ram, OPTIMIZER (`auto`, which both trainers resolve to AdamW at lr 0.00125 for a run
# this short with 4 classes), seeds 0..SEEDS-1, Ultralytics' defaults otherwise (close_mosaic 10). Prints each
# run's final mAP50 / mAP50-95 (each trainer's validation of its `best`), then the mean and standard deviation per
# trainer.
#
#   benches/finetune_vs_ultralytics.sh CHECKPOINT [SEEDS]
#
# CHECKPOINT: a Sluice training checkpoint (`runs/<name>/weights/best.safetensors`) of configs/models/yolov8-tiny.yaml,
#             e.g. from `sluice train --config configs/quick.yaml`.
# Env: PEERS_VENV (default ~/.cache/sluice-peers/venv), SLUICE (default target/release/sluice), THREADS (default 2),
#      EPOCHS (30), IMGSZ (192), OPTIMIZER (auto; any of Ultralytics' names), DATA (a data.yaml instead of the signs
#      set); runs under $BENCH_SCRATCH/finetune.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/locations.sh"
CKPT=${1:?usage: finetune_vs_ultralytics.sh CHECKPOINT [SEEDS]}
SEEDS=${2:-3}
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
THREADS=${THREADS:-2}
EPOCHS=${EPOCHS:-30}
IMGSZ=${IMGSZ:-192}
OPTIMIZER=${OPTIMIZER:-auto}
PY=$PEERS_VENV/bin/python
[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run the peers' setup.sh first" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "no sluice binary at $SLUICE: cargo build --release -p sluice-cli" >&2; exit 1; }
export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$(dirname "$PEERS_VENV")/ultralytics_cfg
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS RAYON_NUM_THREADS=$THREADS
OUT=$BENCH_SCRATCH/finetune
mkdir -p "$OUT"
if [ -z "${DATA:-}" ]; then
  "$SLUICE" data gen --preset signs --out "$OUT/signs" --unless-current >&2
  DATA=$OUT/signs/data.yaml
fi
echo "optimizer: $OPTIMIZER" >"$OUT/finetune.yaml"
export OPTIMIZER

"$PY" "$ROOT/crates/sluice-model/scripts/convert_weights.py" to-pt "$CKPT" "$OUT/start.pt" \
  --cfg "$ROOT/configs/models/yolov8-tiny.yaml" >&2
echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); start: $CKPT"
for s in $(seq 0 $((SEEDS - 1))); do
  "$PY" "$ROOT/benches/ul_finetune.py" "$OUT/start.pt" "$DATA" "$s" "$OUT/ul" "$EPOCHS" "$IMGSZ" 2>"$OUT/ul-s$s.err" |
    grep '"map50"' | sed 's/^/ultralytics /'
  t0=$(date +%s.%N)
  "$SLUICE" train --config "$OUT/finetune.yaml" --data "$DATA" --model "$ROOT/configs/models/yolov8-tiny.yaml" --weights "$CKPT" \
    --epochs "$EPOCHS" --imgsz "$IMGSZ" --batch 16 --cache ram --seed "$s" --project "$OUT/sluice" --name "ft-s$s" \
    --exist-ok --json >"$OUT/sluice-s$s.json" 2>"$OUT/sluice-s$s.err"
  wall=$(echo "$(date +%s.%N) - $t0" | bc -l)
  "$PY" - "$OUT/sluice-s$s.json" "$s" "$wall" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
v = r["best_metrics"]
print("sluice " + json.dumps({"seed": int(sys.argv[2]), "wall_s": float(sys.argv[3]), "map50": v["map50"], "map": v["map50_95"]}))
PYEOF
done | tee "$OUT/summary.txt"
"$PY" - "$OUT/summary.txt" <<'PYEOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    who, _, js = line.partition(" ")
    rows.setdefault(who, []).append(json.loads(js))
for who, rs in rows.items():
    for k in ("map50", "map"):
        v = [r[k] for r in rs]
        sd = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"{who:12s} {k:6s} mean {statistics.mean(v):.4f} sd {sd:.4f} over {len(v)} seeds")
PYEOF
