//! The GPU collective engine: NCCL through cudarc's bindings, one process per GPU.
//!
//! Rank 0 makes the communicator's unique id with [`unique_id`]; the id travels to the other ranks as 128 bytes
//! through the TCP rendezvous, and every rank then builds its [`Nccl`] from it with [`Nccl::new`]. The id holds
//! rank 0's bootstrap address, so rank 0 must make it in the process that then joins as rank 0.
//!
//! Two kinds of operations:
//! - device-side, for the training step: [`Nccl::all_reduce_sum_tensor`] and [`Nccl::broadcast_tensor`] work in
//!   place on a candle CUDA tensor, with no host copy and without waiting for the GPU;
//! - host-side, the [`Collective`] trait, for small control data (validation metric bytes, the barrier): staged
//!   through the device and synchronised before they return.
//!
//! Every NCCL operation is enqueued on the candle device's own stream, the stream the forward and backward run
//! on, so it is ordered after the kernels that made its input and before the ones that read its output without
//! any event or synchronisation here.
//!
//! The communicator is owned here as a raw NCCL handle rather than through cudarc's safe `Comm`, because the
//! safe wrapper does not expose the handle that `ncclCommGetAsyncError` needs ([`Nccl::check`]) and panics if the
//! abort in its `Drop` fails.

use std::cell::Cell;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use candle_core::{CpuStorage, CudaStorage, DType, Device, InplaceOp1, Layout, Tensor};
use cudarc::driver::result::event as cu_event;
use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DriverError, ValidAsZeroBits};
use cudarc::nccl::{NcclType, result as nccl_result, sys};

use crate::collective::Collective;
use crate::error::{DistError, Result};

/// The length of an NCCL unique id in bytes (`NCCL_UNIQUE_ID_BYTES`).
pub const ID_BYTES: usize = 128;

/// The engine's name in errors and [`Collective::name`].
const ENGINE: &str = "nccl";

/// Makes a new communicator id. Rank 0 calls it once and sends the bytes to every other rank.
pub fn unique_id() -> Result<[u8; ID_BYTES]> {
    let id = nccl_result::get_uniqueid().map_err(|e| nccl_error(0, "making the unique id", e.0, null_comm()))?;
    Ok(id.internal.map(|c| c.to_ne_bytes()[0]))
}

/// An NCCL communicator bound to one CUDA device and its candle stream.
///
/// Callable from any thread: every operation holds a lock on the communicator for its whole length, because NCCL
/// does not allow overlapping calls on one communicator and because a host operation is several NCCL calls that
/// must stay in the same order on every rank.
#[derive(Debug)]
pub struct Nccl {
    comm: Mutex<Handle>,
    /// The candle device the communicator belongs to; tensors must be on it.
    device: Device,
    /// That device's stream, which every operation is enqueued on.
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
}

/// The raw communicator; null once [`Nccl::finish`] has destroyed it.
#[derive(Debug)]
struct Handle(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not overlap; every use goes
// through the `Mutex` in `Nccl`, and every operation binds the device's CUDA context to the calling thread first.
unsafe impl Send for Handle {}

impl Nccl {
    /// Joins the communicator `id` (from [`unique_id`] on rank 0) as `rank` of `world`, on `device`, which must be a
    /// CUDA device. Blocks until every rank has joined.
    pub fn new(device: &Device, rank: usize, world: usize, id: &[u8]) -> Result<Self> {
        let Device::Cuda(cuda) = device else {
            return Err(engine_error(rank, format!("the device must be a CUDA device, got {:?}", device.location())));
        };
        if rank >= world {
            return Err(engine_error(rank, format!("rank {rank} is outside a world of {world}")));
        }
        let internal = id_from_bytes(rank, id)?;
        let (nranks, me) = (to_c_int(rank, "world size", world)?, to_c_int(rank, "rank", rank)?);
        let stream = cuda.cuda_stream();
        // NCCL builds the communicator on the calling thread's current device.
        stream.context().bind_to_thread().map_err(|e| driver_error(rank, "binding the CUDA context", e))?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid place for the new handle; the id is plain bytes NCCL validates itself.
        unsafe { nccl_result::comm_init_rank(&mut comm, nranks, sys::ncclUniqueId { internal }, me) }
            .map_err(|e| nccl_error(rank, &format!("joining a world of {world}"), e.0, null_comm()))?;
        Ok(Self { comm: Mutex::new(Handle(comm)), device: device.clone(), stream, rank, world })
    }

    /// Sums the contiguous f32 CUDA tensor `t` over all ranks, in place in its storage.
    ///
    /// The reduction is enqueued on the device stream and this returns without waiting: later candle operations
    /// on the device see the sum, and reading it back to the host waits for it. Every rank calls this with a
    /// tensor of the same element count, in the same order as its other collectives.
    ///
    /// The storage is overwritten: every tensor that shares it (clones, views) sees the sum, and autograd does not
    /// know. Pass a tensor this caller owns alone, such as a gradient bucket fresh from `Tensor::cat`.
    pub fn all_reduce_sum_tensor(&self, t: &Tensor) -> Result<()> {
        self.in_place(t, DeviceOp::AllReduceSum)
    }

    /// Replaces the contiguous f32 CUDA tensor `t` on every rank with `root`'s, in place in its storage, enqueued
    /// without waiting like [`Nccl::all_reduce_sum_tensor`]. Every tensor that shares the storage sees `root`'s
    /// values, which is how a `Var`'s weights are replaced where they are.
    pub fn broadcast_tensor(&self, t: &Tensor, root: usize) -> Result<()> {
        let root = self.root(root)?;
        self.in_place(t, DeviceOp::Broadcast { root })
    }

    /// Fails with NCCL's error if the communicator has seen one in an operation already enqueued (a peer that went
    /// away, a network failure). A communicator in error must be [`Nccl::abort`]ed: it cannot recover.
    pub fn check(&self) -> Result<()> {
        self.check_with(&self.lock())
    }

    /// Aborts every operation still running on the communicator and frees it without waiting for the other
    /// ranks: the way out when a peer is lost or an operation hangs. Dropping the engine does the same.
    pub fn abort(self) {
        drop(self);
    }

    /// Ends the communicator cleanly: waits for its queued operations, then releases it in step with the other
    /// ranks (`ncclCommDestroy`). Every rank calls it; a rank whose peers may be gone calls [`Nccl::abort`] instead.
    pub fn finish(mut self) -> Result<()> {
        self.wait(&self.lock(), "finishing")?;
        let handle = self.comm.get_mut().unwrap_or_else(PoisonError::into_inner);
        let comm = std::mem::replace(&mut handle.0, null_comm());
        // SAFETY: `comm` is live and no longer reachable through `self`, so nothing uses it after this call.
        let destroyed = unsafe { sys::ncclCommDestroy(comm) }.result();
        destroyed.map(drop).map_err(|e| nccl_error(self.rank, "destroying the communicator", e.0, null_comm()))
    }

    /// Validates `root` and converts it for NCCL.
    fn root(&self, root: usize) -> Result<c_int> {
        if root >= self.world {
            return Err(engine_error(self.rank, format!("root {root} is outside a world of {}", self.world)));
        }
        to_c_int(self.rank, "root", root)
    }

    /// Runs `op` on the storage of `t` under candle's write lock.
    fn in_place(&self, t: &Tensor, op: DeviceOp) -> Result<()> {
        if !t.device().same_device(&self.device) {
            return Err(self.error(format!(
                "{op}: the tensor is on {:?}, not on this communicator's device {:?}",
                t.device().location(),
                self.device.location()
            )));
        }
        if t.dtype() != DType::F32 {
            return Err(self.error(format!("{op}: the tensor must be f32, got {:?}", t.dtype())));
        }
        if !t.is_contiguous() {
            return Err(self.error(format!("{op}: the tensor of shape {:?} is not contiguous", t.shape())));
        }
        let comm = self.lock();
        let run = InPlace { nccl: self, comm: &comm, op, failure: Cell::new(None) };
        // `inplace_op1` hands the storage over as `&mut` under the tensor's write lock, so nothing else in this
        // process reads or writes it while the operation is enqueued.
        let outcome = t.inplace_op1(&run);
        if let Some(e) = run.failure.take() {
            return Err(e);
        }
        outcome.map_err(|e| self.error(format!("{op}: {e}")))
    }

    /// Enqueues `op` in place on `buf` (a sum all-reduce, or a broadcast from a root) on the device stream and
    /// polls for asynchronous errors.
    fn enqueue_in_place<T: NcclType, B: DevicePtrMut<T>>(&self, c: &Handle, buf: &mut B, op: DeviceOp) -> Result<()> {
        let count = buf.len();
        // Skipping is consistent across ranks: every rank passes the same count.
        if count == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream = &*self.stream;
        let (ptr, written) = buf.device_ptr_mut(stream);
        let (send, recv, ty) = (ptr as *const c_void, ptr as *mut c_void, T::as_nccl_type());
        let cu_stream = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: `ptr` addresses `count` elements of `T` that `buf` holds and that stay borrowed mutably until
        // `written` records the stream's work on them after the call; NCCL allows the send and receive buffers to
        // be the same (in place); `c.0` is live and belongs to this stream's device.
        let done = unsafe {
            match op {
                DeviceOp::AllReduceSum => {
                    nccl_result::all_reduce(send, recv, count, ty, sys::ncclRedOp_t::ncclSum, c.0, cu_stream)
                }
                DeviceOp::Broadcast { root } => nccl_result::broadcast(send, recv, count, ty, root, c.0, cu_stream),
            }
        };
        drop(written);
        done.map_err(|e| self.nccl_error(c, &format!("{op} ({count} elements)"), e.0))?;
        self.check_with(c)
    }

    /// Enqueues an all-gather of every rank's `send` into `recv` (rank order) and polls for asynchronous errors.
    fn enqueue_all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        c: &Handle,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        let count = send.len();
        if recv.len() != count * self.world {
            return Err(self.error(format!(
                "all-gather: {} receive elements for {count} from each of {} ranks",
                recv.len(),
                self.world
            )));
        }
        if count == 0 {
            return Ok(());
        }
        self.bind()?;
        let stream = &*self.stream;
        let (src, read) = send.device_ptr(stream);
        let (dst, written) = recv.device_ptr_mut(stream);
        // SAFETY: `src` addresses `count` elements and `dst` `count × world` (checked above), both borrowed until
        // `read` and `written` record the stream's work after the call; the buffers are distinct allocations;
        // `c.0` is live and belongs to this stream's device.
        let done = unsafe {
            nccl_result::all_gather(
                src as *const c_void,
                dst as *mut c_void,
                count,
                T::as_nccl_type(),
                c.0,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        drop((read, written));
        done.map_err(|e| self.nccl_error(c, &format!("all-gather of {count} elements per rank"), e.0))?;
        self.check_with(c)
    }

    /// Sums `buf` over all ranks through the device and waits for it.
    fn all_reduce_host<T: NcclType + DeviceRepr>(&self, c: &Handle, buf: &mut [T]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut dev = self.stream.clone_htod(buf).map_err(|e| self.driver_error("copying to the device", e))?;
        self.enqueue_in_place(c, &mut dev, DeviceOp::AllReduceSum)?;
        self.wait(c, "all-reduce")?;
        self.stream.memcpy_dtoh(&dev, buf).map_err(|e| self.driver_error("copying to the host", e))
    }

    /// Replaces `buf` with `root`'s through the device and waits for it.
    fn broadcast_host<T: NcclType + DeviceRepr>(&self, c: &Handle, buf: &mut [T], root: c_int) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut dev = self.stream.clone_htod(buf).map_err(|e| self.driver_error("copying to the device", e))?;
        self.enqueue_in_place(c, &mut dev, DeviceOp::Broadcast { root })?;
        self.wait(c, "broadcast")?;
        self.stream.memcpy_dtoh(&dev, buf).map_err(|e| self.driver_error("copying to the host", e))
    }

    /// Every rank's `mine` (all the same length), concatenated in rank order, through the device.
    fn all_gather_host<T: NcclType + DeviceRepr + ValidAsZeroBits>(&self, c: &Handle, mine: &[T]) -> Result<Vec<T>> {
        // Every rank passes the same count, so all of them skip together.
        if mine.is_empty() {
            return Ok(Vec::new());
        }
        self.bind()?;
        let send = self.stream.clone_htod(mine).map_err(|e| self.driver_error("copying to the device", e))?;
        let mut recv = self
            .stream
            .alloc_zeros::<T>(mine.len() * self.world)
            .map_err(|e| self.driver_error("allocating the gather buffer", e))?;
        self.enqueue_all_gather(c, &send, &mut recv)?;
        self.wait(c, "all-gather")?;
        self.stream.clone_dtoh(&recv).map_err(|e| self.driver_error("copying to the host", e))
    }

    /// Fails unless every rank passed a buffer of `len` elements. Mismatched counts would leave NCCL waiting for
    /// data that never comes; the extra gather of one number per rank is cheap next to the staging of host data.
    fn agree_len(&self, c: &Handle, what: &str, len: usize) -> Result<()> {
        let lens = self.all_gather_host(c, &[len as u64])?;
        same_lengths(self.rank, what, &lens)
    }

    /// Waits for everything queued on the stream, polling NCCL for asynchronous errors meanwhile so that a failed
    /// peer ends in an error here instead of a stream synchronisation that never returns.
    fn wait(&self, c: &Handle, what: &str) -> Result<()> {
        self.bind()?;
        let event = self.stream.record_event(None).map_err(|e| self.driver_error(what, e))?;
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: `event` is a live event of this context (it is destroyed when dropped, after the loop).
            match unsafe { cu_event::query(event.cu_event()) } {
                Ok(()) => return self.check_with(c),
                Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => {}
                Err(e) => return Err(self.driver_error(what, e)),
            }
            self.check_with(c)?;
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    /// The asynchronous-error poll behind [`Nccl::check`], for a caller that holds the lock.
    fn check_with(&self, c: &Handle) -> Result<()> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: `c.0` is live (only `finish` and `Drop` release it, both by value) and `state` is a valid place
        // for the answer.
        let asked = unsafe { sys::ncclCommGetAsyncError(c.0, &mut state) };
        asked.result().map_err(|e| self.nccl_error(c, "asking for asynchronous errors", e.0))?;
        state.result().map_err(|e| self.nccl_error(c, "asynchronous error", e.0))?;
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, Handle> {
        // A poisoned lock only means another thread panicked between NCCL calls; the handle itself is still valid.
        self.comm.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes the device's context current on this thread, which the raw NCCL calls need.
    fn bind(&self) -> Result<()> {
        self.stream.context().bind_to_thread().map_err(|e| self.driver_error("binding the CUDA context", e))
    }

    fn error(&self, reason: String) -> DistError {
        engine_error(self.rank, reason)
    }

    fn nccl_error(&self, c: &Handle, what: &str, code: sys::ncclResult_t) -> DistError {
        nccl_error(self.rank, what, code, c.0)
    }

    fn driver_error(&self, what: &str, e: DriverError) -> DistError {
        driver_error(self.rank, what, e)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        let comm = self.comm.get_mut().unwrap_or_else(PoisonError::into_inner).0;
        if comm.is_null() {
            return;
        }
        // Abort rather than destroy: destroying waits for the other ranks, which would hang a process whose peer
        // is gone. A failed bind or abort leaves nothing else to do here.
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: `comm` is live and not used again.
        let _ = unsafe { sys::ncclCommAbort(comm) };
    }
}

impl Collective for Nccl {
    fn name(&self) -> &'static str {
        ENGINE
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        let c = self.lock();
        self.agree_len(&c, "all-reduce", buf.len())?;
        self.all_reduce_host(&c, buf)
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        let root = self.root(root)?;
        let c = self.lock();
        self.agree_len(&c, "broadcast", buf.len())?;
        self.broadcast_host(&c, buf, root)
    }

    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        let root_c = self.root(root)?;
        let c = self.lock();
        // The length travels first so that the other ranks can size their buffers.
        let mut len = [if self.rank == root { buf.len() as u64 } else { 0 }];
        self.broadcast_host(&c, &mut len, root_c)?;
        let len = usize::try_from(len[0])
            .map_err(|_| self.error(format!("broadcast of {} bytes does not fit in memory", len[0])))?;
        if self.rank != root {
            buf.clear();
            buf.resize(len, 0);
        }
        self.broadcast_host(&c, buf, root_c)
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        // NCCL gathers equal counts: exchange the lengths, pad to the longest, gather, then trim.
        let c = self.lock();
        let lens = self.all_gather_host(&c, &[mine.len() as u64])?;
        let longest = lens.iter().copied().max().unwrap_or(0);
        let longest =
            usize::try_from(longest).map_err(|_| self.error(format!("all-gather of {longest} bytes per rank")))?;
        if longest == 0 {
            return Ok(vec![Vec::new(); self.world]);
        }
        let gathered = self.all_gather_host(&c, &pad_to(mine, longest))?;
        split_trim(self.rank, &gathered, &lens, longest)
    }

    fn barrier(&self) -> Result<()> {
        let c = self.lock();
        self.bind()?;
        let mut one = self.stream.alloc_zeros::<u8>(1).map_err(|e| self.driver_error("allocating", e))?;
        self.enqueue_in_place(&c, &mut one, DeviceOp::AllReduceSum)?;
        self.wait(&c, "barrier")
    }
}

/// The device-side operations [`InPlace`] runs.
#[derive(Debug, Clone, Copy)]
enum DeviceOp {
    AllReduceSum,
    Broadcast { root: c_int },
}

impl std::fmt::Display for DeviceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AllReduceSum => f.write_str("all-reduce"),
            Self::Broadcast { root } => write!(f, "broadcast from rank {root}"),
        }
    }
}

/// A candle in-place operation that enqueues an NCCL collective on a tensor's CUDA storage.
struct InPlace<'a> {
    nccl: &'a Nccl,
    /// The communicator, locked by the caller for the whole operation.
    comm: &'a Handle,
    op: DeviceOp,
    /// The engine's own error, kept whole rather than flattened into a candle error message.
    failure: Cell<Option<DistError>>,
}

impl InplaceOp1 for InPlace<'_> {
    fn name(&self) -> &'static str {
        "nccl"
    }

    fn cpu_fwd(&self, _storage: &mut CpuStorage, _layout: &Layout) -> candle_core::Result<()> {
        candle_core::bail!("{}: the tensor is on the CPU", self.op)
    }

    fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("{}: the tensor is not contiguous", self.op)
        };
        let slice = storage.as_cuda_slice_mut::<f32>()?;
        let Some(mut view) = slice.try_slice_mut(start..end) else {
            candle_core::bail!("{}: elements {start}..{end} lie outside the storage", self.op)
        };
        let done = self.nccl.enqueue_in_place(self.comm, &mut view, self.op);
        done.map_err(|e| {
            let message = e.to_string();
            self.failure.set(Some(e));
            candle_core::Error::Msg(message)
        })
    }
}

/// The NCCL id in `bytes`, which must be exactly [`ID_BYTES`] long.
fn id_from_bytes(rank: usize, bytes: &[u8]) -> Result<[c_char; ID_BYTES]> {
    let bytes: &[u8; ID_BYTES] = bytes
        .try_into()
        .map_err(|_| engine_error(rank, format!("the unique id has {} bytes, NCCL's has {ID_BYTES}", bytes.len())))?;
    Ok(bytes.map(|b| c_char::from_ne_bytes([b])))
}

/// `mine` followed by zeros up to `len` bytes.
fn pad_to(mine: &[u8], len: usize) -> Vec<u8> {
    let mut padded = Vec::with_capacity(len.max(mine.len()));
    padded.extend_from_slice(mine);
    padded.resize(len.max(mine.len()), 0);
    padded
}

/// Splits the gather of `lens.len()` rows of `stride` padded bytes into each rank's bytes, trimmed to its length.
fn split_trim(rank: usize, gathered: &[u8], lens: &[u64], stride: usize) -> Result<Vec<Vec<u8>>> {
    if gathered.len() != lens.len() * stride {
        return Err(engine_error(
            rank,
            format!("all-gather returned {} bytes for {} ranks of {stride}", gathered.len(), lens.len()),
        ));
    }
    if stride == 0 {
        // Nothing was gathered: every rank must have announced nothing.
        return split_trim(rank, &vec![0; lens.len()], lens, 1)
            .map(|rows| rows.into_iter().map(|_| Vec::new()).collect());
    }
    lens.iter()
        .zip(gathered.chunks_exact(stride))
        .enumerate()
        .map(|(from, (&len, row))| {
            let len = usize::try_from(len).ok().filter(|&len| len <= row.len()).ok_or_else(|| DistError::Mismatch {
                rank,
                reason: format!("rank {from} announced {len} bytes in an all-gather of {stride} per rank"),
            })?;
            Ok(row[..len].to_vec())
        })
        .collect()
}

/// Fails naming the first rank whose length differs from rank 0's.
fn same_lengths(rank: usize, what: &str, lens: &[u64]) -> Result<()> {
    let Some((&first, rest)) = lens.split_first() else { return Ok(()) };
    match rest.iter().position(|&len| len != first) {
        None => Ok(()),
        Some(i) => Err(DistError::Mismatch {
            rank,
            reason: format!("{what}: rank 0 passed {first} elements, rank {} passed {}", i + 1, rest[i]),
        }),
    }
}

fn to_c_int(rank: usize, what: &str, v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| engine_error(rank, format!("{what} {v} does not fit NCCL's int")))
}

fn null_comm() -> sys::ncclComm_t {
    std::ptr::null_mut()
}

fn engine_error(rank: usize, reason: String) -> DistError {
    DistError::Engine { engine: ENGINE, rank, reason }
}

fn driver_error(rank: usize, what: &str, e: DriverError) -> DistError {
    engine_error(rank, format!("{what}: CUDA {e}"))
}

/// An NCCL failure with NCCL's own description of `code` and its last error message (the communicator's, or the
/// thread's when `comm` is null).
fn nccl_error(rank: usize, what: &str, code: sys::ncclResult_t, comm: sys::ncclComm_t) -> DistError {
    // SAFETY: NCCL returns a static string for every code.
    let text = unsafe { c_string(sys::ncclGetErrorString(code)) };
    // SAFETY: `comm` is live or null; the returned string stays valid until the next NCCL call on this thread, and
    // `c_string` copies it at once.
    let last = unsafe { c_string(sys::ncclGetLastError(comm)) };
    let mut reason = format!("{what}: {code:?} ({text})");
    if !last.is_empty() {
        reason.push_str(": ");
        reason.push_str(&last);
    }
    engine_error(rank, reason)
}

/// A copy of the C string at `p` (empty for null).
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that stays valid during the call.
unsafe fn c_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_must_have_nccl_s_length() {
        let bytes: Vec<u8> = (0..ID_BYTES as u32).map(|b| (b * 7 % 256) as u8).collect();
        let id = id_from_bytes(0, &bytes).unwrap();
        assert_eq!(id.map(|c| c.to_ne_bytes()[0]).to_vec(), bytes);
        for len in [0, 127, 129] {
            let err = id_from_bytes(3, &vec![0; len]).unwrap_err();
            assert!(matches!(err, DistError::Engine { engine: "nccl", rank: 3, .. }), "{err}");
            assert!(err.to_string().contains(&format!("{len} bytes")), "{err}");
        }
    }

    #[test]
    fn gathered_bytes_are_padded_then_trimmed_per_rank() {
        let mine: [&[u8]; 3] = [b"ab", b"", b"cdef"];
        let lens: Vec<u64> = mine.iter().map(|m| m.len() as u64).collect();
        let gathered: Vec<u8> = mine.iter().flat_map(|m| pad_to(m, 4)).collect();
        assert_eq!(gathered.len(), 12);
        let back = split_trim(0, &gathered, &lens, 4).unwrap();
        assert_eq!(back, mine.map(<[u8]>::to_vec));
    }

    #[test]
    fn a_length_past_the_stride_or_a_short_gather_is_an_error() {
        assert!(matches!(split_trim(1, &[0; 8], &[2, 5], 4), Err(DistError::Mismatch { rank: 1, .. })));
        assert!(split_trim(1, &[0; 7], &[2, 2], 4).is_err());
    }

    #[test]
    fn differing_lengths_name_the_rank() {
        assert!(same_lengths(0, "all-reduce", &[3, 3, 3]).is_ok());
        assert!(same_lengths(0, "all-reduce", &[]).is_ok());
        let err = same_lengths(2, "all-reduce", &[3, 3, 4]).unwrap_err();
        assert!(matches!(err, DistError::Mismatch { rank: 2, .. }));
        assert!(err.to_string().contains("rank 2 passed 4"), "{err}");
    }
}
