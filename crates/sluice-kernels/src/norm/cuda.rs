//! Training-mode BatchNorm + SiLU on a CUDA device (feature `cuda`): the same two sweeps forward and two backward
//! as the CPU op, as six small kernels compiled once per device with NVRTC. The activations are f32, or f16 / bf16
//! for mixed precision (the kernels read and write 16 bits, compute in f32 and sum in f64); the parameters and the
//! statistics are f32.
//!
//! Composed from candle's ops (the fallback before this), the block is about fifteen element-wise and reduction
//! kernels each way, and candle's reductions over a large early feature map are the slowest part of a training step
//! on an H200 (`docs/gpu-results.md`). Here:
//!
//! - **Forward.** `bn_stats_partial` sums `(x − k, (x − k)²)` per channel in f64 over a slice of the channel's `N·H·W`
//!   elements (grid: channels × slices, so small channel counts still fill the device; `k` the channel's first value,
//!   as on the CPU); `bn_stats_final` combines the slices into the mean, the biased variance, `1/σ` and the affine
//!   `a = γ/σ`, `b = β − mean·a`; `bn_silu_apply` writes `y = SiLU(x·a + b)`.
//! - **Backward.** `bn_bwd_partial` recomputes `z`, sums `dz = dy·SiLU'(z)` and `dz·(x − mean)` per channel;
//!   `bn_bwd_final` turns the sums into `dβ`, `dγ` and the coefficients of `dx = k·dz − k0 − k1·(x − mean)`, which
//!   `bn_bwd_apply` writes, recomputing `dz` instead of storing it.
//!
//! Nothing is read back to the host: the statistics stay on the device (the caller's running-statistics update
//! uses them as tensors), and every kernel runs on the device's compute stream.

use std::sync::{Arc, Mutex};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Storage, Tensor, WithDType, bail};

use crate::nvrtc::PerDevice;

const SRC: &str = include_str!("kernels.cu");

/// The kernels of one activation type (f32, f16 or bf16).
struct TypedKernels {
    stats_partial: CudaFunction,
    stats_final: CudaFunction,
    apply: CudaFunction,
    bwd_partial: CudaFunction,
    bwd_apply: CudaFunction,
}

/// The kernels of one device: per activation type, and the type-free backward reduction.
struct Kernels {
    typed: [TypedKernels; 3],
    bwd_final: CudaFunction,
}

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("batch_norm_silu_train (CUDA) {what}: {e:?}"))
}

/// The index into [`Kernels::typed`] (and the kernel-name suffix) of an activation dtype.
fn type_index(dtype: DType) -> Option<(usize, &'static str)> {
    match dtype {
        DType::F32 => Some((0, "")),
        DType::F16 => Some((1, "_f16")),
        DType::BF16 => Some((2, "_bf16")),
        _ => None,
    }
}

/// The kernels for `dev`, compiled on first use.
fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
    static KERNELS: PerDevice<Kernels> = PerDevice::new();
    KERNELS.get(dev, "batch_norm_silu_train (CUDA)", SRC, |f| {
        let typed = |suffix: &str| -> Result<TypedKernels> {
            Ok(TypedKernels {
                stats_partial: f.get(&format!("bn_stats_partial{suffix}"))?,
                stats_final: f.get(&format!("bn_stats_final{suffix}"))?,
                apply: f.get(&format!("bn_silu_apply{suffix}"))?,
                bwd_partial: f.get(&format!("bn_bwd_partial{suffix}"))?,
                bwd_apply: f.get(&format!("bn_bwd_apply{suffix}"))?,
            })
        };
        Ok(Kernels { typed: [typed("")?, typed("_f16")?, typed("_bf16")?], bwd_final: f.get("bn_bwd_final")? })
    })
}

/// Threads per block of the reductions (their shared arrays hold 256).
const BLOCK: u32 = 256;

/// `(slices per channel, elements per slice)`: enough blocks in all to fill the device several times over, but
/// no slice under 4096 elements.
fn slices(c: usize, m: usize) -> (usize, usize) {
    let s = 1024usize.div_ceil(c.max(1)).clamp(1, m.div_ceil(4096).max(1));
    (s, m.div_ceil(s))
}

fn elementwise(total: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (total.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn per_channel(c: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: (c.div_ceil(128) as u32, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }
}

fn i64_of(v: usize) -> Result<i64> {
    i64::try_from(v).map_err(|_| candle_core::Error::Msg(format!("batch_norm_silu_train (CUDA): {v} overflows")))
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("batch_norm_silu_train (CUDA): {v} overflows")))
}

/// The contiguous view of a storage in its element type `T`, or an error naming the input.
fn view<'a, T: CudaDType + WithDType>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else { bail!("batch_norm_silu_train (CUDA): {what} is not contiguous") };
    if s.dtype() != T::DTYPE {
        bail!("batch_norm_silu_train (CUDA): {what} must be {:?}, got {:?}", T::DTYPE, s.dtype());
    }
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// The f32 contiguous view of a storage (the parameters), or an error naming the input.
fn f32_view<'a>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, f32>> {
    view::<f32>(s, l, what)
}

/// What the forward leaves for the backward and the caller, all on the device.
#[derive(Debug)]
pub(super) struct DeviceStats {
    /// `[mean; C] ++ [1/σ; C]` in f64.
    saved: CudaSlice<f64>,
    /// `[mean; C] ++ [var; C]` (biased), for the caller, who takes it ([`mean_var`]): the backward does not read it.
    mv: Mutex<Option<CudaSlice<f32>>>,
    /// `[a; C] ++ [b; C]`: `z = x·a + b`.
    ab: CudaSlice<f32>,
}

/// The forward: `y` (in `x`'s dtype: f32, f16 or bf16) and the statistics; `γ` and `β` are f32.
pub(super) fn forward(
    (x, lx): (&CudaStorage, &Layout),
    (g, lg): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    dims: (usize, usize, usize),
    eps: f64,
) -> Result<(CudaStorage, DeviceStats)> {
    match x.dtype() {
        DType::F32 => forward_t::<f32>((x, lx), (g, lg), (b, lb), dims, eps),
        DType::F16 => forward_t::<half::f16>((x, lx), (g, lg), (b, lb), dims, eps),
        DType::BF16 => forward_t::<half::bf16>((x, lx), (g, lg), (b, lb), dims, eps),
        d => bail!("batch_norm_silu_train (CUDA): activations in {d:?}"),
    }
}

fn forward_t<T: CudaDType + WithDType + DeviceRepr>(
    (x, lx): (&CudaStorage, &Layout),
    (g, lg): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    (n, c, hw): (usize, usize, usize),
    eps: f64,
) -> Result<(CudaStorage, DeviceStats)> {
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let Some((ti, _)) = type_index(T::DTYPE) else { bail!("batch_norm_silu_train (CUDA): {:?}", T::DTYPE) };
    let kt = &k.typed[ti];
    let (xv, gv, bv) = (view::<T>(x, lx, "input")?, f32_view(g, lg, "gamma")?, f32_view(b, lb, "beta")?);
    let (m, total) = (n * hw, n * c * hw);
    if m == 0 {
        bail!("batch_norm_silu_train: empty batch (N·H·W = 0)");
    }
    let (s, chunk) = slices(c, m);
    // SAFETY (all allocations below): every element is written by the kernel that follows before anything reads it.
    let mut part = unsafe { stream.alloc::<f64>(2 * c * s) }.map_err(drv("allocating"))?;
    let mut saved = unsafe { stream.alloc::<f64>(2 * c) }.map_err(drv("allocating"))?;
    let mut mv = unsafe { stream.alloc::<f32>(2 * c) }.map_err(drv("allocating"))?;
    let mut ab = unsafe { stream.alloc::<f32>(2 * c) }.map_err(drv("allocating"))?;
    let mut y = unsafe { stream.alloc::<T>(total) }.map_err(drv("allocating"))?;
    let (ci, hwi, mi, chunki, si, ti) =
        (i32_of(c)?, i64_of(hw)?, i64_of(m)?, i64_of(chunk)?, i32_of(s)?, i64_of(total)?);
    let cfg = LaunchConfig { grid_dim: (c as u32, s as u32, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&kt.stats_partial);
    l.arg(&xv).arg(&mut part).arg(&ci).arg(&hwi).arg(&mi).arg(&chunki).arg(&si);
    // SAFETY: argument types match the kernel's signature (a 16-bit type for the half ones); every index is
    // bounded by the sizes passed.
    unsafe { l.launch(cfg) }.map_err(drv("stats"))?;
    let mut l = stream.launch_builder(&kt.stats_final);
    l.arg(&xv).arg(&part).arg(&gv).arg(&bv).arg(&eps).arg(&ci).arg(&hwi).arg(&mi).arg(&si);
    l.arg(&mut saved).arg(&mut mv).arg(&mut ab);
    // SAFETY: as above.
    unsafe { l.launch(per_channel(c)) }.map_err(drv("stats"))?;
    let mut l = stream.launch_builder(&kt.apply);
    l.arg(&xv).arg(&ab).arg(&mut y).arg(&ci).arg(&hwi).arg(&ti);
    // SAFETY: as above.
    unsafe { l.launch(elementwise(total)) }.map_err(drv("apply"))?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), DeviceStats { saved, mv: Mutex::new(Some(mv)), ab }))
}

/// The backward: `(dx, [dγ; C] ++ [dβ; C])` from the input, the upstream gradient (both in the activations'
/// dtype), γ (f32) and the forward's statistics; `dx` in the activations' dtype, `dγ`, `dβ` in f32.
pub(super) fn backward(x: &Tensor, grad: &Tensor, gamma: &Tensor, st: &DeviceStats) -> Result<(Tensor, Tensor)> {
    match x.dtype() {
        DType::F32 => backward_t::<f32>(x, grad, gamma, st),
        DType::F16 => backward_t::<half::f16>(x, grad, gamma, st),
        DType::BF16 => backward_t::<half::bf16>(x, grad, gamma, st),
        d => bail!("batch_norm_silu_train (CUDA): activations in {d:?}"),
    }
}

fn backward_t<T: CudaDType + WithDType + DeviceRepr>(
    x: &Tensor,
    grad: &Tensor,
    gamma: &Tensor,
    st: &DeviceStats,
) -> Result<(Tensor, Tensor)> {
    let (n, c, h, w) = x.dims4()?;
    let (hw, m, total) = (h * w, n * h * w, n * c * h * w);
    let grad = grad.to_dtype(x.dtype())?.contiguous()?;
    let (xs, lx) = x.storage_and_layout();
    let (gs, lg) = grad.storage_and_layout();
    let (ps, lp) = gamma.storage_and_layout();
    let (Storage::Cuda(xs), Storage::Cuda(gs), Storage::Cuda(ps)) = (&*xs, &*gs, &*ps) else {
        bail!("batch_norm_silu_train (CUDA): backward on tensors off the device")
    };
    let (xv, gv, pv) = (view::<T>(xs, lx, "input")?, view::<T>(gs, lg, "gradient")?, f32_view(ps, lp, "gamma")?);
    let dev = xs.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let Some((ti, _)) = type_index(T::DTYPE) else { bail!("batch_norm_silu_train (CUDA): {:?}", T::DTYPE) };
    let kt = &k.typed[ti];
    let (s, chunk) = slices(c, m);
    // SAFETY (all allocations below): every element is written by the kernel that follows before anything reads it.
    let mut part = unsafe { stream.alloc::<f64>(2 * c * s) }.map_err(drv("allocating"))?;
    let mut dgb = unsafe { stream.alloc::<f32>(2 * c) }.map_err(drv("allocating"))?;
    let mut coef = unsafe { stream.alloc::<f32>(4 * c) }.map_err(drv("allocating"))?;
    let mut dx = unsafe { stream.alloc::<T>(total) }.map_err(drv("allocating"))?;
    let (ci, hwi, mi, chunki, si, ti) =
        (i32_of(c)?, i64_of(hw)?, i64_of(m)?, i64_of(chunk)?, i32_of(s)?, i64_of(total)?);
    let cfg = LaunchConfig { grid_dim: (c as u32, s as u32, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&kt.bwd_partial);
    l.arg(&xv).arg(&gv).arg(&st.ab).arg(&st.saved).arg(&mut part).arg(&ci).arg(&hwi).arg(&mi).arg(&chunki).arg(&si);
    // SAFETY: argument types match the kernel's signature; every index is bounded by the sizes passed.
    unsafe { l.launch(cfg) }.map_err(drv("backward sums"))?;
    let mut l = stream.launch_builder(&k.bwd_final);
    l.arg(&part).arg(&pv).arg(&st.saved).arg(&ci).arg(&si).arg(&mi).arg(&mut dgb).arg(&mut coef);
    // SAFETY: as above.
    unsafe { l.launch(per_channel(c)) }.map_err(drv("backward sums"))?;
    let mut l = stream.launch_builder(&kt.bwd_apply);
    l.arg(&xv).arg(&gv).arg(&st.ab).arg(&coef).arg(&mut dx).arg(&ci).arg(&hwi).arg(&ti);
    // SAFETY: as above.
    unsafe { l.launch(elementwise(total)) }.map_err(drv("backward"))?;
    let dx = wrap(dx, &dev, x.dims())?;
    let dgb = wrap(dgb, &dev, &[2 * c])?;
    Ok((dx, dgb))
}

/// A device slice as a tensor of `shape` (no gradient tracking).
pub(super) fn wrap<T: CudaDType>(s: CudaSlice<T>, dev: &CudaDevice, shape: &[usize]) -> Result<Tensor> {
    let storage = CudaStorage::wrap_cuda_slice(s, dev.clone());
    Ok(Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false))
}

/// Whether the CUDA op takes `x` with these parameters: activations in f32, f16 or bf16, parameters in f32.
pub(super) fn supports(x: &Tensor, gamma: &Tensor) -> bool {
    x.device().is_cuda() && type_index(x.dtype()).is_some() && gamma.dtype() == DType::F32
}

/// The statistics' `[mean; C] ++ [var; C]` as a tensor, taken from the forward's own buffer (no copy: the op keeps
/// what its backward reads apart); a second call is an error.
pub(super) fn mean_var(st: &DeviceStats, dev: &CudaDevice, c: usize) -> Result<Tensor> {
    #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
    let Some(mv) = st.mv.lock().unwrap().take() else {
        bail!("batch_norm_silu_train (CUDA): the statistics were taken already")
    };
    wrap(mv, dev, &[2 * c])
}
