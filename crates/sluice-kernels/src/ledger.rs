//! The kernels' side of candle's op ledger ([`candle_core::ledger`], `sluice bench step-cost`). The ledger records
//! a GPU step on the CPU build, so the ops must take the paths a CUDA device takes: with
//! [`set_model_cuda`] on, [`host_paths`] answers `false` for the CPU too, and the ops that pick a CPU kernel, a
//! CUDA kernel or candle's composed ops pick as on CUDA. Where the CUDA path is a kernel of its own with a CPU twin
//! (the fused BatchNorm+SiLU), the twin runs unrecorded and [`record_kernel`] enters the launches the CUDA path
//! makes. Off (the default), nothing changes.

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::ledger::{self, OpRecord};
use candle_core::{Device, Tensor};

static MODEL_CUDA: AtomicBool = AtomicBool::new(false);
static COMPOSED_BN: AtomicBool = AtomicBool::new(false);

/// Takes CUDA's op paths on the CPU (for the ledger), or not.
pub fn set_model_cuda(on: bool) {
    MODEL_CUDA.store(on, Ordering::SeqCst);
}

/// Whether the CPU takes CUDA's op paths.
pub fn model_cuda() -> bool {
    MODEL_CUDA.load(Ordering::Relaxed)
}

/// While modelling CUDA, takes candle's composed ops for the training BatchNorm+SiLU instead of its CUDA kernels
/// (the step as it ran on a device before those kernels existed; for calibrating the ledger against that run).
pub fn set_model_composed_batch_norm(on: bool) {
    COMPOSED_BN.store(on, Ordering::SeqCst);
}

/// Whether the modelled CUDA step composes the training BatchNorm+SiLU.
pub fn model_composed_batch_norm() -> bool {
    model_cuda() && COMPOSED_BN.load(Ordering::Relaxed)
}

/// Whether ops on `device` take the host kernels: on the CPU, unless [`model_cuda`].
pub fn host_paths(device: &Device) -> bool {
    device.is_cpu() && !model_cuda()
}

/// Records `launches` kernels named `name` reading `inputs` and writing fresh `outputs` (for a CPU twin run under
/// [`ledger::paused`]).
pub fn record_kernel(name: &str, launches: u64, inputs: &[&Tensor], outputs: &[&Tensor]) {
    record(name, launches, inputs, outputs, true)
}

/// [`record_kernel`] for kernels writing `written` in place (no allocation).
pub fn record_inplace(name: &str, launches: u64, inputs: &[&Tensor], written: &[&Tensor]) {
    record(name, launches, inputs, written, false)
}

fn record(name: &str, launches: u64, inputs: &[&Tensor], outputs: &[&Tensor], fresh: bool) {
    if !ledger::recording() {
        return;
    }
    let layouts: Vec<&candle_core::Layout> = inputs.iter().map(|t| t.layout()).collect();
    let read = inputs.iter().map(|t| ledger::layout_bytes(t.layout(), t.dtype())).sum();
    let written: u64 = outputs.iter().map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64).sum();
    ledger::record(OpRecord {
        phase: String::new(),
        op: name.to_string(),
        dtype: outputs.first().or(inputs.first()).map_or(candle_core::DType::F32, |t| t.dtype()),
        shapes: ledger::shapes_of(&layouts),
        launches,
        bytes_read: read,
        bytes_written: written,
        allocs: if fresh { outputs.len() as u64 } else { 0 },
        alloc_bytes: if fresh { written } else { 0 },
        host_reads: 0,
    });
}
