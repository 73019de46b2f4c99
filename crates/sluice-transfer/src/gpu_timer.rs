//! Device time of stretches of work on a device's compute stream, measured with CUDA events (feature `cuda`), not
//! host clocks: `start` and `stop` record an event pair on the stream, which costs no wait; the pairs are read once
//! their work is done (at the next `start`, without waiting) and [`GpuTimer::finish`] waits for the last one, the
//! one blocking read of a pass. On the CPU there is no device clock: the timer measures nothing and says so.

use candle_core::Device;
use sluice_core::Result;

/// Sums the device time of the stretches between [`GpuTimer::start`] and [`GpuTimer::stop`].
#[derive(Debug)]
pub struct GpuTimer {
    #[cfg(feature = "cuda")]
    cuda: Option<cuda::EventTimer>,
}

impl GpuTimer {
    /// A timer on `device`'s compute stream (a timer that measures nothing on the CPU).
    pub fn new(device: &Device) -> Result<Self> {
        #[cfg(feature = "cuda")]
        {
            let cuda = match device {
                Device::Cuda(d) => Some(cuda::EventTimer::new(d.cuda_stream())?),
                _ => None,
            };
            Ok(Self { cuda })
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = device;
            Ok(Self {})
        }
    }

    /// Marks the start of a stretch at the work queued so far.
    pub fn start(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(t) = &mut self.cuda {
            t.start()?;
        }
        Ok(())
    }

    /// Marks the end of the stretch begun by the last [`GpuTimer::start`].
    pub fn stop(&mut self) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(t) = &mut self.cuda {
            t.stop()?;
        }
        Ok(())
    }

    /// Seconds of device time in all stretches, after waiting for the last one to finish; `None` on a device
    /// without a clock (the CPU).
    pub fn finish(&mut self) -> Result<Option<f64>> {
        #[cfg(feature = "cuda")]
        if let Some(t) = &mut self.cuda {
            return t.finish().map(Some);
        }
        Ok(None)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use cudarc::driver::sys::CUevent_flags;
    use cudarc::driver::{CudaEvent, CudaStream, DriverError};
    use sluice_core::{Error, Result};

    /// Event pairs kept for reuse; a pair returns to the pool once read.
    const PAIRS: usize = 16;

    fn drv(what: &'static str) -> impl Fn(DriverError) -> Error {
        move |e| Error::Invalid { what, reason: format!("CUDA: {e}") }
    }

    pub(super) struct EventTimer {
        stream: Arc<CudaStream>,
        /// Recorded pairs whose time is not read yet, oldest first.
        pending: VecDeque<(CudaEvent, CudaEvent)>,
        /// The pair of the open stretch.
        open: Option<(CudaEvent, CudaEvent)>,
        free: Vec<(CudaEvent, CudaEvent)>,
        total_ms: f64,
    }

    impl std::fmt::Debug for EventTimer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("EventTimer")
                .field("pending", &self.pending.len())
                .field("total_ms", &self.total_ms)
                .finish()
        }
    }

    impl EventTimer {
        pub(super) fn new(stream: Arc<CudaStream>) -> Result<Self> {
            let ctx = stream.context().clone();
            let mut free = Vec::with_capacity(PAIRS);
            for _ in 0..PAIRS {
                // Timing events (`CU_EVENT_DEFAULT`; cudarc's default disables timing).
                let e = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(drv("timing event"));
                free.push((e()?, e()?));
            }
            Ok(Self { stream, pending: VecDeque::with_capacity(PAIRS), open: None, free, total_ms: 0.0 })
        }

        /// Reads the pairs whose work is done, oldest first; with `wait`, waits for all of them.
        fn harvest(&mut self, wait: bool) -> Result<()> {
            while let Some((a, b)) = self.pending.front() {
                if !wait && !b.try_is_complete().map_err(drv("timing event"))? {
                    break;
                }
                self.total_ms += f64::from(a.elapsed_ms(b).map_err(drv("timing event"))?);
                if let Some(pair) = self.pending.pop_front() {
                    self.free.push(pair);
                }
            }
            Ok(())
        }

        pub(super) fn start(&mut self) -> Result<()> {
            self.harvest(false)?;
            if self.free.is_empty() {
                // Every pair is still in flight (more stretches queued than pairs): wait for the oldest.
                if let Some((_, b)) = self.pending.front() {
                    b.synchronize().map_err(drv("timing event"))?;
                }
                self.harvest(false)?;
            }
            let pair = self
                .free
                .pop()
                .ok_or_else(|| Error::Invalid { what: "timing event", reason: "no free event pair".into() })?;
            pair.0.record(&self.stream).map_err(drv("timing event"))?;
            self.open = Some(pair);
            Ok(())
        }

        pub(super) fn stop(&mut self) -> Result<()> {
            if let Some(pair) = self.open.take() {
                pair.1.record(&self.stream).map_err(drv("timing event"))?;
                self.pending.push_back(pair);
            }
            Ok(())
        }

        pub(super) fn finish(&mut self) -> Result<f64> {
            self.stop()?;
            self.harvest(true)?;
            Ok(self.total_ms / 1e3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_the_cpu_it_measures_nothing_and_says_so() {
        let mut t = GpuTimer::new(&Device::Cpu).unwrap_or_else(|e| panic!("{e}"));
        t.start().unwrap_or_else(|e| panic!("{e}"));
        t.stop().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.finish().unwrap_or_else(|e| panic!("{e}")), None);
    }
}
