//! The im2col workspace: one growable buffer per thread and element type, taken out for the duration of one task
//! and put back afterwards, so a training step allocates no new workspace after its first few layers.
//!
//! Taking the buffer out (instead of borrowing it through a `RefCell`) makes re-entrancy harmless: when rayon runs
//! another conv task on this thread while the first waits inside `gemm`, that task finds the slot empty and uses a
//! fresh buffer; when both finish, the larger buffer is the one kept.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held right now by all threads' workspaces (buffers out on loan count too).
static CURRENT_BYTES: AtomicUsize = AtomicUsize::new(0);
/// The largest value `CURRENT_BYTES` has reached.
static PEAK_BYTES: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static WS_F32: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static WS_F64: Cell<Vec<f64>> = const { Cell::new(Vec::new()) };
}

/// Bytes held by the conv workspaces of all threads now.
pub(crate) fn current_bytes() -> usize {
    CURRENT_BYTES.load(Ordering::Relaxed)
}

/// The most bytes the conv workspaces of all threads have held at once since the process started.
pub(crate) fn peak_bytes() -> usize {
    PEAK_BYTES.load(Ordering::Relaxed)
}

/// The element types the kernels run on (f32 for training, f64 for the gradient checks).
pub(crate) trait Elem: Copy + Send + Sync + Default + std::ops::AddAssign + 'static {
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// The value as f64 (exact).
    fn to_f64(self) -> f64;
    /// The f64 rounded to this type.
    fn from_f64(v: f64) -> Self;
    /// Runs `f` on this thread's workspace, grown to at least `len` elements (contents unspecified).
    fn with_workspace<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

fn with_slot<T: Copy + Default, R>(
    slot: &'static std::thread::LocalKey<Cell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    let elem = std::mem::size_of::<T>();
    let mut buf = slot.with(Cell::take);
    if buf.len() < len {
        let before = buf.capacity() * elem;
        buf = Vec::new();
        buf.resize(len, T::default());
        let after = buf.capacity() * elem;
        let now = CURRENT_BYTES.fetch_add(after, Ordering::Relaxed) + after;
        CURRENT_BYTES.fetch_sub(before, Ordering::Relaxed);
        PEAK_BYTES.fetch_max(now, Ordering::Relaxed);
    }
    let r = f(&mut buf[..len]);
    // Keep the larger of this buffer and whatever a re-entrant task left in the slot.
    let other = slot.with(|s| s.replace(Vec::new()));
    let (keep, drop) = if other.capacity() > buf.capacity() { (other, buf) } else { (buf, other) };
    CURRENT_BYTES.fetch_sub(drop.capacity() * elem, Ordering::Relaxed);
    slot.with(|s| s.set(keep));
    r
}

impl Elem for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn with_workspace<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        with_slot(&WS_F32, len, f)
    }
}

impl Elem for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn with_workspace<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        with_slot(&WS_F64, len, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_is_reused_and_counted() {
        let p0 = f64::with_workspace(1000, |b| {
            b.fill(1.0);
            b.as_ptr() as usize
        });
        let p1 = f64::with_workspace(500, |b| b.as_ptr() as usize);
        assert_eq!(p0, p1, "a smaller request reuses the buffer");
        assert!(peak_bytes() >= 8000);
        assert!(current_bytes() >= 8000);
    }

    #[test]
    fn reentrant_use_gets_its_own_buffer() {
        f32::with_workspace(64, |outer| {
            outer.fill(2.0);
            f32::with_workspace(128, |inner| inner.fill(3.0));
            assert!(outer.iter().all(|&v| v == 2.0));
        });
    }
}
