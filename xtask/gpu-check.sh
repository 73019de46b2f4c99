#!/usr/bin/env bash
# Sluice's device check, prepared by `cargo xtask gpu-check` and run on the GPU machine as
#   bash target/gpu-check/run.sh
# Every step is time-boxed, the most important first, and a step that would end past GPU_CHECK_BUDGET seconds
# (default 500) is skipped and recorded as such. The results gather in $HERE/results and leave as one archive,
# $OUT/gpu-check.tgz, with log.txt, steps.jsonl, paths.json, smoke.json and the two conv tables beside it:
#   device.json      nvidia-smi, torch, libraries found / missing
#   smoke.json       `gpu smoke` (sluice-infer's device-check test): GPU vs CPU results of the model's ops (convolutions in f32 and bf16 on
#                    odd shapes, stride 2, 1×1, batch 1), the transfer, one YOLOv8n loss, the cuDNN plan cache
#   amp_torch.json   PyTorch's bf16 autocast on the smoke's autocast check (Ultralytics' YOLOv8n), its reference
#   convs.json       `gpu convs`: Sluice's cuDNN convolutions vs candle's stock conv2d on YOLOv8n's layers
#   convs_torch.json the same layers with PyTorch (cuDNN heuristics, then cudnn.benchmark), ratios to Sluice's
#   train/           `sluice train` yolov8n, 640, batch 32, 3 epochs on the slice 16 times over (1024 images, built on
#                    the device; the steps below that name no set use the 64-image slice) with every opt-in device
#                    path on (`--device-paths fused_step,cudnn_search,device_nms,gpu_timer,fused_ciou,fused_bce,fused_pool`): telemetry.jsonl holds
#                    images/s, step time, data wait and blocking device reads per batch (training and validation)
#   ultralytics.json the same training with Ultralytics, when its wheel was carried and imports, then its `val`
#                    (batch 32, warm) and `predict` (stream over the 1024 images) of its own best.pt, timed
#   val_*_nms.out    `sluice val --device cuda:0 --json` of the trained weights on the 1024 images, NMS on the
#                    device (`--device-paths device_nms,gpu_timer,fused_ciou,fused_bce`) and on the host (the default)
#   predict_device.* `sluice predict --device cuda:0 --batch 32 --json` over the 1024 images, its wall time
#   val_half.out, predict_half.out   the same two with `--half` (the folded model in float16)
#   train_composed/  one epoch of the `train` run on the verified defaults (the optimizer step as composed ops,
#                    cuDNN's heuristics)
#   paths.json       each opt-in device path, the steps that exercised it and whether they passed
#   h2d.json         `gpu h2d`: plain pinned / pageable copies vs the training transfer
#   conformance.*   the decode conformance suite with nvjpeg required (SLUICE_REQUIRE_NVJPEG=1)
#   decode_*.out     `sluice bench decode --json`: nvjpeg vs the CPU backend
#   train_amp/       one epoch on the 64-image slice with `--amp` (float16 convolutions, dynamic loss scaling)
#   train_bf16/      the same with `--amp bf16`, for the f32 / fp16 / bf16 ratios
#   train_nccl/      one epoch on the 64-image slice as one NCCL rank (torchrun's variables; a `nccl` build)
#   train_yolo11n/, train_yolo26n/   one epoch on the 64-image slice with YOLO11n and YOLO26n
#   step_cost_torch.json  Ultralytics' yolov8n step (640, batch 32, f32) priced by the op ledger's rules, with its
#                    real CUDA kernel count per phase (`benches/step_cost_pytorch.py --device cuda`)
#   steps.jsonl      one line per step: name, exit code, seconds (rc -1: skipped for the budget)
#   matrix.jsonl     (opt-in: GPU_CHECK_ONLY="matrix") the training matrix: Sluice and Ultralytics back to back on a
#                    2048-image set, f32 and AMP (float16), batch 32 and 64, 2 epochs each: per epoch the median and
#                    range of the step interval, images/s, data wait, peak device memory, blocking reads per batch;
#                    each run's output in matrix_*/ and ul_matrix_*.json
# GPU_CHECK_ONLY="smoke convs ..." runs only the steps named (info always runs); "matrix" runs the matrix alone.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${OUT:-$HERE/out}"
RES="$HERE/results"
rm -rf "$RES"
mkdir -p "$OUT" "$RES"
# `cargo xtask gpu-check` packs the executables and libraries with xz.
for f in "$HERE"/sluice.xz "$HERE"/conformance.xz "$HERE"/gpu.xz "$HERE"/lib/*.xz; do
  [ -f "$f" ] || continue
  python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[1][:-3], "wb"))' "$f"
done
chmod +x "$HERE/sluice" "$HERE/conformance" "$HERE/gpu" 2>/dev/null
S="$HERE/sluice"
DATA="$HERE/data/data.yaml"
# Without the carried coco128 slice (left out when the working tree leaves no room for it), a synthetic set of 64
# images at 640 px, laid out as the slice would be.
if [ ! -f "$DATA" ]; then
  "$S" data gen --out "$HERE/gen" --train 64 --val 1 --imgsz 640 >"$HERE/gen.log" 2>&1
  mkdir -p "$HERE/data/images" "$HERE/data/labels"
  mv "$HERE/gen/images/train" "$HERE/data/images/train2017"
  mv "$HERE/gen/labels/train" "$HERE/data/labels/train2017"
  { echo "# Sluice's synthetic shapes (sluice data gen, 64 images at 640 px), train and val, for the device check."
    echo "train: images/train2017"
    echo "val: images/train2017"
    sed -n '/^names:/,$p' "$HERE/gen/data.yaml"; } >"$DATA"
fi
# A 1024-image set, the slice's 64 images 16 times over under other names, built here rather than carried: an epoch
# of 32 steps at batch 32 and a validation pass of 1024 images, so that steady-state figures are not start-up.
# copies_of N DIR: the slice's images N times over under other names, with their labels and a data.yaml.
copies_of() {
  local n=$1 dir=$2 r f b
  [ -f "$dir/data.yaml" ] && return 0
  mkdir -p "$dir/images/train2017" "$dir/labels/train2017"
  for r in $(seq 0 $((n - 1))); do
    for f in "$HERE"/data/images/train2017/*.jpg; do
      b=$(basename "$f" .jpg)
      cp "$f" "$dir/images/train2017/${b}_r$r.jpg"
      if [ -f "$HERE/data/labels/train2017/$b.txt" ]; then
        cp "$HERE/data/labels/train2017/$b.txt" "$dir/labels/train2017/${b}_r$r.txt"
      fi
    done
  done
  grep -v '^#' "$HERE/data/data.yaml" >"$dir/data.yaml"
}
BIG="$HERE/data1024"
copies_of 16 "$BIG"
DATA_BIG="$BIG/data.yaml"
EPOCHS="${GPU_CHECK_EPOCHS:-3}"
BUDGET="${GPU_CHECK_BUDGET:-500}"
START=$(date +%s)

finish() {
  for f in log.txt steps.jsonl paths.json smoke.json amp_torch.json convs.json convs_torch.json matrix.jsonl; do
    [ -f "$RES/$f" ] && cp "$RES/$f" "$OUT/$f"
  done
  # Weights stay behind (tens of MB each).
  tar czf "$OUT/gpu-check.tgz" --exclude=weights --exclude="*.safetensors" -C "$RES" . 2>/dev/null
}
trap finish EXIT

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$RES/log.txt"; }

# step NAME LIMIT_S CMD... : run with a time box, keep stdout/stderr, append a steps.jsonl line; skipped when it
# could end past the budget.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && ! [[ " $GPU_CHECK_ONLY " == *" $name "* ]]; then
    return 0
  fi
  if [ $(( $(date +%s) - START + limit )) -gt "$BUDGET" ]; then
    log "step $name skipped: ${limit}s would pass the ${BUDGET}s budget"
    echo "{\"step\": \"$name\", \"rc\": -1, \"seconds\": 0}" >>"$RES/steps.jsonl"
    return 0
  fi
  log "step $name (limit ${limit}s): $*"
  local t0 t1 rc
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >"$RES/$name.out" 2>"$RES/$name.err"
  rc=$?
  t1=$(date +%s.%N)
  python3 -c "import json,sys; print(json.dumps({'step': sys.argv[1], 'rc': int(sys.argv[2]), 'seconds': round(float(sys.argv[4]) - float(sys.argv[3]), 2)}))" \
    "$name" "$rc" "$t0" "$t1" >>"$RES/steps.jsonl"
  log "  $name: exit $rc"
  tail -n 4 "$RES/$name.err" | sed 's/^/    /' | tee -a "$RES/log.txt"
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

nvidia-smi >"$RES/nvidia-smi.txt" 2>&1
ldd "$S" >"$RES/ldd.txt" 2>&1
python3 - "$RES" <<'PY'
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

GPU_CHECK_ONLY_SAVED="${GPU_CHECK_ONLY:-}"
GPU_CHECK_ONLY="" step info 20 "$S" info
GPU_CHECK_ONLY="$GPU_CHECK_ONLY_SAVED"
if ! grep -q '"rc": 0' <(tail -n 1 "$RES/steps.jsonl"); then
  log "sluice does not start here; stopping (see info.err and ldd.txt)"
  cat "$RES/info.err" "$RES/ldd.txt"
  exit 1
fi
step smoke 60 "$HERE/gpu" smoke --json "$RES/smoke.json"
cat "$RES/smoke.out" 2>/dev/null
WHEELS=$(ls "$HERE"/wheels/*.whl 2>/dev/null)
if [ -n "$WHEELS" ]; then
  python3 -m pip install --quiet --no-deps --no-index --target "$HERE/pyul" $WHEELS >"$RES/ultralytics_install.txt" 2>&1
  PYTHONPATH="$HERE/pyul:${PYTHONPATH:-}" YOLO_OFFLINE=1 step amp_torch 60 python3 "$HERE/amp_torch.py" "$RES/amp_torch.json"
  cat "$RES/amp_torch.out" 2>/dev/null
  # Ultralytics' step priced by the op ledger's rules beside its real CUDA kernels per phase (the check of the
  # ledger's launch counts, docs/step-cost.md).
  PYTHONPATH="$HERE/pyul:${PYTHONPATH:-}" YOLO_OFFLINE=1 step step_cost_torch 60 python3 "$HERE/step_cost_torch.py" \
    --model yolov8n --imgsz 640 --batch 32 --amp f32 --optimizer sgd --device cuda --json "$RES/step_cost_torch.json"
  tail -n 12 "$RES/step_cost_torch.out" 2>/dev/null
fi
step convs 60 "$HERE/gpu" convs --json "$RES/convs.json"
cat "$RES/convs.out" 2>/dev/null
if [ -f "$RES/convs.json" ]; then
  step convs_torch 90 python3 "$HERE/convs_torch.py" "$RES/convs.json" "$RES/convs_torch.json"
  cat "$RES/convs_torch.out" 2>/dev/null
fi
step train 140 "$S" train --data "$DATA_BIG" --model yolov8n --imgsz 640 --batch 32 --epochs "$EPOCHS" \
  --device cuda:0 --cache ram --workers 12 --project "$RES" --name train --exist-ok --json \
  --device-paths fused_step,cudnn_search,device_nms,gpu_timer,fused_ciou,fused_bce,fused_pool
tail -n 3 "$RES/train.out" 2>/dev/null

# Ultralytics, same settings, when its wheel was carried (installed without dependencies: the device's PyTorch,
# NumPy, OpenCV and friends are used as they are; an import failure is recorded, not fatal).
if [ -n "$WHEELS" ]; then
  PYTHONPATH="$HERE/pyul:${PYTHONPATH:-}" YOLO_OFFLINE=1 step ultralytics 130 \
    python3 "$HERE/ul_train.py" "$DATA_BIG" "$EPOCHS" "$RES/ultralytics.json"
  tail -n 2 "$RES/ultralytics.out" 2>/dev/null
else
  log "no Ultralytics wheel carried: side-by-side skipped"
fi
# Validation of the trained weights on the device, NMS batched there (opt-in) and on the host workers (the
# default): the same mAP, and the pass's images/s, inference and post-process shares and blocking reads for each.
if [ -f "$RES/train/weights/best.safetensors" ]; then
  step val_device_nms 30 "$S" val --weights "$RES/train/weights/best.safetensors" --data "$DATA_BIG" --batch 32 \
    --device cuda:0 --json --device-paths device_nms,gpu_timer,fused_ciou,fused_bce
  step val_host_nms 30 "$S" val --weights "$RES/train/weights/best.safetensors" --data "$DATA_BIG" --batch 32 \
    --device cuda:0 --json
  step predict_device 30 /usr/bin/time -v "$S" predict --weights "$RES/train/weights/best.safetensors" \
    --source "$BIG/images/train2017" --device cuda:0 --batch 32 --json --device-paths device_nms
  # Ultralytics' `half`: the folded model in float16; mAP within half precision of the f32 pass above.
  step val_half 30 "$S" val --weights "$RES/train/weights/best.safetensors" --data "$DATA_BIG" --batch 32 \
    --device cuda:0 --half --json
  step predict_half 30 "$S" predict --weights "$RES/train/weights/best.safetensors" \
    --source "$BIG/images/train2017" --device cuda:0 --batch 32 --half --json
fi
# Mixed precision: one epoch each of float16 (with loss scaling) and bfloat16, the same settings otherwise.
step train_amp 30 "$S" train --data "$DATA" --model yolov8n --imgsz 640 --batch 32 --epochs 1 --amp fp16 \
  --device cuda:0 --cache ram --workers 12 --project "$RES" --name train_amp --exist-ok --json
# The verified defaults (the optimizer step as the composed candle ops, cuDNN's heuristics), one epoch of the same
# run, for the opt-in paths' share of the step time.
step train_composed 60 "$S" train --data "$DATA_BIG" --model yolov8n --imgsz 640 --batch 32 \
  --epochs 1 --device cuda:0 --cache ram --workers 12 --project "$RES" --name train_composed --exist-ok --json
# Data-parallel training through NCCL with one rank (the device has one GPU; NCCL takes one rank per GPU): the
# rendezvous, the NCCL communicator, the weight broadcast, the all-reduce of every optimizer step and the sharded
# validation's gathers, as torchrun would start it. Needs a binary built with `nccl` (`cargo xtask gpu-check
# --features cuda,cudnn,nccl`); libnccl comes from the device's PyTorch wheels.
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
  step train_nccl 40 "$S" train --data "$DATA" --model yolov8n --imgsz 640 --batch 32 --epochs 1 \
  --device cuda:0 --cache ram --workers 12 --project "$RES" --name train_nccl --exist-ok --json
step train_bf16 30 "$S" train --data "$DATA" --model yolov8n --imgsz 640 --batch 32 --epochs 1 --amp bf16 \
  --device cuda:0 --cache ram --workers 12 --project "$RES" --name train_bf16 --exist-ok --json
# The training matrix runs only when asked for (GPU_CHECK_ONLY="matrix"): its eight runs take about four minutes.
if [[ " ${GPU_CHECK_ONLY:-} " == *" matrix "* ]]; then
  BIG2="$HERE/data2048"
  copies_of 32 "$BIG2"
  for b in 32 64; do
    for prec in f32 amp; do
      amp=false
      [ "$prec" = amp ] && amp=fp16
      name="matrix_sluice_${prec}_b$b"
      GPU_CHECK_ONLY="$GPU_CHECK_ONLY $name" step "$name" 75 "$S" train --data "$BIG2/data.yaml" --model yolov8n \
        --imgsz 640 --batch "$b" --epochs 2 --amp "$amp" --val-fraction 0.05 --device cuda:0 --cache ram \
        --workers 12 --project "$RES" --name "$name" --exist-ok --json
      if [ -f "$RES/$name/telemetry.jsonl" ]; then
        python3 -c 'import json,sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    print(json.dumps({"run": sys.argv[2], "peer": "sluice", "epoch": t.get("epoch"), "images_per_s": t.get("images_per_s"),
                      "step_interval_ms": t.get("step_interval_ms"), "data_wait_fraction": t.get("data_wait_fraction"),
                      "device_memory_peak_bytes": t.get("device_memory_peak_bytes"), "blocking_syncs": t.get("blocking_syncs"),
                      "loss_scale": t.get("loss_scale"), "device_pool": t.get("device_pool")}))' \
          "$RES/$name/telemetry.jsonl" "$name" >>"$RES/matrix.jsonl"
      fi
      if [ -n "$WHEELS" ]; then
        name="ul_matrix_${prec}_b$b"
        PYTHONPATH="$HERE/pyul:${PYTHONPATH:-}" YOLO_OFFLINE=1 GPU_CHECK_ONLY="$GPU_CHECK_ONLY $name" step "$name" 75 \
          python3 "$HERE/ul_matrix.py" "$BIG2/data.yaml" "$prec" "$b" 2 "$RES/$name.json"
        [ -f "$RES/$name.json" ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["run"]=sys.argv[2]; r["peer"]="ultralytics"; print(json.dumps(r))' \
          "$RES/$name.json" "$name" >>"$RES/matrix.jsonl"
      fi
    done
  done
fi
step h2d 30 "$HERE/gpu" h2d --json "$RES/h2d.json"
if [ -x "$HERE/conformance" ] && [ -d "$HERE/../../crates/sluice-decode/tests/data" ]; then
  SLUICE_REQUIRE_NVJPEG=1 SLUICE_DECODE_TEST_DATA="$HERE/../../crates/sluice-decode/tests/data" \
    step conformance 40 "$HERE/conformance" --nocapture --test-threads 1
else
  log "no prebuilt conformance suite or no fixtures: nvjpeg conformance skipped"
fi
if [ -f "$HERE/lib/libnvjpeg.so.13" ]; then
  step decode_nvjpeg 30 "$S" bench decode --data "$DATA" --backend nvjpeg --threads 1 --json
else
  log "nvJPEG not carried: decode_nvjpeg skipped"
fi
step decode_cpu 30 "$S" bench decode --data "$DATA" --backend image --threads 16 --json
# YOLO11 and YOLO26 on the device (one epoch each; YOLO26's end-to-end loss runs on the host path, its assigner
# read counted in the telemetry): that they run there, and their step time beside yolov8n's.
for fam in yolo11n yolo26n; do
  step "train_$fam" 30 "$S" train --data "$DATA" --model "$fam" --imgsz 640 --batch 32 --epochs 1 \
    --device cuda:0 --cache ram --workers 12 --project "$RES" --name "train_$fam" --exist-ok --json
done
# Each opt-in device path passes when every step that exercised it exited 0 (and, for device NMS, its mAP equals
# the host NMS pass's); a path that passed is turned on by default in the change that commits these results.
python3 - "$RES" <<'PY' | tee -a "$RES/log.txt"
import json, os, sys
res = sys.argv[1]
rc = {}
for line in open(os.path.join(res, "steps.jsonl")):
    s = json.loads(line)
    rc[s["step"]] = s["rc"]
def metrics(name):
    try:
        v = json.loads(open(os.path.join(res, name + ".out")).read().strip().splitlines()[-1])
        return (round(v["map50"], 6), round(v["map50_95"], 6))
    except Exception:
        return None
paths = {
    "fused_step": ["train"],
    "cudnn_search": ["train"],
    "device_nms": ["train", "val_device_nms", "predict_device"],
    "gpu_timer": ["train", "val_device_nms"],
    "fused_ciou": ["train", "val_device_nms", "smoke"],
    "fused_bce": ["train", "val_device_nms", "smoke"],
    "fused_pool": ["train", "smoke"],
}
out = {}
for path, steps in paths.items():
    ran = {s: rc.get(s) for s in steps}
    ok = all(r == 0 for r in ran.values())
    if path == "device_nms":
        dev, host = metrics("val_device_nms"), metrics("val_host_nms")
        ok = ok and dev is not None and dev == host
        ran["same mAP as host NMS"] = [dev, host]
    out[path] = {"passed": ok, "steps": ran}
    print(f"device path {path}: {'passed' if ok else 'FAILED or not run'} {ran}")
json.dump(out, open(os.path.join(res, "paths.json"), "w"), indent=1)
PY
cat "$RES/steps.jsonl"
log "done in $(( $(date +%s) - START ))s"
