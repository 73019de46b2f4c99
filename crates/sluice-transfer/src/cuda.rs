//! The CUDA transfer (feature `cuda`): a [`Ring`] of pinned host + device staging slots, host→device copies on a
//! dedicated copy stream, and the u8 → float conversion on the compute stream.
//!
//! Per batch:
//! 1. take the next slot; its previous use is fenced by a CUDA event recorded on the compute stream after that
//!    batch was consumed, so in steady state (3 slots: fill / copy / compute) this costs nothing, and a wait is
//!    counted ([`sluice_core::syncs::Site::TransferSlot`]);
//! 2. pack the u8 NCHW pixels and the padded targets table into the slot's pinned buffers (one host copy each);
//! 3. copy both to the slot's device staging on the **copy stream** and record `copied` there;
//! 4. the **compute stream** waits on `copied` (a device-side wait: the host never blocks), converts the pixels
//!    to `f32` / `bf16` in `[0, 1]` with a small NVRTC kernel (4× less PCIe traffic than sending floats), copies
//!    the targets into fresh tensors, and records `consumed`.
//!
//! Staging is allocated once per slot and grown only when a larger batch arrives; the output tensors are fresh
//! allocations from candle's stream-ordered allocator, as every candle op's are. The conversion is bit-identical
//! to [`crate::CpuTransfer`]'s (`v * (1/255)` in f32, then round-to-nearest-even to bf16).
//!
//! Not built yet: collating straight into the pinned buffer (the batch assembler owns its `Vec`, so step 2 is a
//! memcpy), and f16 output.

use std::sync::{Arc, Mutex};

use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, Storage, Tensor};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DriverError, HostSlice, PinnedHostSlice, SyncOnDrop,
};
use sluice_core::syncs::{self, Site};
use sluice_core::{Batch, Error, Result, Transfer};
use sluice_kernels::convert::Convert;

use crate::ring::{Fence, Ring, Slot};
use crate::{DeviceBatch, padded_targets};

fn drv(what: &'static str) -> impl Fn(DriverError) -> Error {
    move |e| Error::Invalid { what, reason: format!("CUDA: {e}") }
}

fn candle(what: &'static str) -> impl Fn(candle_core::Error) -> Error {
    move |e| Error::Invalid { what, reason: e.to_string() }
}

struct EventFence(CudaEvent);

impl Fence for EventFence {
    fn is_done(&self) -> Result<bool> {
        self.0.try_is_complete().map_err(drv("transfer fence"))
    }
    fn wait(&self) -> Result<()> {
        self.0.synchronize().map_err(drv("transfer fence"))
    }
}

/// One ring slot: pinned host staging and device staging for pixels and targets.
struct CudaSlot {
    pixels_host: Option<PinnedHostSlice<u8>>,
    pixels_dev: Option<CudaSlice<u8>>,
    targets_host: Option<PinnedHostSlice<f32>>,
    targets_dev: Option<CudaSlice<f32>>,
    copied: CudaEvent,
    consumed: EventFence,
    used: bool,
}

impl Slot for CudaSlot {
    fn fence(&self) -> Option<&dyn Fence> {
        self.used.then_some(&self.consumed as &dyn Fence)
    }
}

/// Staging (re)allocations and transfers so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CudaTransferStats {
    /// Batches transferred.
    pub batches: u64,
    /// Staging buffers allocated (pinned or device); `4 × slots` once the largest batch has been seen.
    pub staging_allocs: u64,
    /// Times the host waited for a slot (also recorded in [`sluice_core::syncs`]).
    pub slot_waits: u64,
}

struct Inner {
    ring: Ring<CudaSlot>,
    stats: CudaTransferStats,
}

/// Host batch → CUDA tensors through pinned staging and a copy stream; see the module docs.
pub struct CudaTransfer {
    device: CudaDevice,
    candle_device: Device,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    dtype: DType,
    convert: Arc<Convert>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CudaTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaTransfer").field("dtype", &self.dtype).finish_non_exhaustive()
    }
}

/// Grows `slot` to hold `len` elements when it is smaller (or absent); returns whether it allocated.
fn ensure_pinned<T: cudarc::driver::DeviceRepr>(
    ctx: &Arc<CudaContext>,
    slot: &mut Option<PinnedHostSlice<T>>,
    len: usize,
) -> Result<bool> {
    if slot.as_ref().is_some_and(|s| s.len() >= len) {
        return Ok(false);
    }
    // SAFETY: the buffer is fully written (up to `len`) before any copy reads it.
    *slot = Some(unsafe { ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }.map_err(drv("pinned staging"))?);
    Ok(true)
}

fn ensure_device<T: cudarc::driver::DeviceRepr>(
    stream: &Arc<CudaStream>,
    slot: &mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<bool> {
    if slot.as_ref().is_some_and(|s| s.len() >= len) {
        return Ok(false);
    }
    // SAFETY: the buffer is fully written (up to `len`) by the copy before the kernel reads it.
    *slot = Some(unsafe { stream.alloc::<T>(len.max(1)) }.map_err(drv("device staging"))?);
    Ok(true)
}

/// The first `len` elements of a pinned buffer, as the source of a host→device copy. A slot's staging keeps the
/// size of the largest batch it has seen, so a smaller batch (fewer targets, the last batch of an epoch) must copy
/// only its own prefix: cudarc copies a whole [`PinnedHostSlice`] and asserts the destination holds it. The
/// buffer's event is waited on and recorded as for the whole buffer.
struct PinnedPrefix<'a, T> {
    buf: &'a mut PinnedHostSlice<T>,
    len: usize,
}

impl<T> HostSlice<T> for PinnedPrefix<'_, T> {
    fn len(&self) -> usize {
        self.len.min(self.buf.len())
    }

    unsafe fn stream_synced_slice<'b>(&'b self, stream: &'b CudaStream) -> (&'b [T], SyncOnDrop<'b>) {
        let len = self.len();
        // SAFETY: forwarded; the caller uses the slice on `stream` only.
        let (s, sync) = unsafe { self.buf.stream_synced_slice(stream) };
        (&s[..len], sync)
    }

    unsafe fn stream_synced_mut_slice<'b>(&'b mut self, stream: &'b CudaStream) -> (&'b mut [T], SyncOnDrop<'b>) {
        let len = self.len();
        // SAFETY: as above.
        let (s, sync) = unsafe { self.buf.stream_synced_mut_slice(stream) };
        (&mut s[..len], sync)
    }
}

impl CudaTransfer {
    /// Ring slots used by [`CudaTransfer::new`].
    pub const SLOTS: usize = 3;

    /// A transfer to the CUDA `device`, producing `dtype` images (`F32` or `BF16`), with [`Self::SLOTS`] slots.
    pub fn new(device: &Device, dtype: DType) -> Result<Self> {
        Self::with_slots(device, dtype, Self::SLOTS)
    }

    /// The same with `slots` ring slots (at least 3).
    pub fn with_slots(device: &Device, dtype: DType, slots: usize) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(Error::Invalid { what: "CUDA transfer", reason: format!("device {device:?} is not CUDA") });
        };
        if !matches!(dtype, DType::F32 | DType::BF16) {
            return Err(Error::Invalid {
                what: "CUDA transfer",
                reason: format!("image dtype {dtype:?}: the device conversion writes f32 or bf16"),
            });
        }
        let compute = cuda.cuda_stream();
        let ctx = compute.context().clone();
        let copy = ctx.new_stream().map_err(drv("copy stream"))?;
        let convert = Convert::for_device(cuda).map_err(candle("CUDA transfer kernels"))?;
        let mut ring_slots = Vec::with_capacity(slots);
        for _ in 0..slots {
            ring_slots.push(CudaSlot {
                pixels_host: None,
                pixels_dev: None,
                targets_host: None,
                targets_dev: None,
                copied: ctx.new_event(None).map_err(drv("transfer event"))?,
                consumed: EventFence(ctx.new_event(None).map_err(drv("transfer event"))?),
                used: false,
            });
        }
        let ring = Ring::new(ring_slots)?;
        Ok(Self {
            device: cuda.clone(),
            candle_device: device.clone(),
            ctx,
            compute,
            copy,
            dtype,
            convert,
            inner: Mutex::new(Inner { ring, stats: CudaTransferStats::default() }),
        })
    }

    /// The target device.
    pub fn device(&self) -> &Device {
        &self.candle_device
    }

    /// Counts so far.
    pub fn stats(&self) -> CudaTransferStats {
        self.inner.lock().map(|g| g.stats).unwrap_or_default()
    }

    fn wrap<T: candle_core::cuda::CudaDType>(&self, s: CudaSlice<T>, shape: &[usize]) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(s, self.device.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }
}

impl Transfer for CudaTransfer {
    type Output = DeviceBatch;

    fn transfer(&self, batch: &Batch) -> Result<DeviceBatch> {
        let shape = batch.shape();
        let n = batch.len();
        crate::check_targets(batch)?;
        let pixels = batch.pixels();
        let (classes, boxes, mask, m) = padded_targets(batch);
        let tlen = classes.len() + boxes.len() + mask.len();
        let mut guard =
            self.inner.lock().map_err(|_| Error::Invalid { what: "CUDA transfer", reason: "poisoned".into() })?;
        let Inner { ring, stats } = &mut *guard;
        let (_, slot, waited) = ring.acquire()?;
        if waited {
            stats.slot_waits += 1;
            syncs::record(Site::TransferSlot);
        }
        let allocs = [
            ensure_pinned(&self.ctx, &mut slot.pixels_host, pixels.len())?,
            ensure_device(&self.copy, &mut slot.pixels_dev, pixels.len())?,
            ensure_pinned(&self.ctx, &mut slot.targets_host, tlen)?,
            ensure_device(&self.copy, &mut slot.targets_dev, tlen)?,
        ];
        stats.staging_allocs += allocs.iter().filter(|a| **a).count() as u64;
        let (Some(ph), Some(pd), Some(th), Some(td)) =
            (&mut slot.pixels_host, &mut slot.pixels_dev, &mut slot.targets_host, &mut slot.targets_dev)
        else {
            return Err(Error::Invalid { what: "CUDA transfer", reason: "staging missing after allocation".into() });
        };
        // The slot's fence is done, so these return at once (the pinned buffers' own events precede it).
        ph.as_mut_slice().map_err(drv("pinned staging"))?[..pixels.len()].copy_from_slice(pixels);
        {
            let t = &mut th.as_mut_slice().map_err(drv("pinned staging"))?[..tlen];
            let (c, rest) = t.split_at_mut(classes.len());
            let (b, k) = rest.split_at_mut(boxes.len());
            c.copy_from_slice(&classes);
            b.copy_from_slice(&boxes);
            k.copy_from_slice(&mask);
        }
        // Copy stream: H2D of both, then `copied`.
        let (ph, th) = (PinnedPrefix { buf: ph, len: pixels.len() }, PinnedPrefix { buf: th, len: tlen });
        self.copy.memcpy_htod(&ph, &mut pd.slice_mut(..pixels.len())).map_err(drv("H2D pixels"))?;
        self.copy.memcpy_htod(&th, &mut td.slice_mut(..tlen)).map_err(drv("H2D targets"))?;
        slot.copied.record(&self.copy).map_err(drv("transfer event"))?;
        // Compute stream: wait on the device, convert, copy the targets out, then `consumed`.
        self.compute.wait(&slot.copied).map_err(drv("transfer event"))?;
        let len = pixels.len();
        let scale = 1.0f32 / 255.0;
        let dims = [n, shape.channels, shape.height, shape.width];
        let src = pd.slice(..len);
        let images = if self.dtype == DType::F32 {
            self.wrap(self.convert.to_f32(&self.compute, &src, scale).map_err(candle("image conversion"))?, &dims)
        } else {
            self.wrap(self.convert.to_bf16(&self.compute, &src, scale).map_err(candle("image conversion"))?, &dims)
        };
        let targets = self.compute.clone_dtod(&td.slice(..tlen)).map_err(drv("target tensors"))?;
        slot.consumed.0.record(&self.compute).map_err(drv("transfer event"))?;
        slot.used = true;
        stats.batches += 1;
        drop(guard);
        let targets = self.wrap(targets, &[tlen]);
        let nm = n * m;
        let gt_classes = targets.narrow(0, 0, nm).and_then(|t| t.reshape((n, m))).map_err(candle("target classes"))?;
        let gt_boxes =
            targets.narrow(0, nm, nm * 4).and_then(|t| t.reshape((n, m, 4))).map_err(candle("target boxes"))?;
        let gt_mask = targets.narrow(0, nm * 5, nm).and_then(|t| t.reshape((n, m))).map_err(candle("target mask"))?;
        Ok(DeviceBatch { images, gt_classes, gt_boxes, gt_mask, len: n, max_boxes: m, index: batch.index })
    }
}

/// One readback slot: a pinned buffer, the compute-stream event after which the tensor is ready, the copy's event,
/// and the tensor kept alive until its copy has landed.
struct ReadSlot {
    host: Option<PinnedHostSlice<f32>>,
    after: CudaEvent,
    landed: CudaEvent,
    keep: Option<Tensor>,
    tag: u64,
    len: usize,
}

/// The CUDA side of [`crate::Readback`].
pub(crate) struct CudaReadback {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    slots: Vec<ReadSlot>,
    head: usize,
    queued: usize,
}

impl std::fmt::Debug for CudaReadback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaReadback").field("queued", &self.queued).finish_non_exhaustive()
    }
}

impl CudaReadback {
    pub(crate) fn new(device: &Device, slots: usize) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(Error::Invalid { what: "CUDA readback", reason: format!("device {device:?} is not CUDA") });
        };
        let compute = cuda.cuda_stream();
        let ctx = compute.context().clone();
        let copy = ctx.new_stream().map_err(drv("readback stream"))?;
        let mut ring = Vec::with_capacity(slots.max(1));
        for _ in 0..slots.max(1) {
            ring.push(ReadSlot {
                host: None,
                after: ctx.new_event(None).map_err(drv("readback event"))?,
                landed: ctx.new_event(None).map_err(drv("readback event"))?,
                keep: None,
                tag: 0,
                len: 0,
            });
        }
        Ok(Self { ctx, compute, copy, slots: ring, head: 0, queued: 0 })
    }

    pub(crate) fn pending(&self) -> usize {
        self.queued
    }

    pub(crate) fn oldest_landed(&self) -> Result<bool> {
        if self.queued == 0 {
            return Ok(true);
        }
        self.slots[self.head].landed.try_is_complete().map_err(drv("readback event"))
    }

    /// `t` is a flat f32 tensor on this device.
    pub(crate) fn submit(&mut self, tag: u64, t: &Tensor) -> Result<()> {
        if self.queued == self.slots.len() {
            // The caller takes the oldest copy first ([`crate::Readback::submit`] does).
            return Err(Error::Invalid {
                what: "CUDA readback",
                reason: format!("{} copies queued and none taken; poll before submitting more", self.queued),
            });
        }
        let t = t.contiguous().map_err(candle("readback"))?;
        let i = (self.head + self.queued) % self.slots.len();
        let n = t.elem_count();
        let slot = &mut self.slots[i];
        ensure_pinned(&self.ctx, &mut slot.host, n)?;
        let Some(host) = slot.host.as_mut() else {
            return Err(Error::Invalid { what: "CUDA readback", reason: "no pinned buffer".into() });
        };
        slot.after.record(&self.compute).map_err(drv("readback event"))?;
        self.copy.wait(&slot.after).map_err(drv("readback event"))?;
        {
            let (storage, layout) = t.storage_and_layout();
            let candle_core::Storage::Cuda(cs) = &*storage else {
                return Err(Error::Invalid { what: "CUDA readback", reason: "the tensor is not on the GPU".into() });
            };
            let src = cs.as_cuda_slice::<f32>().map_err(candle("readback"))?;
            let (start, end) = layout
                .contiguous_offsets()
                .ok_or_else(|| Error::Invalid { what: "CUDA readback", reason: "not contiguous".into() })?;
            self.copy.memcpy_dtoh(&src.slice(start..end), host).map_err(drv("D2H readback"))?;
        }
        slot.landed.record(&self.copy).map_err(drv("readback event"))?;
        slot.keep = Some(t);
        slot.tag = tag;
        slot.len = n;
        self.queued += 1;
        Ok(())
    }

    /// The oldest copy into `out` (waiting for it if it has not landed).
    pub(crate) fn take(&mut self, out: &mut Vec<f32>) -> Result<Option<u64>> {
        if self.queued == 0 {
            return Ok(None);
        }
        let slot = &mut self.slots[self.head];
        slot.landed.synchronize().map_err(drv("readback event"))?;
        let host = slot
            .host
            .as_ref()
            .ok_or_else(|| Error::Invalid { what: "CUDA readback", reason: "no pinned buffer".into() })?;
        out.clear();
        out.extend_from_slice(&host.as_slice().map_err(drv("readback"))?[..slot.len]);
        slot.keep = None;
        let tag = slot.tag;
        self.head = (self.head + 1) % self.slots.len();
        self.queued -= 1;
        Ok(Some(tag))
    }
}
