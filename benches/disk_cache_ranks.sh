#!/usr/bin/env bash
# One `cache: disk` file shared by the ranks of a machine: the anonymous resident memory (RssAnon) of each rank of a
# two-rank run (`--nproc 2`, CPU ranks under mpirun, global batch 16: 8 per rank) beside a single process's at batch
# 16 and at batch 8 (a rank's share), training YOLOv8n on coco128 at IMGSZ for EPOCHS epochs. The decoded images live
# in the mapped file (page cache, shared), so each rank's RssAnon should be about the batch-8 process's. Each run starts with an empty cache folder, so the two-rank run
# also shows the file built once (rank 0's "decoded ... images into" lines, and one file per split).
#
#   benches/disk_cache_ranks.sh
#
# Needs `cargo build --release -p sluice-cli --features mpi` and Open MPI. Env: SLUICE (default
# target/release/sluice), EPOCHS (2), IMGSZ (640); data from SLUICE_COCO128 (benches/locations.sh); runs under
# $BENCH_SCRATCH/disk_cache_ranks. Prints each process's peak RssAnon (sampled every 0.2 s) and the run's wall time.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/locations.sh"
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
EPOCHS=${EPOCHS:-2}
IMGSZ=${IMGSZ:-640}
[ -x "$SLUICE" ] || { echo "no sluice binary at $SLUICE: cargo build --release -p sluice-cli --features mpi" >&2; exit 1; }
OUT=$BENCH_SCRATCH/disk_cache_ranks
rm -rf "$OUT"
mkdir -p "$OUT"

# Runs COMMAND (its output into OUT/NAME.out and .err) while sampling the RssAnon of every `sluice` process whose
# command line names the run, until the command ends; prints each process's peak.
sampled() { # NAME COMMAND...
  local name=$1
  shift
  "$@" >"$OUT/$name.out" 2>"$OUT/$name.err" &
  local pid=$!
  python3 - "$pid" "$name" <<'EOF'
import os, sys, time
parent, name = int(sys.argv[1]), sys.argv[2]
peak = {}
while True:
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
            if not cmd or not cmd[0].endswith(b"sluice") or name.encode() not in cmd:
                continue
            for line in open(f"/proc/{p}/status"):
                if line.startswith("RssAnon:"):
                    kb = int(line.split()[1])
                    peak[p] = max(peak.get(p, 0), kb)
        except OSError:
            pass
    try:
        os.kill(parent, 0)
        if open(f"/proc/{parent}/stat").read().split()[2] == "Z":
            break
    except OSError:
        break
    time.sleep(0.2)
for p, kb in sorted(peak.items(), key=lambda x: int(x[0])):
    print(f"  pid {p}: peak RssAnon {kb / 1e3:.1f} MB")
EOF
  wait "$pid"
}

run() { # NAME BATCH EXTRA_ARGS...
  local name=$1 batch=$2
  shift 2
  local t0=$SECONDS
  sampled "$name" "$SLUICE" train --data "$SLUICE_COCO128/data.yaml" --model yolov8n --epochs "$EPOCHS" \
    --imgsz "$IMGSZ" --batch "$batch" --cache disk --cache-dir "$OUT/cache-$name" --val-interval "$EPOCHS" \
    --project "$OUT" --name "$name" "$@"
  echo "  wall $((SECONDS - t0)) s; $(grep -c 'decoded .* images into' "$OUT/$name.err" || true) cache builds reported;" \
    "files: $(find "$OUT/cache-$name" -name '*.imgcache' | wc -l)"
}

echo "# benches/disk_cache_ranks.sh: coco128, yolov8n, imgsz $IMGSZ, $EPOCHS epochs, cache disk"
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores; $(git -C "$ROOT" rev-parse --short HEAD)"
echo "one process, batch 16:"
run one 16
echo "one process, batch 8:"
run one8 8
echo "two ranks (--nproc 2), batch 16 (8 per rank):"
run two 16 --nproc 2
