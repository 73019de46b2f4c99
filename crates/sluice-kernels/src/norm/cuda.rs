//! Training-mode BatchNorm + SiLU on a CUDA device (feature `cuda`), f32: the same two sweeps forward and two
//! backward as the CPU op, as six small kernels compiled once per device with NVRTC.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::DeviceId;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice, CudaView, LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Storage, Tensor, bail};

const SRC: &str = include_str!("kernels.cu");

/// The six kernels of one device.
struct Kernels {
    stats_partial: CudaFunction,
    stats_final: CudaFunction,
    apply: CudaFunction,
    bwd_partial: CudaFunction,
    bwd_final: CudaFunction,
    bwd_apply: CudaFunction,
}

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("batch_norm_silu_train (CUDA) {what}: {e:?}"))
}

/// The kernels for `dev`, compiled on first use.
fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
    static CACHE: OnceLock<Mutex<HashMap<DeviceId, Arc<Kernels>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = cache.lock().map_err(|_| candle_core::Error::Msg("BN kernel cache poisoned".into()))?;
    if let Some(k) = map.get(&dev.id()) {
        return Ok(Arc::clone(k));
    }
    let ptx = candle_core::cuda_backend::cudarc::nvrtc::compile_ptx(SRC).map_err(drv("compiling the kernels"))?;
    let module = dev.cuda_stream().context().load_module(ptx).map_err(drv("loading the kernels"))?;
    let f = |name: &str| module.load_function(name).map_err(drv("loading a kernel"));
    let k = Arc::new(Kernels {
        stats_partial: f("bn_stats_partial")?,
        stats_final: f("bn_stats_final")?,
        apply: f("bn_silu_apply")?,
        bwd_partial: f("bn_bwd_partial")?,
        bwd_final: f("bn_bwd_final")?,
        bwd_apply: f("bn_bwd_apply")?,
    });
    map.insert(dev.id(), Arc::clone(&k));
    Ok(k)
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

/// The f32 contiguous view of a storage, or an error naming the input.
fn f32_view<'a>(s: &'a CudaStorage, l: &Layout, what: &str) -> Result<CudaView<'a, f32>> {
    let Some((a, b)) = l.contiguous_offsets() else { bail!("batch_norm_silu_train (CUDA): {what} is not contiguous") };
    if s.dtype() != DType::F32 {
        bail!("batch_norm_silu_train (CUDA): {what} must be f32, got {:?}", s.dtype());
    }
    Ok(s.as_cuda_slice::<f32>()?.slice(a..b))
}

/// What the forward leaves for the backward and the caller, all on the device.
#[derive(Debug)]
pub(super) struct DeviceStats {
    /// `[mean; C] ++ [1/σ; C]` in f64.
    saved: CudaSlice<f64>,
    /// `[mean; C] ++ [var; C]` (biased), for the caller.
    pub(super) mv: CudaSlice<f32>,
    /// `[a; C] ++ [b; C]`: `z = x·a + b`.
    ab: CudaSlice<f32>,
}

/// The forward: `y` and the statistics.
pub(super) fn forward(
    (x, lx): (&CudaStorage, &Layout),
    (g, lg): (&CudaStorage, &Layout),
    (b, lb): (&CudaStorage, &Layout),
    (n, c, hw): (usize, usize, usize),
    eps: f64,
) -> Result<(CudaStorage, DeviceStats)> {
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let (xv, gv, bv) = (f32_view(x, lx, "input")?, f32_view(g, lg, "gamma")?, f32_view(b, lb, "beta")?);
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
    let mut y = unsafe { stream.alloc::<f32>(total) }.map_err(drv("allocating"))?;
    let (ci, hwi, mi, chunki, si, ti) =
        (i32_of(c)?, i64_of(hw)?, i64_of(m)?, i64_of(chunk)?, i32_of(s)?, i64_of(total)?);
    let cfg = LaunchConfig { grid_dim: (c as u32, s as u32, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&k.stats_partial);
    l.arg(&xv).arg(&mut part).arg(&ci).arg(&hwi).arg(&mi).arg(&chunki).arg(&si);
    // SAFETY: argument types match the kernel's signature; every index is bounded by the sizes passed.
    unsafe { l.launch(cfg) }.map_err(drv("stats"))?;
    let mut l = stream.launch_builder(&k.stats_final);
    l.arg(&xv).arg(&part).arg(&gv).arg(&bv).arg(&eps).arg(&ci).arg(&hwi).arg(&mi).arg(&si);
    l.arg(&mut saved).arg(&mut mv).arg(&mut ab);
    // SAFETY: as above.
    unsafe { l.launch(per_channel(c)) }.map_err(drv("stats"))?;
    let mut l = stream.launch_builder(&k.apply);
    l.arg(&xv).arg(&ab).arg(&mut y).arg(&ci).arg(&hwi).arg(&ti);
    // SAFETY: as above.
    unsafe { l.launch(elementwise(total)) }.map_err(drv("apply"))?;
    Ok((CudaStorage::wrap_cuda_slice(y, dev), DeviceStats { saved, mv, ab }))
}

/// The backward: `(dx, [dγ; C] ++ [dβ; C])` from the input, the upstream gradient, γ and the forward's statistics.
pub(super) fn backward(x: &Tensor, grad: &Tensor, gamma: &Tensor, st: &DeviceStats) -> Result<(Tensor, Tensor)> {
    let (n, c, h, w) = x.dims4()?;
    let (hw, m, total) = (h * w, n * h * w, n * c * h * w);
    let grad = grad.contiguous()?;
    let (xs, lx) = x.storage_and_layout();
    let (gs, lg) = grad.storage_and_layout();
    let (ps, lp) = gamma.storage_and_layout();
    let (Storage::Cuda(xs), Storage::Cuda(gs), Storage::Cuda(ps)) = (&*xs, &*gs, &*ps) else {
        bail!("batch_norm_silu_train (CUDA): backward on tensors off the device")
    };
    let (xv, gv, pv) = (f32_view(xs, lx, "input")?, f32_view(gs, lg, "gradient")?, f32_view(ps, lp, "gamma")?);
    let dev = xs.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let (s, chunk) = slices(c, m);
    // SAFETY (all allocations below): every element is written by the kernel that follows before anything reads it.
    let mut part = unsafe { stream.alloc::<f64>(2 * c * s) }.map_err(drv("allocating"))?;
    let mut dgb = unsafe { stream.alloc::<f32>(2 * c) }.map_err(drv("allocating"))?;
    let mut coef = unsafe { stream.alloc::<f32>(4 * c) }.map_err(drv("allocating"))?;
    let mut dx = unsafe { stream.alloc::<f32>(total) }.map_err(drv("allocating"))?;
    let (ci, hwi, mi, chunki, si, ti) =
        (i32_of(c)?, i64_of(hw)?, i64_of(m)?, i64_of(chunk)?, i32_of(s)?, i64_of(total)?);
    let cfg = LaunchConfig { grid_dim: (c as u32, s as u32, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&k.bwd_partial);
    l.arg(&xv).arg(&gv).arg(&st.ab).arg(&st.saved).arg(&mut part).arg(&ci).arg(&hwi).arg(&mi).arg(&chunki).arg(&si);
    // SAFETY: argument types match the kernel's signature; every index is bounded by the sizes passed.
    unsafe { l.launch(cfg) }.map_err(drv("backward sums"))?;
    let mut l = stream.launch_builder(&k.bwd_final);
    l.arg(&part).arg(&pv).arg(&st.saved).arg(&ci).arg(&si).arg(&mi).arg(&mut dgb).arg(&mut coef);
    // SAFETY: as above.
    unsafe { l.launch(per_channel(c)) }.map_err(drv("backward sums"))?;
    let mut l = stream.launch_builder(&k.bwd_apply);
    l.arg(&xv).arg(&gv).arg(&st.ab).arg(&coef).arg(&mut dx).arg(&ci).arg(&hwi).arg(&ti);
    // SAFETY: as above.
    unsafe { l.launch(elementwise(total)) }.map_err(drv("backward"))?;
    let dx = wrap(dx, &dev, x.dims())?;
    let dgb = wrap(dgb, &dev, &[2 * c])?;
    Ok((dx, dgb))
}

/// A device slice as a tensor of `shape` (no gradient tracking).
pub(super) fn wrap(s: CudaSlice<f32>, dev: &CudaDevice, shape: &[usize]) -> Result<Tensor> {
    let storage = CudaStorage::wrap_cuda_slice(s, dev.clone());
    Ok(Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false))
}

/// Whether the CUDA op takes `x`.
pub(super) fn supports(x: &Tensor) -> bool {
    x.device().is_cuda() && x.dtype() == DType::F32
}

/// A copy of the statistics' `[mean; C] ++ [var; C]` as a tensor (the op keeps its own for the backward).
pub(super) fn mean_var(st: &DeviceStats, dev: &CudaDevice, c: usize) -> Result<Tensor> {
    let copy = dev.cuda_stream().clone_dtod(&st.mv).map_err(drv("copying the statistics"))?;
    wrap(copy, dev, &[2 * c])
}
