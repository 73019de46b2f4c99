//! Output buffers the kernels fill without zeroing them first. `vec![0.0; n]` has the allocator zero `n` elements
//! on the calling thread before the kernel writes every one of them again: on a training step that was 5% of the
//! samples, on the one thread that is not running the parallel kernels.

use std::mem::MaybeUninit;

/// A vector of `len` elements that `fill` writes. `fill` must initialise every element: each caller passes a
/// kernel that writes each output element (and says why in a comment).
pub(crate) fn filled_vec<T>(len: usize, fill: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<T> {
    let mut v = Vec::with_capacity(len);
    fill(&mut v.spare_capacity_mut()[..len]);
    // SAFETY: `fill` initialised the first `len` elements (the contract above).
    unsafe { v.set_len(len) };
    v
}

/// An initialised slice seen as possibly-uninitialised memory, for kernels that write without reading.
pub(crate) fn as_uninit<T>(s: &mut [T]) -> &mut [MaybeUninit<T>] {
    // SAFETY: `MaybeUninit<T>` has the layout of `T`, every `T` is a valid `MaybeUninit<T>`, and safe code can only
    // store initialised values through the result.
    unsafe { &mut *(s as *mut [T] as *mut [MaybeUninit<T>]) }
}

/// Writes `v` into every element and returns the now-initialised slice.
pub(crate) fn fill_init<T: Copy>(s: &mut [MaybeUninit<T>], v: T) -> &mut [T] {
    s.iter_mut().for_each(|d| {
        d.write(v);
    });
    // SAFETY: every element was just written.
    unsafe { assume_init_mut(s) }
}

/// A slice whose every element has been written, seen as initialised.
///
/// # Safety
/// Every element of `s` must be initialised.
pub(crate) unsafe fn assume_init_mut<T>(s: &mut [MaybeUninit<T>]) -> &mut [T] {
    // SAFETY: the caller's contract; `MaybeUninit<T>` has the layout of `T`.
    unsafe { &mut *(s as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// Writes `src` into `dst` (the shorter length).
pub(crate) fn write_all<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        d.write(*s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_vec_keeps_what_the_kernel_wrote() {
        let v = filled_vec(5, |s| write_all(s, &[1, 2, 3, 4, 5]));
        assert_eq!(v, [1, 2, 3, 4, 5]);
        let mut w = vec![9; 3];
        assert_eq!(fill_init(as_uninit(&mut w), 7), [7, 7, 7]);
    }
}
