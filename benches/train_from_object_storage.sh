#!/usr/bin/env bash
# Training from an S3-compatible store against training from the same shards on local disk, back to back: coco128's
# train and val splits packed by `sluice pack`, uploaded to a moto server on loopback (PyPI's `moto[server]`), and
# `sluice train` run on a data YAML naming the local shards, then on one naming the objects (`s3://`), with the same
# settings and seed. The remote run copies each shard to local disk before its first epoch (the copy's line is
# printed); the store is then stopped while the run trains, which it finishes without it. A third run with the copies
# in place reads nothing but each object's metadata. Prints each run's wall time and epoch times and whether the
# local and remote runs' results.csv match (they should, to the digit, apart from the time column).
#
# Usage: benches/train_from_object_storage.sh
# Env:   SLUICE          a `sluice` built with the object-store feature (default: build it, release)
#        SLUICE_COCO128  coco128 (default $SLUICE_DATASETS/coco128, see benches/locations.sh)
#        EPOCHS, IMGSZ   training length and size (default 2 and 320)
#        BENCH_OUT       where runs, copies and logs go (default $BENCH_SCRATCH/object-storage)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/locations.sh"
DATA=$SLUICE_COCO128/data.yaml
EPOCHS=${EPOCHS:-2}
IMGSZ=${IMGSZ:-320}
OUT=${BENCH_OUT:-$BENCH_SCRATCH/object-storage}
[ -f "$DATA" ] || { echo "no $DATA (set SLUICE_COCO128 or SLUICE_DATASETS)" >&2; exit 1; }
python3 -c "import moto.server, boto3" || { echo "needs moto: pip install 'moto[server]'" >&2; exit 1; }
if [ -z "${SLUICE:-}" ]; then
  echo "== building sluice (release, feature object-store)"
  (cd "$ROOT" && cargo build --release -q -p sluice-cli --features object-store)
  SLUICE=${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice
fi
rm -rf "$OUT" && mkdir -p "$OUT"

upload() {  # the bucket and both shards, into the server at $PORT
  python3 - "$OUT" <<'EOF'
import sys, boto3
out = sys.argv[1]
s3 = boto3.client("s3")
s3.create_bucket(Bucket="bench")
for split in ("train", "val"):
    s3.upload_file(f"{out}/{split}.sluice", "bench", f"coco128/{split}.sluice")
EOF
}

PORT=$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=bench \
  AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
python3 -m moto.server -H 127.0.0.1 -p "$PORT" > "$OUT/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null || true' EXIT
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT))" 2>/dev/null; do sleep 0.2; done

for split in train val; do
  "$SLUICE" pack --data "$DATA" --split "$split" --out "$OUT/$split.sluice" > /dev/null
done
upload
names=$(sed -n '/^names:/,$p' "$DATA")
printf 'path: %s\ntrain: train.sluice\nval: val.sluice\n%s\n' "$OUT" "$names" > "$OUT/local.yaml"
printf 'path: s3://bench/coco128\ntrain: train.sluice\nval: val.sluice\n%s\n' "$names" > "$OUT/remote.yaml"

train() {  # train NAME YAML: one run, its stderr in $OUT/NAME.log, its wall time printed
  local name=$1 yaml=$2 t0
  t0=$(date +%s.%N)
  "$SLUICE" train --data "$yaml" --model yolov8n --epochs "$EPOCHS" --imgsz "$IMGSZ" --batch 16 --workers 2 \
    --project "$OUT/runs" --name "$name" --cache-dir "$OUT/copies" 2> "$OUT/$name.log" > /dev/null
  echo "$name: $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s wall; $(grep -h 'split: s3' "$OUT/$name.log" | tr '\n' ' ')"
}

echo "== local shards"
train local "$OUT/local.yaml"
echo "== the same shards from the store (stopped once both copies are made)"
( while ! grep -q 'val split: s3' "$OUT/remote.log" 2>/dev/null; do sleep 0.2; done; kill $MOTO ) &
train remote "$OUT/remote.yaml"
echo "== again, the store back up, the copies in place"
python3 -m moto.server -H 127.0.0.1 -p "$PORT" > "$OUT/moto2.log" 2>&1 &
MOTO=$!
until python3 -c "import socket; socket.create_connection(('127.0.0.1', $PORT))" 2>/dev/null; do sleep 0.2; done
upload
train again "$OUT/remote.yaml"

python3 - "$OUT" <<'EOF'
import csv, sys
out = sys.argv[1]
def rows(name):
    with open(f"{out}/runs/{name}/results.csv") as f:
        r = list(csv.reader(f))
    head = [h.strip() for h in r[0]]
    t = head.index("time")
    return [[c.strip() for i, c in enumerate(row) if i != t] for row in r[1:]], [float(row[t]) for row in r[1:]]
(local, lt), (remote, rt), (again, at) = rows("local"), rows("remote"), rows("again")
print("epoch times (s, cumulative as results.csv keeps them): local", lt, "remote", rt, "again", at)
print("results.csv without time: remote == local:", remote == local, "; again == local:", again == local)
EOF
