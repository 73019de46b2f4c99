#!/usr/bin/env bash
# Sluice's YOLOv8n (or YOLO11n / YOLO26n: MODEL=yolo11n, MODEL=yolo26n) against PyTorch 2.15 (Ultralytics 8.4's DetectionModel) on the CPU, back to back on one machine
# with the same thread count (2, as the peers run it). For each case it runs the peer's own code first
# ($PEERS_DIR/m4_model_cpu.py: its train_step_ms / infer_ms functions, called for that case alone; the
# figures, their names and the timing protocol are the script's), then `sluice bench model`, and prints peer ms,
# sluice ms and the ratio peer / sluice (above 1: sluice is faster). Run it on a quiet machine: the peer waits for
# one (PEERS_MAX_WAIT_S), sluice does not, and nothing else should run meanwhile.
#
# Usage: benches/model_vs_pytorch.sh [case ...]      cases: train320 train640 infer1 infer8 (default: all four)
# Env:   PEERS_VENV       the peers' venv (default ~/.cache/sluice-peers/venv; made by $PEERS_DIR/setup.sh)
#        SLUICE_SHARED    the shared folder (default ../shared beside the repository; see benches/locations.sh)
#        PEERS_DIR        the peer scripts (default $SLUICE_SHARED/peers)
#        SLUICE           a prebuilt `sluice` binary (default: `cargo build --release` of the package that
#                         holds it, then use it)
#        MODEL            yolov8n (default), yolo11n or yolo26n: the model of both sides (the peer's make_model
#                         builds DetectionModel("$MODEL.yaml"), its figure names say $MODEL; for yolo26n its train
#                         step runs the model's own criterion, E2ELoss, as Sluice's does)
#        THREADS          threads of both sides (default 2): the peer's PEERS_THREADS / OMP / MKL, sluice's
#                         RAYON_NUM_THREADS (rayon's pool runs sluice's kernels and candle's matmuls)
#        PEERS_REPEATS    the peer's timed repeats (default 5); also sluice's timed iterations unless ITERS is set
#        WARMUP, ITERS    sluice's untimed and timed runs per path (default 2 and PEERS_REPEATS or 5, as the peer)
#        BENCH_OUT        where sluice's JSON, the peer logs and the peer's results (PEERS_OUT) go
#                         (default $BENCH_SCRATCH/model; the peers' results file is reset on every run)
#
# The pairs (yolov8n, nc 80, random initialisation on both sides):
#   train320  training step at 320, batch 8: peer yolov8n_cpu.t2.train_step.imgsz320_b8.ms_per_step against
#             sluice --imgsz 320 --batch 8 train_step_ms
#   train640  the same at 640, batch 4 (peer ...imgsz640_b4.ms_per_step, sluice --imgsz 640 --batch 4)
#   infer1    inference at 640, batch 1, fused (Conv+BN folded: what Ultralytics' predictor and validator run) and
#             unfused: peer infer_{fused,unfused}.imgsz640_b1.ms_per_image against sluice --imgsz 640 --batch 1
#             fused_forward_ms / eval_forward_ms
#   infer8    the same at batch 8, per image (sluice's batch time / 8)
# What differs inside a pair (see m4's docstring and crates/sluice-model/src/bench.rs):
#   train step  both: zero/fresh gradients, train-mode forward, the v8 detection loss (TAL assigner, box/cls/dfl),
#               backward, optimizer step. Peer: one real Ultralytics training batch (mosaic, seed 0; its target
#               count is in the log). Sluice: uniform random input, 2 synthetic boxes per image. Both update with
#               SGD (lr 0.01, momentum 0.937, nesterov, weight decay 5e-4 on every parameter): sluice's is the
#               trainer's port of torch's rule (`sluice bench model --optimizer sgd`, the default).
#   inference   both: eval mode, uniform random input, the head's box decode included; the peer under no_grad.
#   statistics  peer: median of PEERS_REPEATS after 2 warm-ups, repeats with other processes' CPU load above
#               0.25 cores dropped when at least half are clean (else flagged contended=yes: printed in the
#               table); sluice: median of ITERS after WARMUP, no contention filter.
# Each `sluice bench model` run times all three paths at its size and batch; the ones without a peer figure
# (eval/fused at 320/b8 and 640/b4, the train step at 640/b1 and b8) stay in its JSON and are not printed.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
. "$ROOT/benches/locations.sh"
THREADS=${THREADS:-2}
MODEL=${MODEL:-yolov8n}
case $MODEL in yolov8n|yolo11n|yolo26n) ;; *) echo "MODEL $MODEL: yolov8n, yolo11n or yolo26n" >&2; exit 1 ;; esac
WARMUP=${WARMUP:-2}
ITERS=${ITERS:-${PEERS_REPEATS:-5}}
OUT=${BENCH_OUT:-$BENCH_SCRATCH/model}
CASES=${*:-train320 train640 infer1 infer8}
PY=$PEERS_VENV/bin/python

[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run $PEERS_DIR/setup.sh first" >&2; exit 1; }
[ -f "$PEERS_DIR/m4_model_cpu.py" ] || { echo "no peer scripts in $PEERS_DIR (set PEERS_DIR)" >&2; exit 1; }
for c in $CASES; do
  case $c in train320|train640|infer1|infer8) ;; *) echo "unknown case $c (train320 train640 infer1 infer8)" >&2; exit 1 ;; esac
done

# The peers' environment, as $PEERS_DIR/run_all.sh sets it, with THREADS threads.
export PEERS_THREADS=$THREADS
. "$ROOT/benches/common.sh"

# m4_model_cpu.py's own functions for one case (its __main__ runs all of them in this order). argv[0] is set to
# the script's name, which emit() records with every figure.
M4_CASE=$(cat <<'EOF'
import sys
case, model = sys.argv[1], sys.argv[2]
sys.argv = ["m4_model_cpu.py", case]
import m4_model_cpu as m4
if model != "yolov8n":  # the same protocol on another model: its builder and its figure names
    import torch
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel

    def make_model():
        torch.manual_seed(0)
        m = DetectionModel(f"{model}.yaml", nc=80, verbose=False)
        m.args = get_cfg()
        return m

    emit = m4.emit
    m4.make_model = make_model
    m4.v8DetectionLoss = lambda m: m.init_criterion()  # the model's own criterion (E2ELoss for yolo26n)
    m4.emit = lambda name, *a, **k: emit(name.replace("yolov8n_cpu", f"{model}_cpu"), *a, **k)
if case == "train320":
    m4.train_step_ms(320, 8)
elif case == "train640":
    m4.train_step_ms(640, 4)
else:
    bs = int(case[len("infer"):])
    m4.infer_ms(bs, fused=False)
    m4.infer_ms(bs, fused=True)
EOF
)

peer() {  # peer CASE: the peer's figures for one case, its log in $OUT/m4_CASE.log
  local c=$1
  echo "== peer $c: m4_model_cpu.py ($THREADS threads, $(date +%T), load $(load))"
  if ! (cd "$PEERS_DIR" && "$PY" -c "$M4_CASE" "$c" "$MODEL") > "$OUT/m4_$c.log" 2>&1; then
    echo "!! peer $c failed, see $OUT/m4_$c.log (its ratios print as nan)" >&2; tail -5 "$OUT/m4_$c.log" >&2
    return 0
  fi
  grep -E '^(FIGURE|train|infer)' "$OUT/m4_$c.log" || true
}

ours() {  # ours CASE IMGSZ BATCH: one `sluice bench model --json` run into $OUT/CASE.json
  local c=$1 imgsz=$2 batch=$3
  echo "== sluice $c: bench model --imgsz $imgsz --batch $batch ($THREADS threads, $(date +%T), load $(load))"
  RAYON_NUM_THREADS=$THREADS "$SLUICE" bench model --model "$MODEL" --nc 80 --imgsz "$imgsz" --batch "$batch" \
    --warmup "$WARMUP" --iters "$ITERS" --json > "$OUT/$c.json"
  cat "$OUT/$c.json"
}

# One line per pair: LABEL PEER_FIGURE_NAME SLUICE_JSON SLUICE_KEY DIVISOR (sluice's value / DIVISOR).
ROWS=$OUT/rows.tsv
: > "$ROWS"
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >> "$ROWS"; }
P=${MODEL}_cpu.t$THREADS

for c in $CASES; do
  peer "$c"
  case $c in
    train320)
      ours train320 320 8
      row "train step 320 b8 (ms/step)" "$P.train_step.imgsz320_b8.ms_per_step" train320.json train_step_ms 1 ;;
    train640)
      ours train640 640 4
      row "train step 640 b4 (ms/step)" "$P.train_step.imgsz640_b4.ms_per_step" train640.json train_step_ms 1 ;;
    infer1|infer8)
      bs=${c#infer}
      ours "$c" 640 "$bs"
      row "infer fused 640 b$bs (ms/image)" "$P.infer_fused.imgsz640_b$bs.ms_per_image" "$c.json" fused_forward_ms "$bs"
      row "infer unfused 640 b$bs (ms/image)" "$P.infer_unfused.imgsz640_b$bs.ms_per_image" "$c.json" \
        eval_forward_ms "$bs" ;;
  esac
done

echo "==== PyTorch / sluice, $THREADS threads (ms; above 1: sluice is faster; results in $OUT)"
"$PY" - "$OUT" "$PEERS_OUT" "$ROWS" <<'EOF'
import json, os, sys

out, peers_out, rows = sys.argv[1:4]
peer = {}
for line in open(peers_out):
    if line.strip():
        rec = json.loads(line)
        peer[rec["name"]] = rec  # the last figure of a name wins
print(f"{'figure':<34} {'peer':>9} {'sluice':>9} {'ratio':>7}  peer contended")
for line in open(rows):
    label, name, json_name, key, div = line.rstrip("\n").split("\t")
    path = os.path.join(out, json_name)
    ours = json.load(open(path))[key] / float(div) if os.path.exists(path) else float("nan")
    rec = peer.get(name, {})
    p = rec.get("value", float("nan"))
    ratio = f"{p / ours:7.2f}" if p == p and ours == ours and ours > 0 else "      -"
    print(f"{label:<34} {p:9.1f} {ours:9.1f} {ratio}  {rec.get('contended', '-')}")
EOF
