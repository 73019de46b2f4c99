#!/usr/bin/env bash
# Data-parallel scaling on CPU ranks: the same training run as one process and as NPROC ranks under mpirun (the
# cores shared out between the ranks), back to back, REPEATS times each: YOLOv8n on coco128, imgsz IMGSZ, global
# batch BATCH, EPOCHS epochs, cache ram (one node cache for the ranks), validation after the last epoch only.
# Prints each run's training images/s (the run's images over its training seconds, from summary.json), then the
# median and range per setting and the ratio of the medians.
#
#   benches/ddp_scaling.sh [NPROC] [REPEATS]
#
# Needs `cargo build --release -p sluice-cli --features mpi` and Open MPI. Env: SLUICE (default
# target/release/sluice), EPOCHS (3), IMGSZ (320), BATCH (16); data from SLUICE_COCO128 (benches/locations.sh); runs
# under $BENCH_SCRATCH/ddp_scaling.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/locations.sh"
NPROC=${1:-2}
REPEATS=${2:-3}
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
EPOCHS=${EPOCHS:-3}
IMGSZ=${IMGSZ:-320}
BATCH=${BATCH:-16}
[ -x "$SLUICE" ] || { echo "no sluice binary at $SLUICE: cargo build --release -p sluice-cli --features mpi" >&2; exit 1; }
OUT=$BENCH_SCRATCH/ddp_scaling
rm -rf "$OUT"
mkdir -p "$OUT"

run() { # NAME EXTRA_ARGS...
  local name=$1
  shift
  "$SLUICE" train --data "$SLUICE_COCO128/data.yaml" --model yolov8n --epochs "$EPOCHS" --imgsz "$IMGSZ" \
    --batch "$BATCH" --cache ram --val-interval "$EPOCHS" --project "$OUT" --name "$name" "$@" \
    >"$OUT/$name.out" 2>"$OUT/$name.err"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{s['mean_images_per_s']:.2f}\")" \
    "$OUT/$name/summary.json"
}

declare -a one many
for r in $(seq 1 "$REPEATS"); do
  one+=("$(run "one_$r")")
  many+=("$(run "ranks_$r" --nproc "$NPROC")")
  echo "repeat $r: 1 process ${one[-1]} img/s, $NPROC ranks ${many[-1]} img/s"
done
python3 - "$NPROC" "${one[*]}" "${many[*]}" <<'PY'
import statistics, sys
n = sys.argv[1]
one = [float(v) for v in sys.argv[2].split()]
many = [float(v) for v in sys.argv[3].split()]
for name, v in (("1 process", one), (f"{n} ranks", many)):
    print(f"{name}: median {statistics.median(v):.2f} img/s, range {min(v):.2f}-{max(v):.2f} ({len(v)} runs)")
print(f"{n} ranks / 1 process: {statistics.median(many) / statistics.median(one):.3f}")
PY
