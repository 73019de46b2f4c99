//! The gemm calls of the conv kernels: [`matmul`] on a slice borrowed mutably, [`SharedOut`] for the tasks of one
//! parallel loop that write disjoint elements of one output, and the group loop and gemm threading policy
//! ([`for_groups`], [`gemm_par`]) of [`Geom::plan`](super::Geom::plan).

use std::mem::MaybeUninit;

use gemm::Parallelism;
use rayon::prelude::*;

use super::Elem;

/// `dst (m×n) = [dst +] lhs (m×k) · rhs (k×n)` with explicit row/column strides; bounds are checked against the
/// slices before the unchecked gemm runs. Without `accumulate` the gemm writes every element of `dst` without
/// reading it, so `dst` may be uninitialised then; with `accumulate` it must be initialised.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul<T: Elem>(
    mnk: (usize, usize, usize),
    dst: &mut [MaybeUninit<T>],
    dst_strides: (usize, usize),
    accumulate: bool,
    lhs: &[T],
    lhs_strides: (usize, usize),
    rhs: &[T],
    rhs_strides: (usize, usize),
    par: Parallelism,
) {
    let out = SharedOut::new(dst);
    // SAFETY: `dst` is borrowed mutably for the whole call, so no other reference reaches the elements written.
    unsafe { out.matmul(0, mnk, dst_strides, accumulate, lhs, lhs_strides, rhs, rhs_strides, par) }
}

/// An output buffer that the tasks of one parallel loop write at once, each to its own elements (the tiles of
/// [`forward_tiled`](super::tiled::forward_tiled) interleave: a tile is a column range of every output channel's row).
pub(super) struct SharedOut<T> {
    ptr: *mut MaybeUninit<T>,
    len: usize,
}

// SAFETY: the pointer is only dereferenced through the unsafe methods below, whose callers guarantee that no two
// threads touch the same element.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T: Elem> SharedOut<T> {
    pub(super) fn new(buf: &mut [MaybeUninit<T>]) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len() }
    }

    /// The elements `start..start + len`.
    ///
    /// # Safety
    /// No other live reference, and no other thread, may touch these elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn slice(&self, start: usize, len: usize) -> &mut [MaybeUninit<T>] {
        assert!(start + len <= self.len, "conv output: tile out of bounds");
        // SAFETY: in bounds (checked); exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// [`matmul`] into the elements `at + i·dst_rs + j·dst_cs` (`i < m`, `j < n`).
    ///
    /// # Safety
    /// No other thread, and no live reference, may touch those elements during the call.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn matmul(
        &self,
        at: usize,
        (m, n, k): (usize, usize, usize),
        (dst_rs, dst_cs): (usize, usize),
        accumulate: bool,
        lhs: &[T],
        (lhs_rs, lhs_cs): (usize, usize),
        rhs: &[T],
        (rhs_rs, rhs_cs): (usize, usize),
        par: Parallelism,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
        assert!(at + last(m, n, dst_rs, dst_cs) < self.len, "conv gemm: dst out of bounds");
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        // SAFETY: in bounds (checked above); exclusive per the caller's contract.
                        unsafe { self.ptr.add(at + i * dst_rs + j * dst_cs).write(MaybeUninit::new(T::ZERO)) };
                    }
                }
            }
            return;
        }
        assert!(last(m, k, lhs_rs, lhs_cs) < lhs.len(), "conv gemm: lhs out of bounds");
        assert!(last(k, n, rhs_rs, rhs_cs) < rhs.len(), "conv gemm: rhs out of bounds");
        // SAFETY: every index the gemm touches, (i·rs + j·cs) for i < rows and j < cols, was checked above to lie
        // inside its buffer; the destination elements are exclusive to this call (the caller's contract), so they
        // alias neither lhs nor rhs, which are shared borrows.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                self.ptr.add(at).cast::<T>(),
                dst_cs as isize,
                dst_rs as isize,
                accumulate,
                lhs.as_ptr(),
                lhs_cs as isize,
                lhs_rs as isize,
                rhs.as_ptr(),
                rhs_cs as isize,
                rhs_rs as isize,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// Runs `f(group_index, chunk)` over the `g`-image chunks of `out`, in parallel or in order per the plan.
pub(super) fn for_groups<U: Send>(
    out: &mut [U],
    chunk: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [U]) + Sync + Send,
) {
    if parallel {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

pub(super) fn gemm_par(parallel_groups: bool) -> Parallelism {
    let threads = rayon::current_num_threads();
    if parallel_groups || threads <= 1 { Parallelism::None } else { Parallelism::Rayon(threads) }
}
