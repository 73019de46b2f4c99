//! Asynchronous device→host reads of small tensors (loss items, counters), in submission order.
//!
//! [`Readback::submit`] queues a copy of a tensor; [`Readback::poll`] hands back the oldest queued copy once it has
//! landed, without waiting; [`Readback::wait`] waits for it (and counts the wait in [`sluice_core::syncs`] when
//! the copy had not landed yet). A training loop submits each batch's loss items and polls after queuing the next
//! batch, so it reads values a batch or two old and never stalls the device.
//!
//! On a CUDA device (feature `cuda`) a ring of pinned host buffers is filled by a copy stream that waits, on the
//! device, for an event recorded on the compute stream right after the tensor was computed, so the copy does not
//! queue behind the work submitted later; completion is an event query. On the CPU the copy is made at submit time
//! (nothing to wait for) and the same order holds: this is the CPU twin the tests drive.

use std::collections::VecDeque;

use candle_core::{DType, Device, Tensor};
#[cfg(feature = "cuda")]
use sluice_core::syncs::{self, Site};
use sluice_core::{Error, Result};

fn candle(what: &'static str) -> impl Fn(candle_core::Error) -> Error {
    move |e| Error::Invalid { what, reason: e.to_string() }
}

/// Queued host copies of small `f32` tensors; see the module docs.
#[derive(Debug)]
pub struct Readback {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// Copies made at submit time, queued as `(tag, values)`; the vectors are reused.
    Host { queue: VecDeque<(u64, Vec<f32>)>, spare: Vec<Vec<f32>> },
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaReadback),
}

impl Readback {
    /// Slots used by the CUDA ring (copies in flight before a submit has to wait).
    pub const SLOTS: usize = 4;

    /// Readbacks of tensors on `device`.
    pub fn new(device: &Device) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            return Ok(Self { inner: Inner::Cuda(crate::cuda::CudaReadback::new(device, Self::SLOTS)?) });
        }
        let _ = device;
        Ok(Self { inner: Inner::Host { queue: VecDeque::new(), spare: Vec::new() } })
    }

    /// Queues a copy of `t` (any shape, read as `f32`), tagged `tag`. When [`Self::SLOTS`] copies are already
    /// queued, the oldest is taken first (waiting for it if needed, counted) into `overflow`, and its tag returned.
    pub fn submit(&mut self, tag: u64, t: &Tensor, overflow: &mut Vec<f32>) -> Result<Option<u64>> {
        let t = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).map_err(candle("readback"))?;
        let taken = if self.pending() >= Self::SLOTS { self.wait(overflow)? } else { None };
        self.push(tag, &t)?;
        Ok(taken)
    }

    fn push(&mut self, tag: u64, t: &Tensor) -> Result<()> {
        match &mut self.inner {
            Inner::Host { queue, spare } => {
                let mut v = spare.pop().unwrap_or_default();
                v.clear();
                v.extend(t.to_device(&Device::Cpu).and_then(|t| t.to_vec1::<f32>()).map_err(candle("readback"))?);
                queue.push_back((tag, v));
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.submit(tag, t),
        }
    }

    /// The oldest queued copy into `out` (replacing its contents) if it has landed; its tag, or `None`.
    pub fn poll(&mut self, out: &mut Vec<f32>) -> Result<Option<u64>> {
        self.take(out, false)
    }

    /// The oldest queued copy into `out`, waiting for it if needed; its tag, or `None` when nothing is queued.
    pub fn wait(&mut self, out: &mut Vec<f32>) -> Result<Option<u64>> {
        self.take(out, true)
    }

    /// Copies queued and not yet taken.
    pub fn pending(&self) -> usize {
        match &self.inner {
            Inner::Host { queue, .. } => queue.len(),
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => c.pending(),
        }
    }

    fn take(&mut self, out: &mut Vec<f32>, block: bool) -> Result<Option<u64>> {
        match &mut self.inner {
            Inner::Host { queue, spare } => {
                let _ = block;
                let Some((tag, v)) = queue.pop_front() else { return Ok(None) };
                out.clear();
                out.extend_from_slice(&v);
                spare.push(v);
                Ok(Some(tag))
            }
            #[cfg(feature = "cuda")]
            Inner::Cuda(c) => {
                if !block && !c.oldest_landed()? {
                    return Ok(None);
                }
                if block && !c.oldest_landed()? {
                    syncs::record(Site::Other);
                }
                c.take(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_come_back_in_submission_order_with_their_tags() {
        let mut r = Readback::new(&Device::Cpu).expect("readback");
        let mut out = Vec::new();
        assert_eq!(r.poll(&mut out).expect("poll"), None);
        let mut overflow = Vec::new();
        for i in 0..5u64 {
            let t = Tensor::new(&[i as f32, 2.0 * i as f32, 0.5], &Device::Cpu).expect("tensor");
            let taken = r.submit(i, &t, &mut overflow).expect("submit");
            // The fifth submit finds SLOTS copies queued: the oldest comes out first.
            assert_eq!(taken, if i == 4 { Some(0) } else { None });
        }
        assert_eq!(overflow, vec![0.0, 0.0, 0.5]);
        assert_eq!(r.pending(), 4);
        let t = Tensor::new(&[5.0f32, 10.0, 0.5], &Device::Cpu).expect("tensor");
        assert_eq!(r.submit(5, &t, &mut overflow).expect("submit"), Some(1));
        assert_eq!(r.poll(&mut out).expect("poll"), Some(2));
        assert_eq!(out, vec![2.0, 4.0, 0.5]);
        assert_eq!(r.wait(&mut out).expect("wait"), Some(3));
        assert_eq!(out, vec![3.0, 6.0, 0.5]);
        let mut tags = Vec::new();
        while let Some(tag) = r.wait(&mut out).expect("wait") {
            tags.push(tag);
        }
        assert_eq!(tags, vec![4, 5]);
        assert_eq!(out, vec![5.0, 10.0, 0.5]);
        assert_eq!(r.pending(), 0);
    }

    #[test]
    fn any_float_dtype_and_shape_is_read_as_f32() {
        let mut r = Readback::new(&Device::Cpu).expect("readback");
        let t = Tensor::new(&[[1.5f64, -2.0], [3.0, 4.25]], &Device::Cpu).expect("tensor");
        r.submit(7, &t, &mut Vec::new()).expect("submit");
        let mut out = vec![9.0; 10];
        assert_eq!(r.wait(&mut out).expect("wait"), Some(7));
        assert_eq!(out, vec![1.5, -2.0, 3.0, 4.25]);
    }
}
