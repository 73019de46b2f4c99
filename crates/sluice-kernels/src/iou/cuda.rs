//! The launch of `sluice_ciou_pairs` (`kernels.cu`, compiled by NVRTC once per device).

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, Layout, Result, bail};

use super::CUDA_SOURCE;
use crate::nvrtc::PerDevice;

struct Kernels {
    ciou_pairs: CudaFunction,
}

static KERNELS: PerDevice<Kernels> = PerDevice::new();

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("ciou_pairs (CUDA) {what}: {e:?}"))
}

fn u32_of(v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("ciou_pairs (CUDA): {v} overflows")))
}

/// The `(B, M, A)` overlaps of `gt` `(B, M, 4)` and `pred` `(B, 4, A)` (f32), with the constants eps, 1 + eps and
/// 4/π² as the caller converts them.
pub(super) fn ciou_pairs(
    (g, lg): (&CudaStorage, &Layout),
    (p, lp): (&CudaStorage, &Layout),
    (b, m, a): (usize, usize, usize),
    (eps, one_eps, four_pi2): (f32, f32, f32),
) -> Result<CudaStorage> {
    let (Some((g0, g1)), Some((p0, p1))) = (lg.contiguous_offsets(), lp.contiguous_offsets()) else {
        bail!("ciou_pairs (CUDA): the boxes must be contiguous")
    };
    let gv = g.as_cuda_slice::<f32>()?.slice(g0..g1);
    let pv = p.as_cuda_slice::<f32>()?.slice(p0..p1);
    let dev = g.device().clone();
    let stream = dev.cuda_stream();
    let k = KERNELS
        .get(&dev, "CUDA CIoU kernel", CUDA_SOURCE, |f| Ok(Kernels { ciou_pairs: f.get("sluice_ciou_pairs")? }))?;
    let n = b * m * a;
    // SAFETY: the kernel writes every element before anything on `stream` reads the buffer.
    let mut out = unsafe { stream.alloc::<f32>(n.max(1)) }.map_err(drv("allocating"))?;
    let (bu, mu, au) = (u32_of(b)?, u32_of(m)?, u32_of(a)?);
    let cfg = LaunchConfig {
        grid_dim: (n.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut l = stream.launch_builder(&k.ciou_pairs);
    l.arg(&gv).arg(&pv).arg(&mut out).arg(&bu).arg(&mu).arg(&au).arg(&eps).arg(&one_eps).arg(&four_pi2);
    // SAFETY: the argument types match the kernel's signature; B·M·A bounds every index, and the inputs hold
    // B·M·4 and B·4·A elements (checked by the op's shapes).
    unsafe { l.launch(cfg) }.map_err(drv("launch"))?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
