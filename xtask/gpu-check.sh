#!/usr/bin/env bash
# Sluice's device check, prepared by `cargo xtask gpu-check` and run on the GPU machine as
#   bash target/gpu-check/run.sh
# Every step is time-boxed (460 s in all at most, inside the 480 s the device command allows; the most important
# steps first) and writes its output under $OUT (JSON where the step has figures):
#   device.json      nvidia-smi, torch, libraries found / missing
#   smoke.json       `sluice gpu smoke`: GPU vs CPU results of the model's ops, the transfer, one YOLOv8n loss
#   h2d.json         `sluice gpu h2d`: plain pinned / pageable copies vs the training transfer
#   train/           `sluice train` yolov8n, 640, batch 32 on the carried coco128 slice: telemetry.jsonl holds
#                    images/s, step time, data wait and blocking device reads per batch (training and validation)
#   conformance.*   the decode conformance suite with nvjpeg required (SLUICE_REQUIRE_NVJPEG=1)
#   decode_*.out     `sluice bench decode --json`: nvjpeg vs the CPU backend
#   ultralytics.json the same training with Ultralytics, when its wheel was carried and imports
#   train_amp/       one epoch of the same training with `--amp` (bf16 convolutions), for the f32 / bf16 ratio
#   steps.jsonl      one line per step: name, exit code, seconds
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$HERE/out}"
mkdir -p "$OUT"
S="$HERE/sluice"
DATA="$HERE/data/data.yaml"
EPOCHS="${GPU_CHECK_EPOCHS:-3}"

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/log.txt"; }

# step NAME LIMIT_S CMD... : run with a time box, keep stdout/stderr, append a steps.jsonl line.
step() {
  local name=$1 limit=$2
  shift 2
  log "step $name (limit ${limit}s): $*"
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$OUT/$name.out" 2>"$OUT/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  python3 -c "import json,sys; print(json.dumps({'step': sys.argv[1], 'rc': int(sys.argv[2]), 'seconds': round(float(sys.argv[4]) - float(sys.argv[3]), 2)}))" \
    "$name" "$rc" "$t0" "$t1" >>"$OUT/steps.jsonl"
  log "  $name: exit $rc"
  tail -n 4 "$OUT/$name.err" | sed 's/^/    /' | tee -a "$OUT/log.txt"
  return 0
}

# Libraries: the carried ones (nvJPEG, the CUDA runtime), then every nvidia/*/lib folder of the device's Python
# (PyTorch's CUDA wheels carry cuBLAS, cuRAND and NVRTC), then the system's.
PYLIBS=$(python3 - <<'PY' 2>/dev/null
import glob, os, sys
seen = []
for p in sys.path:
    for d in sorted(glob.glob(os.path.join(p, "nvidia", "**", "lib"), recursive=True)):
        if os.path.isdir(d) and d not in seen:
            seen.append(d)
print(":".join(seen))
PY
)
export LD_LIBRARY_PATH="$HERE/lib:${PYLIBS}:${LD_LIBRARY_PATH:-}"

nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
ldd "$S" >"$OUT/ldd.txt" 2>&1
python3 - "$OUT" <<'PY'
import json, subprocess, sys
out = sys.argv[1]
info = {}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception as e:  # noqa: BLE001
    info["torch_error"] = repr(e)
ldd = open(f"{out}/ldd.txt").read().splitlines()
info["missing_libraries"] = [l.split()[0] for l in ldd if "not found" in l]
try:
    info["smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip()
except OSError as e:
    info["smi_error"] = repr(e)
json.dump(info, open(f"{out}/device.json", "w"), indent=1)
print(json.dumps(info))
PY
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

step info 20 "$S" info
step smoke 60 "$S" gpu smoke --json "$OUT/smoke.json"
step h2d 30 "$S" gpu h2d --json "$OUT/h2d.json"
step train 140 "$S" train --data "$DATA" --model yolov8n --imgsz 640 --batch 32 --epochs "$EPOCHS" \
  --device cuda:0 --cache ram --workers 12 --project "$OUT" --name train --exist-ok --json
if [ -x "$HERE/conformance" ] && [ -d "$HERE/../../crates/sluice-decode/tests/data" ]; then
  SLUICE_REQUIRE_NVJPEG=1 SLUICE_DECODE_TEST_DATA="$HERE/../../crates/sluice-decode/tests/data" \
    step conformance 40 "$HERE/conformance" --nocapture --test-threads 1
else
  log "no prebuilt conformance suite or no fixtures: nvjpeg conformance skipped"
fi
step decode_nvjpeg 30 "$S" bench decode --data "$DATA" --backend nvjpeg --threads 1 --json
step decode_cpu 30 "$S" bench decode --data "$DATA" --backend image --threads 16 --json

# Ultralytics, same settings, when its wheel was carried (installed without dependencies: the device's PyTorch,
# NumPy, OpenCV and friends are used as they are; an import failure is recorded, not fatal).
WHEEL=$(ls "$HERE"/wheels/ultralytics-*.whl 2>/dev/null | head -n 1)
if [ -n "$WHEEL" ]; then
  python3 -m pip install --quiet --no-deps --no-index --target "$HERE/pyul" "$WHEEL" >"$OUT/ultralytics_install.txt" 2>&1
  PYTHONPATH="$HERE/pyul:${PYTHONPATH:-}" YOLO_OFFLINE=1 step ultralytics 90 \
    python3 "$HERE/ul_train.py" "$DATA" "$EPOCHS" "$OUT/ultralytics.json"
else
  log "no Ultralytics wheel carried: side-by-side skipped"
fi
# Mixed precision last (the least important figure): one epoch, the same settings otherwise.
step train_amp 20 "$S" train --data "$DATA" --model yolov8n --imgsz 640 --batch 32 --epochs 1 --amp \
  --device cuda:0 --cache ram --workers 12 --project "$OUT" --name train_amp --exist-ok --json
log "done"
