//! Starting ranks under Open MPI's `mpirun`: the CPU engine's ranks can only meet through an MPI launcher, so
//! `sluice train --nproc N` (and the MPI tests) start themselves through it.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::process::Command;

use crate::error::{DistError, Result};

/// Where the caller found `mpirun`: the launcher it names (the binary's `MPIRUN`), and the `PATH` to search
/// otherwise.
#[derive(Debug, Clone, Default)]
pub struct MpirunLookup {
    /// An explicit launcher; empty counts as unset.
    pub mpirun: Option<OsString>,
    /// The search path.
    pub path: Option<OsString>,
}

impl MpirunLookup {
    /// The lookup through `get` (the binary passes the process environment's `MPIRUN` and `PATH`).
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>) -> Self {
        Self { mpirun: get("MPIRUN"), path: get("PATH") }
    }
}

/// Finds `mpirun`: the launcher `lookup` names, else the first `mpirun` on its path.
pub fn find_mpirun(lookup: &MpirunLookup) -> Result<PathBuf> {
    if let Some(p) = lookup.mpirun.as_ref().filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let path = lookup.path.clone().unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join("mpirun")).find(|p| p.is_file()).ok_or_else(|| DistError::NotBuilt {
        what: "starting CPU ranks (mpirun is not on PATH)".into(),
        feature: "mpi",
        hint: "and an MPI launcher: Debian's openmpi-bin, or set MPIRUN",
    })
}

/// `mpirun -np N program args…`, with the flags a single machine needs, and ten seconds between SIGTERM and SIGKILL: more ranks than cores are allowed
/// (`--oversubscribe`), ranks are not pinned to cores (they run their own thread pools), shared-memory transport
/// without the kernel's cross-memory attach (refused inside most containers), and `--allow-run-as-root` when the
/// caller is root (CI).
pub fn mpirun_command(
    lookup: &MpirunLookup,
    np: usize,
    program: impl AsRef<OsStr>,
    args: &[impl AsRef<OsStr>],
) -> Result<Command> {
    let mut cmd = Command::new(find_mpirun(lookup)?);
    cmd.arg("-np").arg(np.to_string()).args(["--oversubscribe", "--bind-to", "none"]);
    cmd.args(["--mca", "btl_vader_single_copy_mechanism", "none"]);
    // When mpirun aborts the job it sends its ranks SIGTERM, then SIGKILL after this many seconds: time for them
    // to agree to stop at the next batch and for rank 0 to save `last` (a clean stop is SIGUSR1, see `signals`).
    cmd.args(["--mca", "odls_base_sigkill_timeout", "10"]);
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    cmd.arg(program).args(args);
    Ok(cmd)
}

fn is_root() -> bool {
    // `id -u` without a libc dependency: the owner of /proc/self is the effective user.
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }
    #[cfg(not(unix))]
    {
        false
    }
}
