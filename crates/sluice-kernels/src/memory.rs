//! The memory policy of the CPU path, next to the thread policy in [`crate::threads`]: every binary that runs the
//! model (the `sluice` tool and the model benches) allocates through mimalloc and keeps freed memory mapped.
//!
//! Candle allocates a fresh buffer for every tensor op. glibc's malloc serves the large ones with mmap/munmap, so
//! each training step paid page faults, page zeroing and TLB shootdowns for memory it had just freed; mimalloc
//! reuses them, but by default returns ("purges") freed pages to the OS 10 ms later, and a step or an inference
//! that takes longer than that faulted them back in. [`keep_freed_memory`] turns the purge off.
//!
//! With purging, a short yolov8n 320/b8 training bench takes about 500 k page faults and four times the system time
//! it takes without (about 700 faults in all, none in the steady state); under glibc's defaults the 640/b1 fused
//! inference spends a noticeable share of its samples in page faults (`cargo bench -p sluice-model --bench forward`).

/// The allocator to install with `#[global_allocator]`.
pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay` (the same index in mimalloc v2 and v3's option enum).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Keeps freed memory mapped instead of purging it after mimalloc's default 10 ms. The process keeps its peak
/// footprint, which a training run reaches in its first steps anyway. `MIMALLOC_PURGE_DELAY` in the environment
/// (read through `env`: the binary passes the process environment) still wins. It only has an effect when
/// [`MiMalloc`] is the global allocator.
///
/// # Safety
/// Call it first in `main` (or a bench's entry point), before any other thread exists: `mi_option_set` is not
/// thread safe.
pub unsafe fn keep_freed_memory(env: &dyn Fn(&str) -> Option<String>) {
    if env("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: the caller guarantees no other thread exists yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// The whole CPU process policy in one call, for entry points: [`keep_freed_memory`] and
/// [`crate::threads::tame_candle_pools`], with the process environment read through `env` (an entry point passes
/// `&|k| std::env::var(k).ok()`).
///
/// # Safety
/// As both: first thing in `main`, before any other thread exists and before candle runs.
pub unsafe fn setup_process(env: &dyn Fn(&str) -> Option<String>) -> crate::threads::ThreadPolicy {
    // SAFETY: forwarded from the caller.
    unsafe {
        keep_freed_memory(env);
        crate::threads::tame_candle_pools(env)
    }
}
