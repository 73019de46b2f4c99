#!/usr/bin/env bash
# The cost ledger of one YOLOv8n training step (forward, loss, backward, optimizer, EMA) and one validation batch,
# Sluice beside Ultralytics 8.4.190 on PyTorch, both priced as a CUDA eager run would execute them: kernel launches,
# bytes moved (read + written) and allocations per phase. Sluice: `sluice bench step-cost --json`. Peer:
# benches/step_cost_pytorch.py (every aten op of Ultralytics' own step, recorded with a TorchDispatchMode; its
# header holds the pricing rules, which both sides share). Prints both per phase with the ratio sluice / pytorch
# (below 1: Sluice launches, moves or allocates less) and writes both JSONs to OUT.
#
#   benches/step_cost_vs_pytorch.sh [--imgsz 640] [--batch 32] [--amp f32|fp16|bf16] [--optimizer sgd|adamw]
#
# Env: PEERS_VENV   the peers' venv (default ~/.cache/sluice-peers/venv; made by the peers' setup.sh)
#      SLUICE       a prebuilt `sluice` binary (default: `cargo build --release` as benches/common.sh does)
#      THREADS      the peer's torch threads (default 2); the ledger does not depend on them
#      PEER_DEVICE  cpu (default) or cuda: where the peer records (cuda adds its real kernel counts per phase)
#      BENCH_OUT    where the JSONs go (default $BENCH_SCRATCH/step-cost; see benches/locations.sh)
# The peer's f32 run at 640, batch 32 takes a minute or two on two cores and about 8 GB of memory; on a CPU its
# fp16 and bf16 runs use CPU autocast, whose op lists differ from CUDA's (see the peer's header).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/sluice-peers/venv}
. "$ROOT/benches/locations.sh"
IMGSZ=640 BATCH=32 AMP=f32 OPTIMIZER=sgd
while [ $# -gt 0 ]; do
  case $1 in
    --imgsz) IMGSZ=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --amp) AMP=$2; shift 2 ;;
    --optimizer) OPTIMIZER=$2; shift 2 ;;
    *) echo "unknown argument $1 (--imgsz N --batch N --amp f32|fp16|bf16 --optimizer sgd|adamw)" >&2; exit 1 ;;
  esac
done
case $AMP in f32|fp16|bf16) ;; *) echo "--amp $AMP: f32, fp16 or bf16" >&2; exit 1 ;; esac
case $OPTIMIZER in sgd|adamw) ;; *) echo "--optimizer $OPTIMIZER: sgd or adamw" >&2; exit 1 ;; esac
OUT=${BENCH_OUT:-$BENCH_SCRATCH/step-cost}
PY=$PEERS_VENV/bin/python
[ -x "$PY" ] || { echo "no peers venv at $PEERS_VENV: run the peers' setup.sh first" >&2; exit 1; }

# The peers' environment (threads, YOLO_OFFLINE, YOLO_CONFIG_DIR) and the sluice binary.
. "$ROOT/benches/common.sh"

CASE=yolov8n_${IMGSZ}_b${BATCH}_${AMP}_${OPTIMIZER}
OURS=$OUT/sluice_$CASE.json
PEER=$OUT/pytorch_$CASE.json
rm -f "$OURS" "$PEER"

echo "== sluice: bench step-cost --model yolov8n --imgsz $IMGSZ --batch $BATCH --amp $AMP --optimizer $OPTIMIZER"
if ! "$SLUICE" bench step-cost --model yolov8n --imgsz "$IMGSZ" --batch "$BATCH" --amp "$AMP" \
    --optimizer "$OPTIMIZER" --json > "$OURS.tmp"; then
  echo "!! sluice bench step-cost failed (its column prints as -)" >&2
  rm -f "$OURS.tmp"
else
  mv "$OURS.tmp" "$OURS"
fi

echo "== peer: step_cost_pytorch.py on ${PEER_DEVICE:-cpu} ($THREADS threads, $(date +%T), load $(load))"
"$PY" "$ROOT/benches/step_cost_pytorch.py" --model yolov8n --imgsz "$IMGSZ" --batch "$BATCH" --amp "$AMP" \
  --optimizer "$OPTIMIZER" --device "${PEER_DEVICE:-cpu}" --json "$PEER"

echo "==== yolov8n $IMGSZ b$BATCH $AMP $OPTIMIZER, s: sluice, pt: pytorch, ratio s / pt (JSONs in $OUT)"
"$PY" - "$OURS" "$PEER" <<'EOF'
import json, os, sys

ours_path, peer_path = sys.argv[1:3]
ours = json.load(open(ours_path)) if os.path.exists(ours_path) else {}
peer = json.load(open(peer_path))


def by_phase(doc):
    rows = {r["phase"]: r for r in doc.get("phases", [])}
    if "train_total" in doc:
        rows["train"] = doc["train_total"]
    return rows


o, p = by_phase(ours), by_phase(peer)
print(f"sluice: {ours.get('version', '-')} ({ours.get('device_model', '-')})")
print(f"peer:   {peer['version']} ({peer['device_model']})")


def value(rows, ph, key):
    r = rows.get(ph)
    if r is None:
        return None
    if key == "bytes":
        return (r["bytes_read"] + r["bytes_written"]) / 1e6
    return r.get(key)


cols = (("launches", "launches", "{:.0f}"), ("bytes", "moved MB", "{:.1f}"), ("allocs", "allocs", "{:.0f}"))
head = f"{'phase':<10}" + "".join(f"{name + ' s':>13}{name + ' pt':>13}{'ratio':>8}" for _, name, _ in cols)
print(head)
for ph in ("forward", "loss", "backward", "optimizer", "ema", "val", "train"):
    line = f"{ph:<10}"
    for key, _, fmt in cols:
        s, t = value(o, ph, key), value(p, ph, key)
        line += f"{fmt.format(s) if s is not None else '-':>13}{fmt.format(t) if t is not None else '-':>13}"
        line += f"{s / t:>8.2f}" if s is not None and t else f"{'-':>8}"
    print(line)
hr = [(ph, value(o, ph, "host_reads"), value(p, ph, "host_reads")) for ph in ("train", "val")]
print("host reads (sluice / pytorch): " + ", ".join(f"{ph} {s if s is not None else '-'} / {t}" for ph, s, t in hr))
EOF
