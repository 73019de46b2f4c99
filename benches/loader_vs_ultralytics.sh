#!/usr/bin/env bash
# Sluice's loaders against Ultralytics 8.4's on coco128, back to back on one machine, with the same settings:
# the train split (128 images), batch 16, 2 workers, Ultralytics' default augmentation (mosaic on), and for the
# validation loader rect batches at 640. For each case it runs the peer script first (Ultralytics' own protocol,
# see $PEERS_DIR/m1_train_loader.py and m2_val_loader.py), then `sluice bench loader`, and prints every
# figure with the ratio sluice / peer (above 1: sluice is faster). Run it on a quiet machine: the peers wait for
# one (PEERS_MAX_WAIT_S), sluice does not, and nothing else should run meanwhile.
#
# Usage: benches/loader_vs_ultralytics.sh [case ...]      cases: train640 train320 val640 disk640
#                                                          (default: train640 train320 val640)
# Env:   PEERS_VENV       the peers' venv (default ~/.cache/sluice-peers/venv; made by $PEERS_DIR/setup.sh)
#        SLUICE_SHARED    the shared folder (default ../shared beside the repository; see benches/locations.sh)
#        PEERS_DIR        the peer scripts (default $SLUICE_SHARED/peers)
#        SLUICE_COCO128   coco128 (default $SLUICE_DATASETS/coco128, SLUICE_DATASETS default $SLUICE_SHARED/datasets)
#        SLUICE           a prebuilt `sluice` binary (default: `cargo build --release` of the package that
#                         holds it, then use it)
#        EPOCHS           epochs of sluice's warm run: 1 cold + EPOCHS-1 warm (default 15, as the peer's
#                         warm-up + drain + 7 windows of 2 epochs)
#        COLD_REPEATS     fresh-loader runs of 2 epochs for sluice's cold figure, median (default 5, as the peer)
#        PEERS_REPEATS    passed to the peer scripts (their windows / cold repeats; default 7 / 5)
#        BENCH_OUT        where the JSON of every run and the peers' results (PEERS_OUT) go
#                         (default $BENCH_SCRATCH/loader; the peers' results file is reset on every run)
#
# What the figures mean (both sides):
#   warm  images/s after the first epoch. Ultralytics' workers keep every coco128 image decoded in their mosaic
#         buffer (max_buffer_length = min(n, 8 * batch, 1000) = 128), so its warm figure measures augmentation and
#         collate, not decoding: the like-for-like sluice figure is --cache ram. The sluice --cache none line
#         (decoding again every epoch) is printed for reference against the same peer figure.
#   cold  images/s of a fresh loader's first two epochs, thread/worker start-up included (the peer's definition),
#         median over repeats; sluice's first epoch alone (cold_images_per_s) is printed too.
#   val   Ultralytics' validation dataset does not buffer images (it decodes every pass): sluice --cache none.
#   disk  (case disk640) both sides with cache=disk, warm (the file built in a first run of each, not timed), beside
#         sluice's --cache ram and --cache none; sluice's anonymous resident memory (RssAnon) after the last epoch
#         of each cache mode is printed below the table (a disk cache's pages are file-backed page cache).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
. "$ROOT/benches/locations.sh"
DATA=$SLUICE_COCO128/data.yaml
EPOCHS=${EPOCHS:-15}
COLD_REPEATS=${COLD_REPEATS:-5}
OUT=${BENCH_OUT:-$BENCH_SCRATCH/loader}
CASES=${*:-train640 train320 val640}
PY=$PEERS_VENV/bin/python

[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run $PEERS_DIR/setup.sh first" >&2; exit 1; }
[ -f "$PEERS_DIR/m1_train_loader.py" ] || { echo "no peer scripts in $PEERS_DIR (set PEERS_DIR)" >&2; exit 1; }
[ -f "$DATA" ] || { echo "no $DATA (set SLUICE_COCO128 or SLUICE_DATASETS)" >&2; exit 1; }
for c in $CASES; do
  case $c in train640|train320|val640|disk640) ;; *) echo "unknown case $c (train640 train320 val640 disk640)" >&2; exit 1 ;; esac
done

# The peers' environment, as $PEERS_DIR/run_all.sh sets it.
. "$ROOT/benches/common.sh"

peer() {  # peer NAME script args...: runs a peer script, its log in $OUT/NAME.log
  local name=$1; shift
  echo "== peer $name: python $* ($(date +%T), load $(load))"
  if ! (cd "$PEERS_DIR" && "$PY" "$@") > "$OUT/$name.log" 2>&1; then
    echo "!! peer $name failed, see $OUT/$name.log (its ratios print as nan)" >&2; tail -5 "$OUT/$name.log" >&2
    return 0
  fi
  grep '^FIGURE' "$OUT/$name.log" || true
}

ours() {  # ours NAME args...: one `sluice bench loader --json` run into $OUT/NAME.json
  local name=$1; shift
  echo "== sluice $name: bench loader $* ($(date +%T), load $(load))"
  "$SLUICE" bench loader --data "$DATA" --batch 16 --workers 2 "$@" --json > "$OUT/$name.json"
}

ours_cold() {  # ours_cold NAME args...: COLD_REPEATS fresh 2-epoch runs into $OUT/NAME.cold<i>.json
  local name=$1; shift
  for i in $(seq 1 "$COLD_REPEATS"); do ours "$name.cold$i" "$@" --epochs 2 > /dev/null; done
  echo "   $COLD_REPEATS cold runs: $OUT/$name.cold*.json"
}

# Prints the figure lines of one case: LABEL PEER_FIGURE_NAME SLUICE_JSON_GLOB SLUICE_KEY (median over the files).
ROWS=$OUT/rows.tsv
: > "$ROWS"
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$ROWS"; }

for c in $CASES; do
  case $c in
    train640|train320)
      sz=${c#train}
      peer "m1_train_loader_$sz" m1_train_loader.py "$sz"
      ours "train$sz.ram" --mode train --imgsz "$sz" --cache ram --epochs "$EPOCHS"
      ours "train$sz.none" --mode train --imgsz "$sz" --cache none --epochs "$EPOCHS"
      ours_cold "train$sz.ram" --mode train --imgsz "$sz" --cache ram
      row "train $sz warm (sluice cache ram)" "train_loader.imgsz$sz.images_per_s" "train$sz.ram.json" warm_images_per_s
      row "train $sz warm (sluice cache none)" "train_loader.imgsz$sz.images_per_s" "train$sz.none.json" warm_images_per_s
      row "train $sz cold, 2 epochs" "train_loader.imgsz$sz.cold2epochs_incl_worker_start.images_per_s" \
        "train$sz.ram.cold*.json" cold_two_epochs_images_per_s
      row "train $sz cold, sluice epoch 1 only" "-" "train$sz.ram.cold*.json" cold_images_per_s
      ;;
    disk640)
      # Ultralytics writes its .npy files beside the images (of the peers' copy of the dataset) on the first run;
      # the timed run finds them.
      (cd "$PEERS_DIR" && PEERS_REPEATS=1 "$PY" m1_train_loader.py 640 disk) > "$OUT/m1_disk_build.log" 2>&1 || true
      peer m1_train_loader_640_disk m1_train_loader.py 640 disk
      ours disk640.build --mode train --imgsz 640 --cache disk --epochs 2 > /dev/null
      ours disk640.disk --mode train --imgsz 640 --cache disk --epochs "$EPOCHS"
      ours disk640.ram --mode train --imgsz 640 --cache ram --epochs "$EPOCHS"
      ours disk640.none --mode train --imgsz 640 --cache none --epochs "$EPOCHS"
      row "train 640 warm, cache disk" "train_loader.imgsz640.cache_disk.images_per_s" disk640.disk.json warm_images_per_s
      row "train 640 warm, sluice cache ram" "train_loader.imgsz640.cache_disk.images_per_s" disk640.ram.json warm_images_per_s
      row "train 640 warm, sluice cache none" "train_loader.imgsz640.cache_disk.images_per_s" disk640.none.json warm_images_per_s
      ;;
    val640)
      peer m2_val_loader_640 m2_val_loader.py 640
      ours val640.none --mode val --imgsz 640 --cache none --epochs "$EPOCHS"
      row "val 640 rect (sluice cache none)" "val_loader.imgsz640.rect.images_per_s" val640.none.json warm_images_per_s
      ;;
  esac
done

echo "==== sluice / Ultralytics (images/s; results in $OUT)"
"$PY" - "$OUT" "$PEERS_OUT" "$ROWS" <<'EOF'
import glob, json, os, statistics, sys

out, peers_out, rows = sys.argv[1:4]
peer = {}
for line in open(peers_out):
    if line.strip():
        rec = json.loads(line)
        peer[rec["name"]] = rec["value"]  # the last figure of a name wins
print(f"{'figure':<38} {'peer':>9} {'sluice':>9} {'ratio':>7}  sluice bottleneck")
for line in open(rows):
    label, peer_name, pattern, key = line.rstrip("\n").split("\t")
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(out, pattern)))]
    ours = statistics.median(r[key] for r in runs) if runs else float("nan")
    p = peer.get(peer_name, float("nan")) if peer_name != "-" else float("nan")
    ratio = f"{ours / p:7.2f}" if p == p and p > 0 else "      -"
    phase = "cold_telemetry" if key.startswith("cold") else "warm_telemetry"
    bottleneck = runs[-1][phase]["bottleneck"] if runs else ""
    print(f"{label:<38} {p:9.1f} {ours:9.1f} {ratio}  {bottleneck}")
rss = {m: json.load(open(f)).get("rss_anon_bytes") for m in ("disk", "ram", "none")
       for f in [os.path.join(out, f"disk640.{m}.json")] if os.path.exists(f)}
if rss.get("none"):
    print("sluice RssAnon after the last epoch (MB): " + ", ".join(
        f"cache {m} {b / 1e6:.1f} ({b / rss['none']:.2f}x none)" for m, b in rss.items() if b))
EOF
