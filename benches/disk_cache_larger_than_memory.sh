#!/usr/bin/env bash
# `cache: disk` on a set larger than the memory it may use: the training loader (mosaic on, IMGSZ, batch 16, 2
# workers, 2 epochs) over a generated set of IMAGES images whose cache file is several times LIMIT_MB, run in a
# memory cgroup limited to LIMIT_MB (the limit counts the page cache, so most of the file must come from the disk
# again in every epoch), the page cache dropped before each run. Beside it, a SUBSET-image set of the same
# generator (which fits in memory) with `--cache ram` and `--cache disk`, unconstrained: the speed the big set is
# compared with. With BASELINE set to another sluice binary, each constrained run of SLUICE is paired with one of
# BASELINE, alternating, ROUNDS times.
#
#   sudo benches/disk_cache_larger_than_memory.sh
#
# Needs root (a cgroup v1 `memory` controller or cgroup v2, and /proc/sys/vm/drop_caches) and `cargo build --release
# -p sluice-cli`. Env: SLUICE (default target/release/sluice), BASELINE (none), IMAGES (4000), SUBSET (800),
# LIMIT_MB (1200), IMGSZ (640), ROUNDS (3). Scratch under $BENCH_SCRATCH/larger_than_memory (about 1.3 MB per image
# at 640 for the cache file). Prints one line per run (images/s per epoch, RssAnon, bytes read ahead, bottleneck);
# the JSON of each run is kept beside.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/benches/locations.sh"
SLUICE=${SLUICE:-$ROOT/target/release/sluice}
BASELINE=${BASELINE:-}
IMAGES=${IMAGES:-4000}
SUBSET=${SUBSET:-800}
LIMIT_MB=${LIMIT_MB:-1200}
IMGSZ=${IMGSZ:-640}
ROUNDS=${ROUNDS:-3}
[ -x "$SLUICE" ] || { echo "no sluice binary at $SLUICE: cargo build --release -p sluice-cli" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "needs root: a memory cgroup and drop_caches" >&2; exit 1; }
OUT=$BENCH_SCRATCH/larger_than_memory
mkdir -p "$OUT"

gen() { # DIR TRAIN
  [ -f "$1/data.yaml" ] || "$SLUICE" data gen --train "$2" --val 16 --imgsz "$IMGSZ" --seed 3 --out "$1" >/dev/null
}
gen "$OUT/set" "$IMAGES"
gen "$OUT/subset" "$SUBSET"

loader() { # BINARY DATA CACHE EPOCHS [CACHE_DIR]
  local dir=()
  [ -n "${5:-}" ] && dir=(--cache-dir "$5")
  "$1" bench loader --data "$2" --imgsz "$IMGSZ" --batch 16 --workers 2 --epochs "$4" --cache "$3" "${dir[@]}" --json
}

# Runs COMMAND (a function of this script too) in a memory cgroup of LIMIT_MB, the page cache dropped first.
limited() {
  sync
  echo 3 >/proc/sys/vm/drop_caches
  if [ -d /sys/fs/cgroup/memory ]; then
    local cg=/sys/fs/cgroup/memory/sluice-bench
    mkdir -p "$cg"
    echo $((LIMIT_MB * 1000 * 1000)) >"$cg/memory.limit_in_bytes"
  else
    local cg=/sys/fs/cgroup/sluice-bench
    mkdir -p "$cg"
    echo $((LIMIT_MB * 1000 * 1000)) >"$cg/memory.max"
  fi
  (
    echo "$BASHPID" >"$cg/cgroup.procs"
    "$@"
  )
}

show() { # NAME JSON
  python3 - "$1" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[2]))
per = " ".join(f"{e['images_per_s']:.1f}" for e in d["per_epoch"])
s = d["cache_stats"]
print(f"{sys.argv[1]:<28} img/s per epoch {per:<22} warm {d['warm_images_per_s']:.1f}  RssAnon {d['rss_anon_bytes'] / 1e6:.1f} MB"
      f"  read ahead {s.get('prefetch_bytes', 0) / 1e9:.2f} GB  decode {s['decode_s']:.1f} s  bottleneck {d['bottleneck']}")
EOF
}

# The cache files, built unconstrained (the build is not what is measured).
loader "$SLUICE" "$OUT/set/data.yaml" disk 2 "$OUT/cache" >"$OUT/build.json"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "set: $IMAGES images at $IMGSZ ($(du -sh "$OUT/cache" | cut -f1) of cache file), limit $LIMIT_MB MB"
for r in $(seq 1 "$ROUNDS"); do
  limited loader "$SLUICE" "$OUT/set/data.yaml" disk 2 "$OUT/cache" >"$OUT/limited_sluice_$r.json"
  show "limited, SLUICE, round $r" "$OUT/limited_sluice_$r.json"
  if [ -n "$BASELINE" ]; then
    limited loader "$BASELINE" "$OUT/set/data.yaml" disk 2 "$OUT/cache" >"$OUT/limited_baseline_$r.json"
    show "limited, BASELINE, round $r" "$OUT/limited_baseline_$r.json"
  fi
done
echo "subset: $SUBSET images, unconstrained, 3 epochs (warm = the median of epochs 2-3)"
for cache in ram disk; do
  loader "$SLUICE" "$OUT/subset/data.yaml" "$cache" 3 "$OUT/subset_cache" >"$OUT/subset_$cache.json"
  show "subset, cache $cache" "$OUT/subset_$cache.json"
done
