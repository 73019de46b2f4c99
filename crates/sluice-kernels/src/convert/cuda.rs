//! The conversion kernels' launches.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg,
};
use candle_core::{CudaDevice, Result};

use super::CUDA_SOURCE;
use crate::nvrtc::PerDevice;

/// The conversion kernels of one device, compiled and loaded once for the process.
pub struct Convert {
    to_f32: CudaFunction,
    to_bf16: CudaFunction,
}

impl std::fmt::Debug for Convert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Convert")
    }
}

static KERNELS: PerDevice<Convert> = PerDevice::new();

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("u8 conversion (CUDA) {what}: {e:?}"))
}

/// One thread per element up to 65 535 blocks of 256; the kernels stride over the rest.
fn config(len: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (len.div_ceil(256).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Convert {
    /// The kernels of `dev` (compiled by NVRTC on the first call for it).
    pub fn for_device(dev: &CudaDevice) -> Result<Arc<Self>> {
        KERNELS.get(dev, "CUDA transfer kernels", CUDA_SOURCE, |f| {
            Ok(Self { to_f32: f.get("sluice_u8_to_f32")?, to_bf16: f.get("sluice_u8_to_bf16")? })
        })
    }

    /// `src · scale` in f32, into a fresh buffer ordered on `stream`.
    pub fn to_f32(&self, stream: &Arc<CudaStream>, src: &CudaView<'_, u8>, scale: f32) -> Result<CudaSlice<f32>> {
        let len = src.len();
        // SAFETY: the kernel writes every element before any reader on `stream` sees the buffer.
        let mut dst = unsafe { stream.alloc::<f32>(len.max(1)) }.map_err(drv("allocating"))?;
        let n = len as u64;
        let mut b = stream.launch_builder(&self.to_f32);
        b.arg(src).arg(&mut dst).arg(&n).arg(&scale);
        // SAFETY: the argument types match the kernel's signature; `n` bounds every access.
        unsafe { b.launch(config(len)) }.map_err(drv("launch"))?;
        Ok(dst)
    }

    /// `src · scale` rounded to nearest even bf16, into a fresh buffer ordered on `stream`.
    pub fn to_bf16(
        &self,
        stream: &Arc<CudaStream>,
        src: &CudaView<'_, u8>,
        scale: f32,
    ) -> Result<CudaSlice<half::bf16>> {
        let len = src.len();
        // SAFETY: as in `to_f32`.
        let mut dst = unsafe { stream.alloc::<half::bf16>(len.max(1)) }.map_err(drv("allocating"))?;
        let n = len as u64;
        let mut b = stream.launch_builder(&self.to_bf16);
        b.arg(src).arg(&mut dst).arg(&n).arg(&scale);
        // SAFETY: as in `to_f32` (bf16 is a 16-bit value, written as `unsigned short`).
        unsafe { b.launch(config(len)) }.map_err(drv("launch"))?;
        Ok(dst)
    }
}
