//! The device's memory pool: candle allocates every CUDA tensor from the stream-ordered allocator
//! (`cuMemAllocAsync`, through cudarc), whose default pool hands memory back to the driver at each stream, event or
//! context synchronisation once it holds more than its *release threshold*, and that threshold is 0 by default.
//! A training step's tensors are freed and allocated again every step, so with the default, every synchronisation
//! point can return the step's memory to the driver and the next step has to reserve it again (a real device
//! allocation, and the stall that comes with it).
//!
//! [`retain_device_pool`] raises the threshold to "everything", which makes the pool a caching allocator: after the
//! first steps the pool holds the working set and a steady-state step reserves nothing new. [`PoolGrowth`] watches
//! the pool's reserved bytes step by step, so the telemetry can count the steps that did have to grow it (the
//! device allocations, in the driver's sense, per step).
//!
//! On the CPU, and in a build without `cuda`, every function here answers `None` / `false`.

use candle_core::Device;
use sluice_core::Result;

/// Sets the release threshold of `device`'s default memory pool to `u64::MAX`, so memory freed by tensors stays
/// in the pool across synchronisations. `Ok(true)` when it was set, `Ok(false)` on a device without a pool (the
/// CPU, or a build without `cuda`).
pub fn retain_device_pool(device: &Device) -> Result<bool> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return cuda::set_release_threshold(d, u64::MAX).map(|()| true);
    }
    let _ = device;
    Ok(false)
}

/// Bytes the default memory pool of `device` holds reserved from the driver (in use by tensors or cached);
/// `None` on the CPU or in a build without `cuda`. A driver attribute query, not a synchronisation.
pub fn device_pool_reserved(device: &Device) -> Option<u64> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return cuda::reserved(d);
    }
    let _ = device;
    None
}

/// Counts the steps in which the pool had to reserve more memory from the driver. Feed it the pool's reserved
/// bytes after each step ([`device_pool_reserved`]); the first observation only sets the baseline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolGrowth {
    last: Option<u64>,
    /// Observations (after the baseline) in which the reserved bytes grew.
    pub growth_steps: u64,
    /// Bytes the pool grew by, summed over those observations.
    pub grown_bytes: u64,
    /// Observations after the baseline.
    pub steps: u64,
}

impl PoolGrowth {
    /// A tracker with no baseline yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the reserved bytes after a step; `None` (no pool) records nothing.
    pub fn observe(&mut self, reserved: Option<u64>) {
        let Some(now) = reserved else { return };
        if let Some(prev) = self.last {
            self.steps += 1;
            if now > prev {
                self.growth_steps += 1;
                self.grown_bytes += now - prev;
            }
        }
        self.last = Some(now);
    }

    /// The counts so far, and a fresh window that keeps the baseline (for per-epoch figures).
    pub fn take(&mut self) -> Self {
        let out = *self;
        *self = Self { last: self.last, ..Self::default() };
        out
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use candle_core::CudaDevice;
    use cudarc::driver::result::{device, mem_pool};
    use cudarc::driver::sys::CUmemPool_attribute;
    use sluice_core::{Error, Result};

    fn pool(d: &CudaDevice) -> std::result::Result<cudarc::driver::sys::CUmemoryPool, cudarc::driver::DriverError> {
        let ctx = d.cuda_stream().context().clone();
        ctx.bind_to_thread()?;
        // SAFETY: `cu_device` is the context's own device handle, returned by the driver.
        unsafe { device::get_default_mem_pool(ctx.cu_device()) }
    }

    pub(super) fn set_release_threshold(d: &CudaDevice, bytes: u64) -> Result<()> {
        let err = |e: cudarc::driver::DriverError| Error::Invalid {
            what: "device memory pool",
            reason: format!("CUDA: setting the release threshold: {e}"),
        };
        let pool = pool(d).map_err(err)?;
        let mut value = bytes;
        // SAFETY: the pool is the device's default pool; the release threshold is a `cuuint64_t` attribute.
        unsafe {
            mem_pool::set_attribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&raw mut value).cast(),
            )
        }
        .map_err(err)
    }

    pub(super) fn reserved(d: &CudaDevice) -> Option<u64> {
        let pool = pool(d).ok()?;
        let mut value = 0u64;
        // SAFETY: as above; the reserved-memory attribute is a `cuuint64_t`.
        unsafe {
            mem_pool::get_attribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                (&raw mut value).cast(),
            )
        }
        .ok()?;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_counts_only_steps_that_reserved_more() {
        let mut g = PoolGrowth::new();
        for r in [100, 100, 150, 150, 120, 200, 200] {
            g.observe(Some(r));
        }
        g.observe(None);
        assert_eq!(g, PoolGrowth { last: Some(200), growth_steps: 2, grown_bytes: 130, steps: 6 });
        let first = g.take();
        assert_eq!(first.growth_steps, 2);
        g.observe(Some(200));
        g.observe(Some(210));
        assert_eq!((g.steps, g.growth_steps, g.grown_bytes), (2, 1, 10), "the baseline carries over");
    }

    #[test]
    fn the_cpu_has_no_pool() {
        assert!(!retain_device_pool(&Device::Cpu).expect("no error on the CPU"));
        assert_eq!(device_pool_reserved(&Device::Cpu), None);
    }
}
