#!/usr/bin/env bash
# Runs the fuzz targets one after the other, one libFuzzer process on one core each, for $SECS seconds each
# (default 120), with sanitizer $SAN (default none; `address` needs a nightly-capable rustc, RUSTC_BOOTSTRAP=1
# here). Logs go to fuzz/logs/<target>-<sanitizer>.log; new corpus entries to fuzz/corpus/<target>/ (git-ignored
# apart from the seeds), crashes to fuzz/artifacts/<target>/.
#
#   fuzz/run.sh                       # all eight targets, 2 minutes each
#   SECS=30 SAN=address fuzz/run.sh decode
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-120}
SAN=${SAN:-none}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(yolo_labels packed_reader decode read_header data_yaml label_cache coco_json pt_checkpoint)
mkdir -p fuzz/logs
extra=()
[ "$SAN" = none ] || extra=(--target-dir fuzz/target/"$SAN")
for t in "${TARGETS[@]}"; do
  echo "== $t ($SAN, ${SECS}s)"
  RUSTC_BOOTSTRAP=1 cargo fuzz run "$t" -s "$SAN" "${extra[@]}" -j 1 -- \
    -max_total_time="$SECS" -print_final_stats=1 2>&1 | tee "fuzz/logs/$t-$SAN.log" | grep -E "INFO: seed|INITED|DONE|Done|stat::|panicked|ERROR|SUMMARY|Test unit written" || true
done
