//! Training-mode BatchNorm fused with SiLU: one pass forward, one pass backward, as a candle custom op.
//!
//! YOLOv8's unit is Conv → BatchNorm → SiLU. Composed from candle primitives, the BatchNorm+SiLU part is about
//! fifteen element-wise and reduction ops, each a full sweep over the activation with its own allocation, forward
//! and again backward. Here it is:
//!
//! * [`batch_norm_silu_train`]: per-channel batch statistics (one sweep, f64 accumulators, shifted by the
//!   channel's first value so the sums stay well conditioned), then one sweep that normalises, applies
//!   `γ`/`β` and SiLU. Its backward recomputes `z = γ·x̂ + β` from the input and the saved statistics, sweeps once
//!   to get `dz = dy·SiLU'(z)` and the two per-channel sums, and once more to turn `dz` into `dx` in place.
//!   The batch mean and biased variance come back detached so the caller can update running statistics.
//! * [`affine_silu`]: the eval-mode `SiLU(x·scale[c] + shift[c])` in one sweep (with a backward too, since candle
//!   builds the graph for inference as well when the parameters are variables).
//!
//! Both run on contiguous f32/f64 CPU storage and parallelise over `(n, c)` planes with rayon's global pool (the
//! pool candle's own CPU kernels use, so the two never oversubscribe each other). With the `cuda` feature,
//! [`batch_norm_silu_train`] on f32 CUDA tensors runs the same sweeps as device kernels (`norm/cuda.rs`), its
//! statistics staying on the device. Anything else (another device or dtype) falls back to the composed candle
//! ops, which are also public ([`batch_norm_silu_train_composed`], [`affine_silu_composed`]) as the reference the
//! tests and benches compare against.
//!
//! The per-plane loops are compiled for AVX-512 and AVX2+FMA as well as baseline x86-64 and picked at run time
//! (`multiversion`). No clone contracts `a·b + c` into an FMA or reorders a sum, so every clone gives the same bits.
//!
//! Files: `train.rs` (the training op), `affine.rs` (the eval op), `fold.rs` (BatchNorm folded into a conv weight),
//! `planes.rs` (the per-plane loops both ops share), `math.rs` (the element types and the f32 `exp`/`ln`), and
//! `cuda.rs` (the device kernels, feature `cuda`). This file holds the public entry points' re-exports and the
//! checks and storage access the ops (and [`crate::pool`], [`crate::dfl`], [`crate::loss`], [`crate::optim`]) share.

mod affine;
#[cfg(feature = "cuda")]
mod cuda;
mod fold;
mod math;
mod planes;
mod train;

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Storage, Tensor, WithDType};

pub use affine::{affine_silu, affine_silu_composed};
pub use fold::{batch_norm_eval_affine, fold_batch_norm};
pub(crate) use math::Elem;
pub(crate) use planes::silu_in_place;
pub use train::{batch_norm_silu_train, batch_norm_silu_train_composed};

/// Planes smaller than this are grouped into one rayon task.
const MIN_TASK_ELEMS: usize = 16 * 1024;

/// The contiguous part of a storage a layout describes, or an error naming the op and the operand.
pub(crate) fn contiguous<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [T]> {
    let v = T::cpu_storage_as_slice(s)?;
    match l.contiguous_offsets() {
        Some((a, b)) if b <= v.len() => Ok(&v[a..b]),
        _ => candle_core::bail!("{op}: {what} is not contiguous (layout {l:?})"),
    }
}

/// Runs `f` on the contiguous CPU data of `t` (an error for another device or a strided layout).
pub(crate) fn with_cpu_slice<T: WithDType, R>(
    t: &Tensor,
    op: &str,
    what: &str,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => Ok(f(contiguous::<T>(s, layout, op, what)?)),
        _ => candle_core::bail!("{op}: {what} is not on the CPU"),
    }
}

/// Whether the fused CPU kernels handle this tensor (CPU storage, f32 or f64).
/// Off the CPU (and on it while the op ledger models a CUDA device, [`crate::ledger::model_cuda`]) they are candle's
/// composed ops, as on CUDA.
pub(crate) fn fused_supported(x: &Tensor) -> bool {
    crate::ledger::host_paths(x.device()) && matches!(x.dtype(), DType::F32 | DType::F64)
}

/// `(n, c, h·w)` of an NCHW shape, or an error naming the op.
pub(crate) fn nchw(shape: &Shape, op: &str) -> Result<(usize, usize, usize, usize)> {
    match shape.dims() {
        &[n, c, h, w] => Ok((n, c, h, w)),
        d => candle_core::bail!("{op}: expected an NCHW tensor, got shape {d:?}"),
    }
}

/// Checks that a per-channel parameter has shape `(c,)` and the input's dtype.
fn check_param(p: &Tensor, c: usize, dtype: DType, op: &str, what: &str) -> Result<()> {
    if p.dims() != [c] {
        candle_core::bail!("{op}: {what} has shape {:?}, expected ({c},)", p.dims());
    }
    if p.dtype() != dtype {
        candle_core::bail!("{op}: {what} is {:?}, the input {dtype:?}", p.dtype());
    }
    Ok(())
}

/// Rayon task granularity (in planes) for planes of `hw` elements.
fn min_planes(hw: usize) -> usize {
    MIN_TASK_ELEMS.div_ceil(hw.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn rejects_bad_shapes_and_dtypes() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 3, 4, 4), DType::F32, &dev).unwrap();
        let g = Tensor::ones(3, DType::F32, &dev).unwrap();
        let bad = Tensor::ones(4, DType::F32, &dev).unwrap();
        assert!(batch_norm_silu_train(&x, &bad, &g, 1e-3).is_err());
        assert!(batch_norm_silu_train(&x, &g.to_dtype(DType::F64).unwrap(), &g, 1e-3).is_err());
        assert!(affine_silu(&x.flatten_all().unwrap(), &g, &g).is_err());
        let empty = Tensor::zeros((0, 3, 4, 4), DType::F32, &dev).unwrap();
        assert!(batch_norm_silu_train(&empty, &g, &g, 1e-3).is_err());
    }
}
