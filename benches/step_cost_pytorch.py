"""Peer side of benches/step_cost_vs_pytorch.sh: the cost ledger of one Ultralytics 8.4.190 training step of a YOLO
detection model (and one validation batch), every aten op the step dispatches, recorded with a TorchDispatchMode
(the real input and output shapes and dtypes) and priced by the rules below as a CUDA eager run would execute it.
`sluice bench step-cost` writes the same JSON by the same rules for Sluice's step.

    python benches/step_cost_pytorch.py --model yolov8n --imgsz 640 --batch 32 --amp f32 --optimizer sgd \
        --json OUT.json [--device cpu|cuda]

Run it with the peers' venv (torch, ultralytics 8.4.190, torchvision). It sets YOLO_OFFLINE=1 and, unless set, a
YOLO_CONFIG_DIR in a temporary folder; OMP_NUM_THREADS (default: all cores) sets torch's threads. At 640, batch 32 a
f32 run takes about a minute and a half on two cores and 8 GB of memory; fp16 on a CPU without native fp16
arithmetic (most x86 CPUs) takes several times longer.

The step (BaseTrainer._do_train and optimizer_step of 8.4.190):
  model      DetectionModel("<model>.yaml", nc=80) after torch.manual_seed(0), no weights; model.args = the default
             cfg (loss gains); `.dfl` frozen, as the trainer always does; channels_last, as the trainer makes it on
             CUDA (kept on the CPU so the strides, and so the copies that `.contiguous()` makes, are CUDA's).
  input      a float32 batch (B, 3, imgsz, imgsz) in [0, 1] from torch.rand with a generator seeded 0; 8 boxes per
             image i (j = 0..7): class (8i + j) % 80, normalized xywh (0.1 + 0.1j, 0.2 + 0.07(i % 8),
             0.08 + 0.01(j % 3), 0.1), as the batch dict (batch_idx, cls, bboxes). Preprocessing (uint8 to float or
             to half) is outside the ledger.
  warm-up    one untracked step and one untracked validation batch first (optimizer moments, the EMA, the
             criterion and the head's anchors exist afterwards). With fp16, while GradScaler skips the warm-up step
             (inf gradients: a fresh model overflows fp16 at its initial scale 2^16), its scale is divided by 16 more
             and the warm-up repeated, at most 5 times, so that the recorded step is one that steps.
  forward    preds = model(img) in train mode, under the trainer's autocast (none for f32, fp16 for fp16, bf16 for
             bf16).
  loss       model.loss(batch, preds) (v8DetectionLoss: TAL assigner, BCE, CIoU, DFL; returns loss * B), then
             loss.sum(), under the same autocast, and the trainer's per-batch bookkeeping: the running mean of the
             three loss items (as at batch index 1) and the progress bar's float() of each (three host reads).
  backward   scaler.scale(loss).backward(); GradScaler enabled only for fp16.
  optimizer  scaler.unscale_, clip_grad_norm_(model.parameters(), 10.0), scaler.step, scaler.update, zero_grad.
             Built by BaseTrainer.build_optimizer (groups: weights with decay 5e-4 * B * accumulate / 64, BN
             weights, biases; SGD lr 0.01 momentum 0.937 Nesterov; AdamW lr 0.002 betas (0.937, 0.999)). On CUDA
             torch's SGD and clip_grad_norm_ default to the foreach (multi-tensor) kernels and Ultralytics builds
             AdamW with fused=True; on the CPU they default to per-tensor loops, so the ledger passes foreach=True
             (SGD, clip) and fused=True (AdamW) to record the CUDA step. At B = 32 Ultralytics accumulates
             round(64 / B) = 2 batches per optimizer step; the ledger counts one optimizer step per step.
  ema        ModelEMA.update(model) (one _foreach_lerp_ over the EMA's floating state).
  val        one batch as the trainer's validator runs it (under inference_mode): the EMA model, float, eval; the
             same batch (Ultralytics' val loader holds 2 * B images), half when amp is on (as on CUDA: on a CPU
             Ultralytics validates in f32), forward and the validator's loss under autocast fp16 (fp16 for bf16 runs
             too: the validator asks autocast for its default dtype), then nms.non_max_suppression(conf 0.001,
             iou 0.7, nc 0, multi_label=True, max_det 300) with torchvision's NMS. update_metrics (matching, on the
             host) is left out. An untrained model scores every anchor below conf 0.001, so the NMS does little.
  On the CPU amp runs under torch.autocast("cpu"), whose op lists differ from CUDA's: CUDA autocast runs softmax,
  sum, pow, exp, log, BCE-with-logits and a few more in fp32 (casting fp16 inputs up), CPU autocast leaves most of
  them in the input dtype, so the fp16 loss phase records fewer casts and fewer fp32 bytes than a CUDA run. The
  JSON's device_model says which.

What each aten op costs (the same rules as `sluice bench step-cost`):
  views      an op that only aliases (func.is_view, or every output aliases an input without writing it: view,
             reshape as a view, expand, permute, transpose, t, slice, select, unsqueeze, squeeze, as_strided, alias,
             detach, _unsafe_view, _reshape_alias, split, chunk, unbind, and the in-place metadata ops squeeze_,
             unsqueeze_, transpose_, t_, as_strided_, detach_) is not counted at all; nor are profiler:: ops.
  records    every other op is one record: op (the aten name with its overload, e.g. aten::add.Tensor),
             dtype (of its first tensor output, else of its first tensor input: f32 f16 bf16 f64 i64 i32 i16 i8 u8
             bool), shapes (the input tensors' shapes in argument order, e.g. [32,16,320,320],[16]; a tensor list
             as (shape,shape,...) up to 4 tensors, else (N tensors); an absent optional in a list as None).
  launches   1 for each op that reads or writes tensor data, with these exceptions:
             - allocation and metadata only (empty, empty_like, empty_strided, empty_permuted, new_empty,
               new_empty_strided, resize_, resize_as_, set_): 0;
             - an op whose outputs (fresh and written-in-place together) hold no element: 0 (CUDA kernels return
               early on empty tensors), unless it is a host read;
             - lift_fresh (torch.tensor(data, device=...)): a host-to-device copy: 1 launch, its bytes written,
               1 allocation;
             - _foreach_* ops, _amp_foreach_non_finite_check_and_unscale_ and the fused optimizers (_fused_adam_,
               _fused_adamw_, _fused_sgd_): the kernels of ATen's multi_tensor_apply, simulated exactly: tensors in
               list order, empty ones skipped, each split in chunks of 65536 elements, one block per chunk; a
               launch when the blocks reach 2240 or the tensors reach the depth's limit (770, 448, 336, 252, 210 for
               depth 1..5; 672, 448, 336, 252, 210 for ScalarList overloads) on the last chunk of a tensor, a
               tensor whose chunks straddle a launch is carried into the next, and a final launch for what is
               left. These are the limits of CUDA >= 12.1 builds on sm_70+ (32 KB kernel arguments; the 4 KB limits
               are 110, 64, 48, 36, 30 tensors and 320 blocks). Depth: the number of tensor lists, plus one for the
               result list of an out-of-place op; fused Adam(W) depth 4 (5 with amsgrad; state_steps ride along),
               fused SGD 3 with momentum buffers, else 2. _foreach_norm adds 2 launches (zeroing its two scratch
               buffers) and ceil(n / 3200) cleanup kernels (400 before CUDA 13). Lists whose tensors do not share
               one dtype (the fast route's condition) cost one launch per non-empty tensor instead.
  host_reads device-to-host synchronizations, 1 each, on top of their launch: _local_scalar_dense (item(),
             float(), int(), bool() of a tensor), nonzero, _unique2, unique_dim, unique_consecutive, masked_select,
             equal, repeat_interleave.Tensor without output_size, torchvision::nms, and index / index_put_ /
             _index_put_impl_ with a bool or uint8 index (CUDA turns the mask into indices with a nonzero).
  bytes_read for every tensor input, its distinct elements (the product of the sizes of the dims with a non-zero
             stride: a broadcast input is read once) times the element size; a tensor list counts every tensor.
             A tensor the op writes in place is read too, except for the write-only ops (fill_, zero_, copy_'s
             destination, the random fills, _foreach_zero_, _foreach_copy_'s destination) and out= arguments.
             The *_like and new_* factories (zeros_like, ones_like, full_like, new_full, new_zeros, ...) read
             nothing. Gathers (index.Tensor, gather, index_select, take, embedding) read as many elements of their
             source as they write, plus their index tensors. Allocation-only ops read nothing.
  bytes_written for every fresh output and every tensor written in place (or through out=), numel times the element
             size. Sparse writes (index_put_, _index_put_impl_, scatter_, scatter_add_, scatter_reduce_,
             index_copy_, index_add_) write only the indexed elements (the indexed positions times the size of the
             dims that are not indexed; index.numel for the scatters; source.numel for index_copy_ / index_add_),
             read their values / source as many times, their index tensors, and, when they accumulate, the indexed
             elements of the destination. The fused Adam(W) writes params and moments, and the grads only when
             it is given a grad_scale.
  allocs     each fresh output (not a view, not a tensor written in place or through out=) with at least one
             element: 1, and alloc_bytes its numel times the element size. Scratch memory inside a kernel (cuDNN
             workspaces, sort buffers) is not counted.
  Scalars and Python numbers cost nothing.

Output: --json OUT.json gets {"tool": "pytorch", "version", "model", "imgsz", "batch", "amp", "optimizer",
"device_model", "phases": [{"phase", "ops", "launches", "bytes_read", "bytes_written", "allocs", "alloc_bytes",
"host_reads"} for forward, loss, backward, optimizer, ema, val], "train_total" (the five training phases summed,
"phase": "train"), "top_by_bytes" and "top_by_count" (20 rows each: {"phase", "op", "dtype", "shapes", "count",
"launches", "bytes"} grouped by (phase, op, dtype, shapes), bytes = read + written, ties by (phase, op, shapes)).
stdout gets a short summary.

--device cuda (when a GPU exists) runs the same step on the GPU with CUDA autocast and GradScaler("cuda") and adds
"cuda_kernels" to each phase: the CUDA kernels torch.profiler sees in it (memcpy and memset left out). That path
is small and has not been run on a GPU yet.
"""
import argparse
import collections
import contextlib
import json
import math
import os
import sys
import tempfile

os.environ.setdefault("YOLO_OFFLINE", "1")
if "YOLO_CONFIG_DIR" not in os.environ:
    os.environ["YOLO_CONFIG_DIR"] = tempfile.mkdtemp(prefix="ultralytics_cfg_")

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

PHASES = ("forward", "loss", "backward", "optimizer", "ema", "val")
TRAIN_PHASES = PHASES[:5]
FIELDS = ("ops", "launches", "bytes_read", "bytes_written", "allocs", "alloc_bytes", "host_reads")

DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "bool"}

# multi_tensor_apply's limits (ATen/native/cuda/MultiTensorApply.cuh, 32 KB kernel arguments) and _foreach_norm's
# cleanup batch (ATen/native/cuda/foreach_reduce.cuh, CUDA 13 builds).
MTA_CHUNK = 65536
MTA_MAX_BLOCKS = 2240
MTA_MAX_TENSORS = (770, 448, 336, 252, 210)
MTA_MAX_TENSORS_SCALARLIST = (672, 448, 336, 252, 210)
NORM_CLEANUP_TENSORS = 3200

VIEW_OPS = {"aten::_unsafe_view", "aten::_reshape_alias", "aten::alias", "aten::detach", "aten::squeeze_",
            "aten::unsqueeze_", "aten::transpose_", "aten::t_", "aten::as_strided_", "aten::detach_"}
ALLOC_ONLY = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted", "aten::new_empty",
              "aten::new_empty_strided", "aten::resize_", "aten::resize_as_", "aten::set_"}
HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::_unique2", "aten::unique_dim",
              "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::masked_select", "aten::equal",
              "torchvision::nms"}
WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::copy_", "aten::normal_", "aten::uniform_", "aten::random_",
              "aten::bernoulli_", "aten::exponential_", "aten::geometric_", "aten::cauchy_", "aten::log_normal_",
              "aten::_foreach_zero_", "aten::_foreach_copy_"}
NO_READ = {"aten::new_full", "aten::new_zeros", "aten::new_ones", "aten::zeros_like", "aten::ones_like",
           "aten::full_like", "aten::rand_like", "aten::randn_like", "aten::randint_like"}
GATHERS = {"aten::index", "aten::gather", "aten::index_select", "aten::take", "aten::embedding"}
BOOL_INDEXED = {"aten::index", "aten::index_put_", "aten::_index_put_impl_"}
INDEX_PUTS = {"aten::index_put_", "aten::_index_put_impl_"}
SCATTERS = {"aten::scatter_", "aten::scatter_add_", "aten::scatter_reduce_"}
INDEX_SOURCE = {"aten::index_copy_", "aten::index_add_"}
FUSED_OPTIM = {"aten::_fused_adam_", "aten::_fused_adamw_", "aten::_fused_sgd_"}
COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key


def nbytes(t):
    return t.numel() * t.element_size()


def distinct_bytes(t):
    """Bytes of the distinct elements of t: dims with stride 0 (broadcast) count once."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return 0
        if stride != 0:
            n *= size
    return n * t.element_size()


def shape_str(t):
    return "None" if t is None else "[" + ",".join(str(s) for s in t.shape) + "]"


def is_tensor_list(v):
    return isinstance(v, (list, tuple)) and len(v) > 0 and any(isinstance(x, torch.Tensor) for x in v) and all(
        x is None or isinstance(x, torch.Tensor) for x in v)


def mta_launches(numels, depth, scalarlist=False):
    """Kernel launches of ATen's multi_tensor_apply over tensors of these sizes (see the header)."""
    max_tensors = (MTA_MAX_TENSORS_SCALARLIST if scalarlist else MTA_MAX_TENSORS)[min(depth, 5) - 1]
    launches = blocks = tensors = 0
    for n in numels:
        if n == 0:
            continue
        tensors += 1
        chunks = -(-n // MTA_CHUNK)
        for c in range(chunks):
            blocks += 1
            if (tensors == max_tensors and c == chunks - 1) or blocks == MTA_MAX_BLOCKS:
                launches += 1
                blocks = 0
                tensors = 0 if c == chunks - 1 else 1
    return launches + (1 if blocks else 0)


def flat_tensors(v):
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, torch.Tensor)]
    return []


class Ledger(TorchDispatchMode):
    """Prices every aten op dispatched while a phase is set; rows grouped by (phase, op, dtype, shapes)."""

    def __init__(self):
        super().__init__()
        self.phase = None
        self.rows = collections.defaultdict(lambda: dict.fromkeys(FIELDS, 0))
        self.extra = collections.defaultdict(dict)  # phase -> extra fields (cuda_kernels)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Under inference_mode (the validator's) the mode sees composite ops (conv2d, item, ...) before autograd
        # decomposes them; decompose those that have no CPU or CUDA kernel of their own here (C++ decomposition,
        # as in training), so that every phase records the ops the kernels run.
        name = func.name()
        if _has_kernel(name, COMPOSITE) and not _has_kernel(name, "CPU") and not _has_kernel(name, "CUDA"):
            with self:
                return func._op_dk(COMPOSITE, *args, **kwargs)
        out = func(*args, **kwargs)
        if self.phase is not None:
            self.record(func, args, kwargs, out)
        return out

    def record(self, func, args, kwargs, out):
        schema = func._schema
        base = schema.name
        if base.startswith("profiler::"):
            return
        name = base + ("." + schema.overload_name if schema.overload_name else "")
        bound = []  # (argument schema, value)
        for i, a in enumerate(schema.arguments):
            if i < len(args):
                bound.append((a, args[i]))
            elif a.name in kwargs:
                bound.append((a, kwargs[a.name]))
        by_name = {a.name: v for a, v in bound}
        mutated = [(a, v) for a, v in bound if a.alias_info is not None and a.alias_info.is_write]
        returns = list(schema.returns)
        outs = list(out) if len(returns) > 1 and isinstance(out, (tuple, list)) else [out]
        fresh, aliased = [], []
        for r, o in zip(returns, outs):
            (aliased if r.alias_info is not None else fresh).extend(flat_tensors(o))

        if base == "aten::lift_fresh" or base == "aten::lift_fresh_copy":
            pass  # a host-to-device copy on CUDA, priced below
        elif func.is_view or base in VIEW_OPS or (not mutated and returns and fresh == [] and all(
                r.alias_info is not None and not r.alias_info.is_write for r in returns)):
            return

        inputs = [(a, v) for a, v in bound if isinstance(v, torch.Tensor) or is_tensor_list(v)]
        first_in = next((t for _, v in inputs for t in flat_tensors(v)), None)
        first_out = next(iter(fresh + aliased), None)
        dt = first_out if first_out is not None else first_in
        dtype = DTYPES.get(dt.dtype, str(dt.dtype).replace("torch.", "")) if dt is not None else "-"
        parts = []
        for _, v in inputs:
            if isinstance(v, torch.Tensor):
                parts.append(shape_str(v))
            elif len(v) <= 4:
                parts.append("(" + ",".join(shape_str(x) for x in v) + ")")
            else:
                parts.append(f"({len(v)} tensors)")
        shapes = ",".join(parts)

        read = written = allocs = alloc_bytes = host = 0
        launches = 1
        if base in HOST_READS:
            host = 1
        elif base == "aten::repeat_interleave" and schema.overload_name.startswith("Tensor") and \
                by_name.get("output_size") is None:
            host = 1
        elif base in BOOL_INDEXED and any(
                isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8)
                for t in (by_name.get("indices") or [])):
            host = 1
        write_only = base in WRITE_ONLY
        for a, v in inputs:
            is_mut = a.alias_info is not None and a.alias_info.is_write
            if is_mut and (write_only or a.kwarg_only):
                continue
            if base in NO_READ:
                break  # factories that take only the dtype, device and shape of their input
            if base in GATHERS and a.name in ("self", "weight"):
                continue  # the source of a gather: priced by its output below
            if (base in INDEX_PUTS or base in SCATTERS or base in INDEX_SOURCE) and a.name in (
                    "self", "values", "src", "source"):
                continue  # priced by the indexed elements below
            read += sum(distinct_bytes(t) for t in flat_tensors(v))
        for _, v in mutated:
            written += sum(nbytes(t) for t in flat_tensors(v))
        for t in fresh:
            written += nbytes(t)
            if t.numel() > 0:
                allocs += 1
                alloc_bytes += nbytes(t)
        if base in GATHERS:
            read += sum(nbytes(t) for t in fresh)
        elif base in INDEX_PUTS:
            dst, indices, values = by_name["self"], by_name["indices"], by_name["values"]
            n = indexed_elements(dst, indices)
            written = n * dst.element_size()
            read += n * values.element_size() if values.numel() > 1 else distinct_bytes(values)
            if by_name.get("accumulate", False):
                read += n * dst.element_size()
        elif base in SCATTERS:
            dst, index = by_name["self"], by_name["index"]
            n = index.numel()
            written = n * dst.element_size()
            src = by_name.get("src")
            if isinstance(src, torch.Tensor):
                read += n * src.element_size()
            if base != "aten::scatter_":
                read += n * dst.element_size()
        elif base in INDEX_SOURCE:
            dst, source = by_name["self"], by_name["source"]
            n = source.numel()
            written = n * dst.element_size()
            read += nbytes(source) + (n * dst.element_size() if base == "aten::index_add_" else 0)

        if base in ("aten::lift_fresh", "aten::lift_fresh_copy"):
            t = flat_tensors(out)[0]
            read, written, allocs, alloc_bytes = 0, nbytes(t), (1 if t.numel() else 0), nbytes(t)
        elif base in ALLOC_ONLY:
            launches = read = written = 0
        elif base.startswith("aten::_foreach_") or base in FUSED_OPTIM or \
                base == "aten::_amp_foreach_non_finite_check_and_unscale_":
            launches = foreach_launches(base, schema, bound, fresh)
            if base in ("aten::_fused_adam_", "aten::_fused_adamw_") and by_name.get("grad_scale") is None:
                written -= sum(nbytes(t) for t in by_name["grads"])
        elif sum(t.numel() for t in fresh) + sum(t.numel() for _, v in mutated for t in flat_tensors(v)) == 0 \
                and not host:
            launches = 0


        row = self.rows[(self.phase, name, dtype, shapes)]
        row["ops"] += 1
        row["launches"] += launches
        row["bytes_read"] += read
        row["bytes_written"] += written
        row["allocs"] += allocs
        row["alloc_bytes"] += alloc_bytes
        row["host_reads"] += host

    @contextlib.contextmanager
    def in_phase(self, phase, profile_cuda=False):
        prof = None
        if profile_cuda:  # --device cuda only: count the real kernels of the phase
            from torch.profiler import ProfilerActivity, profile

            torch.cuda.synchronize()
            prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        self.phase = phase
        try:
            yield
        finally:
            self.phase = None
            if prof is not None:
                torch.cuda.synchronize()
                prof.__exit__(None, None, None)
                from torch.autograd import DeviceType

                kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA
                           and not e.name.startswith(("Memcpy", "Memset", "cudaMem"))]
                self.extra[phase]["cuda_kernels"] = self.extra[phase].get("cuda_kernels", 0) + len(kernels)


def indexed_elements(dst, indices):
    """Elements of dst that dst[indices] selects: indexed positions times the sizes of the dims not indexed."""
    shapes, rest, d = [], 1, 0
    for idx in indices:
        if idx is None:
            rest *= dst.shape[d]
            d += 1
        elif idx.dtype in (torch.bool, torch.uint8):
            shapes.append((int(idx.count_nonzero()),))
            d += idx.dim()
        else:
            shapes.append(tuple(idx.shape))
            d += 1
    for s in dst.shape[d:]:
        rest *= s
    return (math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1) * rest


def foreach_launches(base, schema, bound, fresh):
    lists = [(a, v) for a, v in bound if is_tensor_list(v)]
    by_name = dict((a.name, v) for a, v in bound)
    if not lists:
        return 0
    first = [t for t in lists[0][1] if t is not None]
    numels = [t.numel() for t in first]
    if base in ("aten::_fused_adam_", "aten::_fused_adamw_"):
        return mta_launches(numels, 5 if by_name.get("max_exp_avg_sqs") else 4)
    if base == "aten::_fused_sgd_":
        return mta_launches(numels, 3 if by_name.get("momentum_buffer_list") else 2)
    dtypes = {t.dtype for _, v in lists for t in v if t is not None}
    if len(dtypes) > 1 and base != "aten::_foreach_norm":  # not the fast route: one kernel per tensor
        return sum(1 for n in numels if n)
    if base == "aten::_foreach_norm":
        n = sum(1 for x in numels if x)
        return 2 + mta_launches(numels, 1) + -(-n // NORM_CLEANUP_TENSORS)
    depth = len(lists) + (1 if fresh else 0)
    scalarlist = "ScalarList" in schema.overload_name or any(
        isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float, complex)) for x in v)
        for _, v in bound)
    return mta_launches(numels, depth, scalarlist)


def make_batch(b, imgsz):
    g = torch.Generator().manual_seed(0)
    img = torch.rand(b, 3, imgsz, imgsz, generator=g)
    idx, cls, boxes = [], [], []
    for i in range(b):
        for j in range(8):
            idx.append(float(i))
            cls.append([float((i * 8 + j) % 80)])
            boxes.append([0.1 + 0.1 * j, 0.2 + 0.07 * (i % 8), 0.08 + 0.01 * (j % 3), 0.1])
    return {"img": img, "batch_idx": torch.tensor(idx), "cls": torch.tensor(cls), "bboxes": torch.tensor(boxes)}


def build_optimizer(model, name, batch):
    """Ultralytics' own parameter groups, rebuilt with the implementation a CUDA run gets."""
    import types

    from ultralytics.engine.trainer import BaseTrainer

    accumulate = max(round(64 / batch), 1)
    decay = 5e-4 * batch * accumulate / 64
    lr = 0.01 if name == "SGD" else 0.002
    stub = types.SimpleNamespace(args=types.SimpleNamespace(), data={"nc": 80})
    opt = BaseTrainer.build_optimizer(stub, model, name=name, lr=lr, momentum=0.937, decay=decay)
    keep = ("params", "lr", "momentum", "nesterov", "betas", "weight_decay", "param_group")
    groups = [{k: g[k] for k in keep if k in g} for g in opt.param_groups]
    impl = {"fused": True} if name == "AdamW" else {"foreach": True}
    return type(opt)(groups, **impl)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="yolov8n")
    p.add_argument("--imgsz", type=int, default=640)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--amp", choices=("f32", "fp16", "bf16"), default="f32")
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--json", help="where the JSON goes")
    p.add_argument("--rows", metavar="PHASE", action="append", default=[],
                   help="also print every (op, dtype, shapes) row of PHASE (repeatable)")
    args = p.parse_args()

    import torchvision  # noqa: F401  (the validator imports it: non_max_suppression then uses its NMS)
    import ultralytics
    from ultralytics.cfg import get_cfg
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import nms
    from ultralytics.utils.torch_utils import ModelEMA

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no GPU here")
    amp_dtype = {"f32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.amp]
    amp = amp_dtype is not None

    torch.manual_seed(0)
    model = DetectionModel(f"{args.model}.yaml", nc=80, verbose=False)
    model.args = get_cfg()
    model = model.to(dev).to(memory_format=torch.channels_last)
    for k, v in model.named_parameters():
        if ".dfl" in k:
            v.requires_grad = False
    model.train()
    ema = ModelEMA(model)
    model.criterion = model.init_criterion()
    opt = build_optimizer(model, {"sgd": "SGD", "adamw": "AdamW"}[args.optimizer], args.batch)
    scaler = torch.amp.GradScaler(dev.type, enabled=args.amp == "fp16")
    stepped = []
    opt.register_step_post_hook(lambda *a: stepped.append(1))

    batch = {k: v.to(dev) for k, v in make_batch(args.batch, args.imgsz).items()}
    vbatch = dict(batch)
    if amp:  # the validator's preprocess on CUDA: a half input when amp is on
        vbatch["img"] = batch["img"].half()

    def train_autocast():
        return torch.autocast(dev.type, dtype=amp_dtype) if amp else contextlib.nullcontext()

    def val_autocast():
        return torch.autocast(dev.type, dtype=torch.float16) if amp else contextlib.nullcontext()

    ledger = Ledger()
    state = {"tloss": None}

    def phase(name):
        return ledger.in_phase(name, profile_cuda=cuda)

    def train_step(recorded):
        ctx = phase if recorded else (lambda name: contextlib.nullcontext())
        with ctx("forward"), train_autocast():
            preds = model(batch["img"])
        with ctx("loss"), train_autocast():
            loss, items = model.loss(batch, preds)
            loss = loss.sum()
            t = state["tloss"]
            state["tloss"] = items if t is None else {k: (t[k] * 1 + v) / 2 for k, v in items.items()}
            "".join("%11.4g" % v for v in state["tloss"].values())  # the progress bar's float() reads
        with ctx("backward"):
            scaler.scale(loss).backward()
        with ctx("optimizer"):
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0, foreach=True)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        with ctx("ema"):
            ema.update(model)

    def val_batch(recorded):
        m = ema.ema.float().eval()
        vloss = {k: torch.zeros_like(v) for k, v in state["tloss"].items()}
        ctx = phase("val") if recorded else contextlib.nullcontext()
        with torch.inference_mode(), ctx:
            with val_autocast():
                preds = m(vbatch["img"])
                for k, v in m.loss(vbatch, preds)[1].items():
                    vloss[k] += v
            out = nms.non_max_suppression(preds, 0.001, 0.7, nc=0, multi_label=True, agnostic=False,
                                          max_det=300, end2end=False, rotated=False)
        return sum(len(x) for x in out)

    for _ in range(5 if args.amp == "fp16" else 1):
        stepped.clear()
        train_step(False)
        if stepped:
            break
        # fp16 gradients of a fresh model overflow at GradScaler's initial scale (2^16) at this size; GradScaler
        # halves the scale on each skipped step, the warm-up divides it by 16 more to reach a stepping scale in a
        # few steps instead of a few dozen (the scale's value changes no op, only whether the step is taken)
        scaler.update(scaler.get_scale() / 16)
    model.train()
    val_batch(False)
    model.train()
    stepped.clear()
    with ledger:
        train_step(True)
        if not stepped:
            print("warning: GradScaler skipped the recorded optimizer step (inf/nan gradients)", file=sys.stderr)
        kept = val_batch(True)

    totals = {ph: dict.fromkeys(FIELDS, 0) for ph in PHASES}
    for (ph, *_), row in ledger.rows.items():
        for f in FIELDS:
            totals[ph][f] += row[f]
    phases = []
    for ph in PHASES:
        rec = {"phase": ph, **totals[ph]}
        rec.update(ledger.extra.get(ph, {}))
        phases.append(rec)
    train = {"phase": "train", **{f: sum(totals[ph][f] for ph in TRAIN_PHASES) for f in FIELDS}}
    if cuda:
        train["cuda_kernels"] = sum(ledger.extra.get(ph, {}).get("cuda_kernels", 0) for ph in TRAIN_PHASES)

    groups = [{"phase": ph, "op": op, "dtype": dt, "shapes": sh, "count": r["ops"], "launches": r["launches"],
               "bytes": r["bytes_read"] + r["bytes_written"]} for (ph, op, dt, sh), r in ledger.rows.items()]

    def tie(g):
        return (g["phase"], g["op"], g["shapes"], g["dtype"])

    top_bytes = sorted(groups, key=lambda g: (-g["bytes"], *tie(g)))[:20]
    top_count = sorted(groups, key=lambda g: (-g["count"], *tie(g)))[:20]
    if cuda:
        device_model = "cuda-eager (recorded on cuda)"
    elif amp:
        device_model = (f"cuda-eager (recorded on cpu under CPU autocast {args.amp}, whose op lists differ from "
                        "CUDA's: CUDA runs softmax, sum, pow, exp, log, BCE in fp32)")
    else:
        device_model = "cuda-eager (recorded on cpu)"
    result = {"tool": "pytorch", "version": f"{torch.__version__} / ultralytics {ultralytics.__version__}",
              "model": args.model, "imgsz": args.imgsz, "batch": args.batch, "amp": args.amp,
              "optimizer": args.optimizer, "device_model": device_model, "phases": phases, "train_total": train,
              "top_by_bytes": top_bytes, "top_by_count": top_count}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")

    print(f"== {args.model} {args.imgsz} b{args.batch} {args.amp} {args.optimizer}: {device_model}")
    scale = f"; GradScaler scale {scaler.get_scale():g}" if scaler.is_enabled() else ""
    print(f"   {result['version']}; val kept {kept} boxes after NMS{scale}")
    hdr = f"{'phase':<10}{'ops':>7}{'launches':>9}{'read MB':>10}{'written MB':>11}{'allocs':>7}{'alloc MB':>10}"
    print(hdr + f"{'host':>6}" + (f"{'kernels':>9}" if cuda else ""))
    for rec in phases + [train]:
        line = (f"{rec['phase']:<10}{rec['ops']:>7}{rec['launches']:>9}{rec['bytes_read'] / 1e6:>10.1f}"
                f"{rec['bytes_written'] / 1e6:>11.1f}{rec['allocs']:>7}{rec['alloc_bytes'] / 1e6:>10.1f}"
                f"{rec['host_reads']:>6}")
        print(line + (f"{rec.get('cuda_kernels', 0):>9}" if cuda else ""))
    print("top 10 by bytes moved:")
    for g in top_bytes[:10]:
        print(f"  {g['phase']:<9} {g['op']:<38} {g['dtype']:<5} x{g['count']:<4} {g['bytes'] / 1e6:>9.1f} MB  "
              f"{g['shapes'][:70]}")
    for ph in args.rows:
        print(f"rows of {ph} (count, launches, read, written, allocs, host reads):")
        for (p_, op, dt, sh), r in sorted(ledger.rows.items()):
            if p_ == ph:
                print(f"  {r['ops']:>4} {r['launches']:>4} {r['bytes_read']:>11} {r['bytes_written']:>11} "
                      f"{r['allocs']:>4} {r['host_reads']:>2}  {op} {dt} {sh}")


if __name__ == "__main__":
    main()
