//! The launches of the one-hot BCE sum (`kernels.cu`, compiled by NVRTC once per device).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaView, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, Layout, Result, bail};

use super::CUDA_SOURCE;
use crate::nvrtc::PerDevice;

struct Kernels {
    partial: CudaFunction,
    total: CudaFunction,
    grad: CudaFunction,
}

static KERNELS: PerDevice<Kernels> = PerDevice::new();

/// Blocks of the partial sums (a fixed count, so the order of the sum is the same on every run and device).
const BLOCKS: u32 = 1024;
const THREADS: u32 = 256;

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("bce_with_logits_sum_one_hot (CUDA) {what}: {e:?}"))
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("bce_with_logits_sum_one_hot (CUDA): {v} overflows")))
}

fn kernels(dev: &candle_core::CudaDevice) -> Result<std::sync::Arc<Kernels>> {
    KERNELS.get(dev, "CUDA one-hot BCE kernels", CUDA_SOURCE, |f| {
        Ok(Kernels {
            partial: f.get("sluice_bce_onehot_partial")?,
            total: f.get("sluice_bce_onehot_final")?,
            grad: f.get("sluice_bce_onehot_grad")?,
        })
    })
}

/// The contiguous view of a storage in its element type, or an error naming the input.
fn view<'a, T: candle_core::cuda_backend::CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("bce_with_logits_sum_one_hot (CUDA): {what} is not contiguous")
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// A tensor's CUDA storage and layout, or an error naming it.
pub(super) type On<'a> = (&'a CudaStorage, &'a Layout);

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(THREADS as usize).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The sum, a scalar: `x`, `p` `(B, C, A)` f32, `label` `(B, A)` u32, `weight` `(B, A)` f32.
pub(super) fn forward(
    (x, lx): On<'_>,
    (p, lp): On<'_>,
    (lab, llab): On<'_>,
    (w, lw): On<'_>,
    (b, c, a): (usize, usize, usize),
) -> Result<CudaStorage> {
    let (xv, pv) = (view::<f32>(x, lx, "logits")?, view::<f32>(p, lp, "probabilities")?);
    let (lv, wv) = (view::<u32>(lab, llab, "labels")?, view::<f32>(w, lw, "weights")?);
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    // SAFETY (both): each block writes its partial, and the final kernel the total, before anything reads them.
    let mut partial = unsafe { stream.alloc::<f64>(BLOCKS as usize) }.map_err(drv("allocating"))?;
    let mut out = unsafe { stream.alloc::<f32>(1) }.map_err(drv("allocating"))?;
    let (bu, cu, au) = (u32_of(b)?, u32_of(c)?, u32_of(a)?);
    let cfg = LaunchConfig { grid_dim: (BLOCKS, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&k.partial);
    l.arg(&xv).arg(&pv).arg(&lv).arg(&wv).arg(&mut partial).arg(&bu).arg(&cu).arg(&au);
    // SAFETY: the argument types match the kernel's signature; B·C·A bounds every index into x and p, B·A every
    // index into the labels and weights (checked by the op's shapes), and a label below C selects; the block
    // size is the kernel's shared array's.
    unsafe { l.launch(cfg) }.map_err(drv("partial sums"))?;
    let blocks = BLOCKS;
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
    let mut l = stream.launch_builder(&k.total);
    l.arg(&partial).arg(&mut out).arg(&blocks);
    // SAFETY: as above; `blocks` partials were written.
    unsafe { l.launch(cfg) }.map_err(drv("total"))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}

/// `g · (p − z)` `(B, C, A)` for the scalar upstream gradient `g` (on the device).
pub(super) fn backward(
    (p, lp): On<'_>,
    (lab, llab): On<'_>,
    (w, lw): On<'_>,
    (g, lg): On<'_>,
    (b, c, a): (usize, usize, usize),
) -> Result<CudaStorage> {
    let (pv, gv) = (view::<f32>(p, lp, "probabilities")?, view::<f32>(g, lg, "gradient")?);
    let (lv, wv) = (view::<u32>(lab, llab, "labels")?, view::<f32>(w, lw, "weights")?);
    let dev = p.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let n = b * c * a;
    // SAFETY: the kernel writes every element before anything reads the buffer.
    let mut dx = unsafe { stream.alloc::<f32>(n.max(1)) }.map_err(drv("allocating"))?;
    let (bu, cu, au) = (u32_of(b)?, u32_of(c)?, u32_of(a)?);
    let mut l = stream.launch_builder(&k.grad);
    l.arg(&pv).arg(&lv).arg(&wv).arg(&gv).arg(&mut dx).arg(&bu).arg(&cu).arg(&au);
    // SAFETY: as in `forward`; `g` holds one element.
    unsafe { l.launch(grid(n)) }.map_err(drv("gradient"))?;
    Ok(CudaStorage::wrap_cuda_slice(dx, dev))
}
