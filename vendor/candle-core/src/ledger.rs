//! A ledger of the work a program dispatches through candle (feature `ledger`): while recording, every storage
//! op (element-wise, reduction, copy, matmul, convolution, custom op, fill, upload, read back to the host) adds one
//! [`OpRecord`] with its name, dtype, input shapes, the bytes it reads and writes, the buffers it allocates and the
//! kernel launches it stands for on a GPU. Views (reshape, narrow, transpose, broadcast) touch no storage and cost
//! nothing. The ledger is a model of a device's work recorded from any backend, not a timing: the same program
//! gives the same records, so it can be compared with another framework's and held to a budget.
//!
//! Rules, per record:
//! - `bytes_read`: for each input, its distinct elements (dims with a zero stride, a broadcast, count once) times
//!   the element size;
//! - `bytes_written`: the output's elements times the element size;
//! - `allocs`/`alloc_bytes`: one fresh output buffer, or none for an op writing into an existing one;
//! - `launches`: one per op, a custom op's [`crate::CustomOp1::launches`] (kernels its CUDA path runs), none for
//!   an allocation alone;
//! - `host_reads`: one for a read of a tensor's values back to the host (`to_vec*`, `to_scalar`).
//!
//! Without the feature every entry point is an empty inline function. With it, not recording costs one atomic
//! load per op.

use crate::{DType, Layout};

/// One op as the ledger saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    /// The phase set by [`set_phase`] when the op ran.
    pub phase: String,
    /// The op: `unary:silu`, `binary:add`, `reduce:Sum`, `custom:<name>`, `copy_strided`, `to_host`, …
    pub op: String,
    /// The dtype of the output (or of the input for ops without one).
    pub dtype: DType,
    /// The input shapes, as `[32,16,80,80],[16]`.
    pub shapes: String,
    /// Kernel launches it stands for on a GPU.
    pub launches: u64,
    /// Bytes read from its inputs.
    pub bytes_read: u64,
    /// Bytes written to its output.
    pub bytes_written: u64,
    /// Fresh buffers allocated.
    pub allocs: u64,
    /// Bytes of those buffers.
    pub alloc_bytes: u64,
    /// Reads of values back to the host.
    pub host_reads: u64,
}

/// The distinct bytes a layout addresses: dims with a zero stride (broadcast) count once.
pub fn layout_bytes(l: &Layout, dtype: DType) -> u64 {
    let elems: usize = l
        .dims()
        .iter()
        .zip(l.stride())
        .map(|(&d, &s)| if s == 0 { 1 } else { d })
        .product();
    (elems * dtype.size_in_bytes()) as u64
}

/// `[a,b],[c]` from layouts.
pub fn shapes_of(layouts: &[&Layout]) -> String {
    let mut s = String::new();
    for (i, l) in layouts.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('[');
        for (j, d) in l.dims().iter().enumerate() {
            if j > 0 {
                s.push(',');
            }
            s.push_str(&d.to_string());
        }
        s.push(']');
    }
    s
}

#[cfg(feature = "ledger")]
mod imp {
    use super::OpRecord;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;

    static ON: AtomicBool = AtomicBool::new(false);
    static PAUSED: AtomicUsize = AtomicUsize::new(0);
    static STATE: Mutex<(String, Vec<OpRecord>)> = Mutex::new((String::new(), Vec::new()));

    fn state() -> std::sync::MutexGuard<'static, (String, Vec<OpRecord>)> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        STATE.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[inline]
    pub fn recording() -> bool {
        ON.load(Ordering::Relaxed) && PAUSED.load(Ordering::Relaxed) == 0
    }

    pub fn start(phase: &str) {
        let mut s = state();
        s.0 = phase.to_string();
        s.1.clear();
        ON.store(true, Ordering::SeqCst);
    }

    pub fn stop() -> Vec<OpRecord> {
        ON.store(false, Ordering::SeqCst);
        std::mem::take(&mut state().1)
    }

    pub fn set_phase(phase: &str) {
        state().0 = phase.to_string();
    }

    pub fn pause() {
        PAUSED.fetch_add(1, Ordering::SeqCst);
    }

    pub fn resume() {
        PAUSED.fetch_sub(1, Ordering::SeqCst);
    }

    pub fn push(mut r: OpRecord) {
        let mut s = state();
        r.phase = s.0.clone();
        s.1.push(r);
    }
}

#[cfg(not(feature = "ledger"))]
mod imp {
    use super::OpRecord;

    #[inline(always)]
    pub fn recording() -> bool {
        false
    }
    pub fn start(_phase: &str) {}
    pub fn stop() -> Vec<OpRecord> {
        Vec::new()
    }
    pub fn set_phase(_phase: &str) {}
    pub fn pause() {}
    pub fn resume() {}
    pub fn push(_r: OpRecord) {}
}

/// Whether the crate is built with the ledger (feature `ledger`).
pub const AVAILABLE: bool = cfg!(feature = "ledger");

/// Whether ops are being recorded now (and not paused).
#[inline(always)]
pub fn recording() -> bool {
    imp::recording()
}

/// Clears the ledger and records from now on, in `phase`. Recording is process-wide: ops from every thread go in.
pub fn start(phase: &str) {
    imp::start(phase)
}

/// Stops recording and returns the records in the order they were made.
pub fn stop() -> Vec<OpRecord> {
    imp::stop()
}

/// The phase later records carry.
pub fn set_phase(phase: &str) {
    imp::set_phase(phase)
}

/// Runs `f` without recording its ops: for a host-side stand-in (a CPU twin) of device work whose own ops are not
/// the device's, which then records what the device runs with [`record`].
pub fn paused<T>(f: impl FnOnce() -> T) -> T {
    struct Resume;
    impl Drop for Resume {
        fn drop(&mut self) {
            imp::resume()
        }
    }
    imp::pause();
    let _resume = Resume;
    f()
}

/// Adds a record (its phase is the current one) when recording.
pub fn record(r: OpRecord) {
    if recording() {
        imp::push(r)
    }
}

/// A storage op: `inputs` read, `out_bytes` written to a fresh buffer when `alloc`, else into an existing one.
pub(crate) fn op(
    name: impl FnOnce() -> String,
    dtype: DType,
    inputs: &[(&Layout, DType)],
    out_bytes: u64,
    alloc: bool,
    launches: u64,
) {
    if !recording() {
        return;
    }
    let layouts: Vec<&Layout> = inputs.iter().map(|(l, _)| *l).collect();
    imp::push(OpRecord {
        phase: String::new(),
        op: name(),
        dtype,
        shapes: shapes_of(&layouts),
        launches,
        bytes_read: inputs.iter().map(|(l, d)| layout_bytes(l, *d)).sum(),
        bytes_written: out_bytes,
        allocs: u64::from(alloc),
        alloc_bytes: if alloc { out_bytes } else { 0 },
        host_reads: 0,
    })
}

/// A buffer allocated without a kernel (`launches` 0), or filled or uploaded by one (`launches` 1).
pub(crate) fn alloc(name: &'static str, dims: &[usize], dtype: DType, launches: u64) {
    if !recording() {
        return;
    }
    let bytes = (dims.iter().product::<usize>() * dtype.size_in_bytes()) as u64;
    imp::push(OpRecord {
        phase: String::new(),
        op: name.to_string(),
        dtype,
        shapes: shapes_of(&[&Layout::contiguous(dims)]),
        launches,
        bytes_read: 0,
        bytes_written: if launches > 0 { bytes } else { 0 },
        allocs: 1,
        alloc_bytes: bytes,
        host_reads: 0,
    })
}

/// A read of a tensor's values back to the host.
pub(crate) fn host_read(l: &Layout, dtype: DType) {
    if !recording() {
        return;
    }
    imp::push(OpRecord {
        phase: String::new(),
        op: "to_host".to_string(),
        dtype,
        shapes: shapes_of(&[l]),
        launches: 1,
        bytes_read: layout_bytes(l, dtype),
        bytes_written: 0,
        allocs: 0,
        alloc_bytes: 0,
        host_reads: 1,
    })
}
