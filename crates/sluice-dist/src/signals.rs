//! Stopping CPU ranks cleanly on Ctrl-C. `mpirun` treats SIGINT and SIGTERM as "abort the job" (its ranks are
//! terminated, then killed), but it forwards SIGUSR1 to every rank. So the `sluice` launcher runs `mpirun` in
//! its own process group (the terminal's Ctrl-C reaches only the launcher), turns the first Ctrl-C into SIGUSR1 for
//! `mpirun` to forward, and each rank treats SIGUSR1 as its stop request: the ranks agree to stop at the same
//! batch and rank 0 saves `last`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use crate::error::{DistError, Result};

/// The flag the SIGUSR1 handler sets (a leaked `Arc`'s pointer, never freed, so the handler can always use it).
static STOP: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());

#[cfg(unix)]
extern "C" fn on_usr1(_: libc::c_int) {
    let p = STOP.load(Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: `p` comes from `Arc::into_raw` in `stop_on_usr1` and is never released; an atomic store is
        // async-signal-safe.
        unsafe { (*p).store(true, Ordering::SeqCst) };
    }
}

/// Sets `flag` when the process receives SIGUSR1 (a rank under `mpirun`; see the module header).
pub fn stop_on_usr1(flag: &Arc<AtomicBool>) -> Result<()> {
    #[cfg(unix)]
    {
        let raw = Arc::into_raw(Arc::clone(flag)).cast_mut();
        let old = STOP.swap(raw, Ordering::SeqCst);
        if !old.is_null() {
            // SAFETY: `old` came from `Arc::into_raw` above in an earlier call; the handler now reads `raw`.
            // Leaking it instead would also be sound; releasing keeps repeated calls (tests) from growing.
            drop(unsafe { Arc::from_raw(old.cast_const()) });
        }
        // SAFETY: installs a handler that only performs an atomic store.
        let prev = unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
        if prev == libc::SIG_ERR {
            return Err(DistError::Io {
                what: "installing the SIGUSR1 handler".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = flag;
        Ok(())
    }
}

/// Sends SIGUSR1 (`stop`: the ranks save and end) or SIGTERM (`!stop`: `mpirun` aborts the job) to `pid`.
pub fn signal_launcher(pid: u32, stop: bool) -> Result<()> {
    #[cfg(unix)]
    {
        let sig = if stop { libc::SIGUSR1 } else { libc::SIGTERM };
        let pid = libc::pid_t::try_from(pid)
            .map_err(|_| DistError::Worker { rank: 0, reason: format!("process id {pid} out of range") })?;
        // SAFETY: sends a signal; no memory is shared.
        if unsafe { libc::kill(pid, sig) } != 0 {
            return Err(DistError::Io {
                what: format!("signalling process {pid}"),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        let _ = (pid, stop);
        Err(DistError::Worker { rank: 0, reason: "signals need a unix system".into() })
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn sigusr1_sets_the_flag() {
        let flag = Arc::new(AtomicBool::new(false));
        stop_on_usr1(&flag).unwrap();
        signal_launcher(std::process::id(), true).unwrap();
        let t = std::time::Instant::now();
        while !flag.load(Ordering::SeqCst) && t.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(flag.load(Ordering::SeqCst));
    }
}
