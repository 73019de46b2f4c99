# Sourced by the side-by-side scripts in this folder: the peers' environment as $PEERS_DIR/run_all.sh sets it, a
# fresh peers' results file, the `sluice` binary (built in release mode unless SLUICE names one), and `load`.
# Expects ROOT, OUT and PEERS_VENV set and locations.sh sourced; THREADS (default 2) is the peers' intra-op thread
# count; SLUICE_FEATURES are cargo features for the build (e.g. "turbojpeg"). The peers' outputs (their copy of
# coco128, logs) go to PEERS_DATA, by default $BENCH_SCRATCH/peers-data.
THREADS=${THREADS:-2}
export PEERS_VENV
export PEERS_DATA=${PEERS_DATA:-$BENCH_SCRATCH/peers-data}
export PEERS_OUT=$OUT/peers.jsonl
export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$(dirname "$PEERS_VENV")/ultralytics_cfg
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS PYTHONDONTWRITEBYTECODE=1
mkdir -p "$OUT"
: > "$PEERS_OUT"

if [ -z "${SLUICE:-}" ]; then
  echo "== building sluice (release)"
  features=()
  [ -n "${SLUICE_FEATURES:-}" ] && features=(--features "$SLUICE_FEATURES")
  (cd "$ROOT" && cargo build --release -q -p sluice-cli "${features[@]}")
  SLUICE=${CARGO_TARGET_DIR:-$ROOT/target}/release/sluice
fi
[ -x "$SLUICE" ] || { echo "no sluice binary at $SLUICE" >&2; exit 1; }

load() { cut -d' ' -f1-3 /proc/loadavg; }
