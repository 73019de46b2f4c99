//! A global allocator for the test binaries that fills every new allocation (and the grown part of every
//! reallocation) with `0xFF` bytes: NaN as f32 and f64. The kernels write their outputs into uninitialised memory
//! (`sluice_kernels::uninit`) and reuse workspaces; a fresh page from the OS is zeroed, so an element a kernel forgets
//! to write would read as 0 in a test and as stale data in a long training run. With this allocator it reads as NaN
//! and the error measures, which propagate NaN, fail.

use std::alloc::{GlobalAlloc, Layout, System};

struct Poison;

// SAFETY: every call forwards to `System` with the caller's layout; the only addition writes inside the block just
// returned.
unsafe impl GlobalAlloc for Poison {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            // SAFETY: `p` points to `layout.size()` writable bytes.
            unsafe { p.write_bytes(0xFF, layout.size()) };
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() && new_size > layout.size() {
            // SAFETY: the block holds `new_size` bytes; the tail past the old size is new.
            unsafe { p.add(layout.size()).write_bytes(0xFF, new_size - layout.size()) };
        }
        p
    }
}

#[global_allocator]
static POISON: Poison = Poison;

/// Whether a fresh allocation reads as the poison bytes (lets a test check that this allocator is in use).
#[allow(dead_code)] // Not every test binary checks it.
pub(crate) fn active() -> bool {
    let v: Vec<f32> = Vec::with_capacity(4);
    // SAFETY: the block holds `capacity · 4` bytes, all written by `Poison::alloc`; u8 has no invalid values.
    let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), v.capacity() * 4) };
    bytes.iter().all(|&b| b == 0xFF)
}
