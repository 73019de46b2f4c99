//! The thread policy of the CPU path. The model's kernels ([`crate::conv`], [`crate::norm`], [`crate::pool`]) and
//! candle's matmuls run on rayon's global pool. Candle 0.11 also runs its element-wise ops on a second pool of its
//! own, the "barrier pool" (`candle-bp-*` threads, one per core minus one), whose workers and whose caller spin
//! for up to 25 000 iterations waiting for each other. On a machine with few cores those spinning threads compete
//! with rayon's workers and the data loader for the same cores: a profile of a YOLOv8 training step on 2 cores
//! showed 16% of the samples in the caller's spin-wait (`BarrierGuard::drop`) and 13% in the barrier worker.
//!
//! [`tame_candle_pools`] sizes that pool before candle creates it: on machines with at most
//! [`SMALL_MACHINE_CORES`] cores it gets no worker (element-wise ops run inline on the calling thread, which is
//! already one of the busy cores), and elsewhere its spin limit is lowered so idle workers park quickly. A value the
//! user set in `CANDLE_NUM_THREADS` or `CANDLE_BARRIER_POOL_SPIN_LIMIT` is always kept. The effect shows in
//! `sluice bench model` (figures in `docs/bench-results.md`).
//!
//! [`on_compute_pool`] runs a whole forward or training step on one of the pool's workers, so the kernels' parallel
//! loops start from inside the pool instead of each parking and waking the calling thread.

/// Machines with at most this many cores run candle's element-wise ops on the calling thread.
pub const SMALL_MACHINE_CORES: usize = 4;

/// Spin iterations before an idle barrier-pool worker parks (candle's default is 25 000).
pub const BARRIER_SPIN_LIMIT: u32 = 1_000;

/// What [`tame_candle_pools`] decided, for `sluice info` and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadPolicy {
    /// `CANDLE_NUM_THREADS` as candle will read it (`None`: candle's default, one per core).
    pub candle_threads: Option<String>,
    /// `CANDLE_BARRIER_POOL_SPIN_LIMIT` as candle will read it.
    pub spin_limit: Option<String>,
}

/// The environment values to set for a machine with `cores` cores, given what is already set.
pub fn policy_for(cores: usize, num_threads: Option<&str>, spin: Option<&str>) -> ThreadPolicy {
    let candle_threads = match num_threads {
        Some(v) => Some(v.to_string()),
        None if cores <= SMALL_MACHINE_CORES => Some("1".to_string()),
        None => None,
    };
    let spin_limit = Some(spin.map_or_else(|| BARRIER_SPIN_LIMIT.to_string(), str::to_string));
    ThreadPolicy { candle_threads, spin_limit }
}

/// Applies [`policy_for`] this machine to the process environment, where candle reads it when its first
/// element-wise op creates the barrier pool; `env` gives the variables' current values (a user's setting wins).
///
/// # Safety
/// Changes the process environment: call it at the start of `main`, before any other thread exists (the
/// requirement of [`std::env::set_var`]) and before the first candle operation.
pub unsafe fn tame_candle_pools(env: &dyn Fn(&str) -> Option<String>) -> ThreadPolicy {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let num = env("CANDLE_NUM_THREADS");
    let spin = env("CANDLE_BARRIER_POOL_SPIN_LIMIT");
    let p = policy_for(cores, num.as_deref(), spin.as_deref());
    if let (Some(v), None) = (&p.candle_threads, &num) {
        // SAFETY: the caller guarantees that no other thread runs yet.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", v) };
    }
    if let (Some(v), None) = (&p.spin_limit, &spin) {
        // SAFETY: as above.
        unsafe { std::env::set_var("CANDLE_BARRIER_POOL_SPIN_LIMIT", v) };
    }
    p
}

/// Runs `f` on a worker of rayon's global pool (the compute pool) and returns its result; the calling thread
/// waits. Call it around a whole forward, training step or validation batch from a thread outside the pool. Only
/// for the CPU `device`: elsewhere `f` runs on the calling thread, where the device's context is bound (a CUDA
/// context is current per thread, and the CPU kernels' loops are not what such a step waits on).
///
/// Every parallel loop of the kernels started from outside the pool injects its tasks and parks the caller until
/// a worker has run them, so each of the model's few hundred loops per forward paid a futex wake-up of the caller
/// as well as of a sleeping worker. Started from a worker, a loop runs its first half on that worker and leaves the
/// rest to be stolen: one wake-up per call of `f`. Inside the pool already, `f` simply runs here.
pub fn on_compute_pool<R: Send>(device: &candle_core::Device, f: impl FnOnce() -> R + Send) -> R {
    if !device.is_cpu() || rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_on_a_pool_worker() {
        assert_eq!(rayon::current_thread_index(), None, "the test harness thread is not a pool worker");
        let cpu = candle_core::Device::Cpu;
        let (index, value) = on_compute_pool(&cpu, || (rayon::current_thread_index(), 7));
        assert!(index.is_some());
        assert_eq!(value, 7);
        // Nested: runs in place.
        let (outer, inner) = on_compute_pool(&cpu, || {
            (rayon::current_thread_index(), on_compute_pool(&cpu, rayon::current_thread_index))
        });
        assert_eq!(outer, inner, "a nested call runs on the same worker");
    }

    #[test]
    fn small_machines_run_elementwise_inline_and_user_values_win() {
        let p = policy_for(2, None, None);
        assert_eq!(p.candle_threads.as_deref(), Some("1"));
        assert_eq!(p.spin_limit.as_deref(), Some("1000"));
        let p = policy_for(16, None, None);
        assert_eq!(p.candle_threads, None);
        let p = policy_for(2, Some("2"), Some("25000"));
        assert_eq!(p.candle_threads.as_deref(), Some("2"));
        assert_eq!(p.spin_limit.as_deref(), Some("25000"));
    }
}
