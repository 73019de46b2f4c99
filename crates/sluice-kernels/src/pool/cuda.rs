//! The launch of `sluice_pool_argmax_*` (`kernels.cu`, compiled by NVRTC once per device).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, DType, Layout, Result, WithDType, bail};

use super::CUDA_SOURCE;
use crate::nvrtc::PerDevice;

struct Kernels {
    f32: CudaFunction,
    f16: CudaFunction,
    bf16: CudaFunction,
}

static KERNELS: PerDevice<Kernels> = PerDevice::new();

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("max-pool argmax (CUDA) {what}: {e:?}"))
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("max-pool argmax (CUDA): {v} overflows")))
}

/// The flat in-plane index of each output's window maximum, `(planes · h · w)` u32, for `x` of `planes` `h × w`
/// planes (f32, f16 or bf16) and an odd window `k`.
pub(super) fn argmax(
    x: &CudaStorage,
    l: &Layout,
    (planes, h, w): (usize, usize, usize),
    k: usize,
) -> Result<CudaStorage> {
    match x.dtype() {
        DType::F32 => launch::<f32>(x, l, (planes, h, w), k),
        DType::F16 => launch::<half::f16>(x, l, (planes, h, w), k),
        DType::BF16 => launch::<half::bf16>(x, l, (planes, h, w), k),
        d => bail!("max-pool argmax (CUDA): {d:?} activations"),
    }
}

fn launch<T: CudaDType + WithDType + DeviceRepr>(
    x: &CudaStorage,
    l: &Layout,
    (planes, h, w): (usize, usize, usize),
    k: usize,
) -> Result<CudaStorage> {
    let Some((a, b)) = l.contiguous_offsets() else { bail!("max-pool argmax (CUDA): the input is not contiguous") };
    let xv = x.as_cuda_slice::<T>()?.slice(a..b);
    let dev = x.device().clone();
    let stream = dev.cuda_stream();
    let kern = KERNELS.get(&dev, "CUDA max-pool kernels", CUDA_SOURCE, |f| {
        Ok(Kernels {
            f32: f.get("sluice_pool_argmax_f32")?,
            f16: f.get("sluice_pool_argmax_f16")?,
            bf16: f.get("sluice_pool_argmax_bf16")?,
        })
    })?;
    let func = match T::DTYPE {
        DType::F16 => &kern.f16,
        DType::BF16 => &kern.bf16,
        _ => &kern.f32,
    };
    let n = planes * h * w;
    // SAFETY: the kernel writes every index before anything on `stream` reads the buffer.
    let mut idx = unsafe { stream.alloc::<u32>(n.max(1)) }.map_err(drv("allocating"))?;
    let (pl, hu, wu, ku) = (planes as u64, u32_of(h)?, u32_of(w)?, u32_of(k)?);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut b = stream.launch_builder(func);
    b.arg(&xv).arg(&mut idx).arg(&pl).arg(&hu).arg(&wu).arg(&ku);
    // SAFETY: the argument types match the kernel's signature (a 16-bit type for the half ones); planes · h · w
    // bounds every index, and every window read is inside its plane.
    unsafe { b.launch(cfg) }.map_err(drv("launch"))?;
    Ok(CudaStorage::wrap_cuda_slice(idx, dev))
}
