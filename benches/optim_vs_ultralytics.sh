#!/usr/bin/env bash
# One optimizer step over yolov8n's parameters (3.0 M) on the CPU, Sluice against Ultralytics 8.4.190 on torch,
# back to back with the same thread count: SGD (Nesterov), AdamW and MuSGD, each with the clip to norm 10 and the
# EMA update. Peer: benches/optim_vs_ultralytics.py (Ultralytics' own build_optimizer and MuSGD, median of ITERS
# after 3 warm-ups). Sluice: `cargo bench -p sluice-optim --bench optim` (criterion, 20 samples; its median), per
# parameter (the CPU trainer's form) and over packed parameter groups (the form the trainer takes on a GPU, where it
# saves launches). Prints peer ms, sluice ms (both forms) and peer / sluice for the per-parameter form (above 1:
# Sluice is faster). Run it on a quiet machine.
#
# Env: PEERS_VENV (default ~/.cache/sluice-peers/venv), THREADS (default 2: OMP/MKL threads of the peer, rayon's
#      of Sluice), ITERS (the peer's timed steps, default 20).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
THREADS=${THREADS:-2}
PY=$PEERS_VENV/bin/python
[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run the peers' setup.sh first" >&2; exit 1; }
export YOLO_OFFLINE=1 YOLO_CONFIG_DIR=$(dirname "$PEERS_VENV")/ultralytics_cfg
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS RAYON_NUM_THREADS=$THREADS

echo "== machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== peer: Ultralytics $("$PY" -c 'import ultralytics; print(ultralytics.__version__)'), torch $("$PY" -c 'import torch; print(torch.__version__)')"
peer=$("$PY" "$ROOT/benches/optim_vs_ultralytics.py" SGD AdamW MuSGD | grep "\"rule\"")
echo "$peer"
echo "== sluice: cargo bench -p sluice-optim --bench optim"
sluice=$(cd "$ROOT" && cargo bench -q -p sluice-optim --bench optim 2>/dev/null | tr '\n' ' ')
printf '%-8s %12s %14s %14s %8s\n' rule "peer ms" "sluice ms" "packed ms" ratio
for rule in SGD AdamW MuSGD; do
  p=$(echo "$peer" | grep "\"rule\": \"$rule\"" | sed 's/.*"median_ms": \([0-9.e-]*\).*/\1/')
  # criterion: "optim_yolov8n_cpu/<rule>_clip_step_ema time: [low median high]" with units.
  ms() {
    echo "$sluice" | grep -o "/${rule}_clip_step_ema$1 *time: *\[[^]]*\]" | sed 's/.*\[\([^]]*\)\]/\1/' |
      awk '{v=$3; u=$4; if (u=="s") v*=1000; else if (u=="µs"||u=="us") v/=1000; print v}'
  }
  s=$(ms ""); k=$(ms "_packed")
  printf '%-8s %12.2f %14.2f %14.2f %8.2f\n' "$rule" "$p" "$s" "$k" "$(echo "$p / $s" | bc -l)"
done
