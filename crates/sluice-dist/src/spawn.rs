//! The local launcher: starts one worker process per device on this machine with the variables torchrun would set,
//! waits for them, ends the others when one fails, and forwards the user's Ctrl-C to them.

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};

/// How often the launcher looks at its workers and at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// What to start.
#[derive(Debug, Clone)]
pub struct LocalLaunch {
    /// The worker program.
    pub program: PathBuf,
    /// Its arguments, the same for every rank.
    pub args: Vec<OsString>,
    /// How many workers (ranks) to start.
    pub nproc: usize,
    /// The rendezvous port; `None` picks a free one.
    pub port: Option<u16>,
    /// Extra variables per rank (such as the device to use); may be shorter than `nproc`, or empty.
    pub envs: Vec<Vec<(String, String)>>,
    /// How long the other workers have to exit after SIGTERM before they are killed.
    pub grace: Duration,
    /// Machines in the run, each starting `nproc` workers with the same settings (1: this one alone).
    pub nnodes: usize,
    /// This machine's place among them: its workers are ranks `node_rank · nproc ..`.
    pub node_rank: usize,
    /// Rank 0's host, where the ranks meet (the loopback on one machine).
    pub master_addr: String,
}

impl LocalLaunch {
    /// `nproc` copies of `program` without arguments, on a free port, with a 10 s grace period.
    pub fn new(program: impl Into<PathBuf>, nproc: usize) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            nproc,
            port: None,
            envs: Vec::new(),
            grace: Duration::from_secs(10),
            nnodes: 1,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
        }
    }
}

/// A port on the loopback that was free a moment ago (another process may still take it before the workers do).
pub fn free_port() -> Result<u16> {
    let io_err = |source| DistError::Io { what: "finding a free port on 127.0.0.1".into(), source };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io_err)?;
    Ok(listener.local_addr().map_err(io_err)?.port())
}

/// Starts the workers of `l`, each with `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
/// `MASTER_PORT` and its extra variables (on several machines, each machine's launcher starts its share of the ranks), stdin closed and stdout and stderr shared with this process,
/// and waits for all of them.
///
/// When a worker fails, the others get SIGTERM and, after `l.grace`, SIGKILL; the result names the first worker
/// that failed. Each time `stop` is found set it is cleared and the workers are asked to end, more firmly each
/// time: SIGINT first (they save a checkpoint and exit), then SIGTERM, then SIGKILL. The caller's Ctrl-C handler
/// just sets it.
///
/// On unix the workers run in their own process group, so that a Ctrl-C in the terminal reaches them only once,
/// through this function; on Linux they also get SIGTERM if the launcher dies.
pub fn run_local(l: &LocalLaunch, stop: &AtomicBool) -> Result<()> {
    if l.nproc == 0 {
        return Err(DistError::Invalid { what: "local launch".into(), reason: "nproc is 0: nothing to start".into() });
    }
    if l.envs.len() > l.nproc {
        return Err(DistError::Invalid {
            what: "local launch".into(),
            reason: format!("{} sets of variables for {} workers", l.envs.len(), l.nproc),
        });
    }
    if l.node_rank >= l.nnodes.max(1) {
        return Err(DistError::Invalid {
            what: "local launch".into(),
            reason: format!("node rank {} is not in 0..{} nodes", l.node_rank, l.nnodes),
        });
    }
    let port = match l.port {
        Some(p) => p,
        // Several machines must agree on the port: each gets it from the user (torchrun's default otherwise).
        None if l.nnodes > 1 => crate::DEFAULT_PORT,
        None => free_port()?,
    };
    let first = l.node_rank * l.nproc;
    let world = l.nnodes.max(1) * l.nproc;
    let mut workers = Workers(Vec::with_capacity(l.nproc));
    for local in 0..l.nproc {
        let rank = first + local;
        let mut cmd = Command::new(&l.program);
        cmd.args(&l.args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", l.nproc.to_string())
            .env("MASTER_ADDR", &l.master_addr)
            .env("MASTER_PORT", port.to_string())
            .envs(l.envs.get(local).into_iter().flatten().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        detach(&mut cmd);
        let child = cmd.spawn().map_err(|source| DistError::Io {
            what: format!("starting rank {rank}: {}", l.program.display()),
            source,
        })?;
        workers.0.push(Some(child));
    }

    let mut failure: Option<(usize, String)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut stops = 0;
    loop {
        let mut running = 0;
        for (local, slot) in workers.0.iter_mut().enumerate() {
            let rank = first + local;
            let Some(child) = slot else { continue };
            let status = child
                .try_wait()
                .map_err(|source| DistError::Io { what: format!("waiting for rank {rank}"), source })?;
            match status {
                None => running += 1,
                Some(status) => {
                    *slot = None;
                    if !status.success() && failure.is_none() {
                        failure = Some((rank, describe(status)));
                    }
                }
            }
        }
        if running == 0 {
            break;
        }
        if failure.is_some() && kill_at.is_none() {
            workers.signal(Signal::Term);
            kill_at = Some(Instant::now() + l.grace);
        }
        if stop.swap(false, Ordering::SeqCst) {
            stops += 1;
            match stops {
                1 => workers.signal(Signal::Int),
                2 => {
                    workers.signal(Signal::Term);
                    kill_at = Some(kill_at.map_or(Instant::now() + l.grace, |t| t.min(Instant::now() + l.grace)));
                }
                _ => kill_at = Some(Instant::now()),
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            workers.signal(Signal::Kill);
        }
        thread::sleep(POLL);
    }
    match failure {
        Some((rank, reason)) => Err(DistError::Worker { rank, reason }),
        None => Ok(()),
    }
}

/// How a worker ended, for messages.
fn describe(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    format!("ended with {status}")
}

#[derive(Debug, Clone, Copy)]
enum Signal {
    Int,
    Term,
    Kill,
}

/// The workers still running (`None` once reaped). Dropping it kills and reaps those left, so that an early
/// return leaves no orphans.
struct Workers(Vec<Option<Child>>);

impl Workers {
    fn signal(&mut self, sig: Signal) {
        for child in self.0.iter_mut().flatten() {
            // A worker that has just exited cannot be signalled; the next poll reaps it.
            let _ = send(child, sig);
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for child in self.0.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(unix)]
fn send(child: &mut Child, sig: Signal) -> std::io::Result<()> {
    let sig = match sig {
        Signal::Int => libc::SIGINT,
        Signal::Term => libc::SIGTERM,
        Signal::Kill => return child.kill(),
    };
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    // SAFETY: kill(2) touches no memory of this process. The child is not reaped yet (only `try_wait` reaps, and
    // reaped workers are dropped), so `pid` still names it and not a recycled process.
    if unsafe { libc::kill(pid, sig) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(not(unix))]
fn send(child: &mut Child, _sig: Signal) -> std::io::Result<()> {
    // Without signals the only way to end a worker is to kill it.
    child.kill()
}

/// Puts the worker in its own process group with SIGINT and SIGTERM at their default actions and, on Linux, asks
/// for SIGTERM when the launcher dies.
#[cfg(unix)]
fn detach(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // A terminal's Ctrl-C goes to the whole foreground group: the workers would get it twice, once from the
    // terminal and once forwarded, and a second SIGINT usually means "stop without saving".
    cmd.process_group(0);
    // A launcher started in the background of a non-interactive shell (`sluice train --nproc 2 &`, `nohup`, a CI
    // job) has SIGINT ignored, and an ignored signal stays ignored across exec: its workers would never see the stop
    // it forwards. They start with SIGINT and SIGTERM at their default actions; the launcher decides what reaches
    // them.
    // SAFETY: the closure runs between fork and exec and calls only signal(2), which is async-signal-safe, and
    // allocates nothing (an `io::Error` from errno holds no heap data).
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGTERM] {
                if libc::signal(sig, libc::SIG_DFL) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    #[cfg(target_os = "linux")]
    {
        let parent = libc::pid_t::try_from(std::process::id()).ok();
        // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions (prctl,
        // getppid) and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher may have died before the request took effect.
                if parent.is_some_and(|p| libc::getppid() != p) {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
}

#[cfg(not(unix))]
fn detach(_cmd: &mut Command) {}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;

    /// A fresh directory under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("sluice-spawn-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// `nproc` workers running the shell script `script`, with the directory `dir` as `$1`.
    fn sh(script: &str, nproc: usize, dir: &Path) -> LocalLaunch {
        LocalLaunch {
            args: vec!["-c".into(), script.into(), "sh".into(), dir.into()],
            grace: Duration::from_secs(2),
            ..LocalLaunch::new("/bin/sh", nproc)
        }
    }

    #[test]
    fn every_worker_gets_its_rank() {
        let dir = TempDir::new("ranks");
        let mut l = sh(
            r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $EXTRA" > "$1/rank$RANK""#,
            3,
            &dir.0,
        );
        l.port = Some(29123);
        l.envs = vec![vec![("EXTRA".into(), "x0".into())], vec![("EXTRA".into(), "x1".into())]];
        run_local(&l, &AtomicBool::new(false)).unwrap();
        for (rank, extra) in [(0, "x0"), (1, "x1"), (2, "")] {
            let got = std::fs::read_to_string(dir.0.join(format!("rank{rank}"))).unwrap();
            assert_eq!(got.trim_end(), format!("{rank} {rank} 3 3 127.0.0.1 29123 {extra}").trim_end());
        }
    }

    #[test]
    fn the_second_machine_starts_the_later_ranks() {
        let dir = TempDir::new("node1");
        let mut l = sh(
            r#"echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT" > "$1/rank$RANK""#,
            2,
            &dir.0,
        );
        (l.nnodes, l.node_rank, l.master_addr) = (3, 1, "node0".into());
        run_local(&l, &AtomicBool::new(false)).unwrap();
        for (rank, local) in [(2, 0), (3, 1)] {
            let got = std::fs::read_to_string(dir.0.join(format!("rank{rank}"))).unwrap();
            assert_eq!(got.trim_end(), format!("{rank} {local} 6 2 node0 29500"));
        }
        l.node_rank = 3;
        assert!(run_local(&l, &AtomicBool::new(false)).unwrap_err().to_string().contains("node rank 3"));
    }

    #[test]
    fn a_failing_worker_ends_the_others() {
        let dir = TempDir::new("fail");
        let l = sh(r#"if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 30"#, 2, &dir.0);
        let t = Instant::now();
        let e = run_local(&l, &AtomicBool::new(false)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        let DistError::Worker { rank, reason } = &e else { panic!("{e}") };
        assert_eq!((*rank, reason.as_str()), (1, "exited with code 3"));
    }

    #[test]
    fn a_worker_killed_by_a_signal_says_so() {
        let dir = TempDir::new("signal");
        let l = sh(r#"if [ "$RANK" = 0 ]; then kill -9 $$; fi; exec sleep 30"#, 2, &dir.0);
        let e = run_local(&l, &AtomicBool::new(false)).unwrap_err().to_string();
        assert_eq!(e, "rank 0: killed by signal 9");
    }

    /// Starts `nproc` workers of `script` on a thread, waits until each has written `$1/ready$RANK`, then sets the
    /// stop flag `times` times (waiting for the launcher to take it each time).
    fn stopped(script: &str, name: &str, times: usize) -> (Result<()>, Duration) {
        let dir = TempDir::new(name);
        let l = sh(script, 2, &dir.0);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let run = thread::spawn(move || run_local(&l, &s));
        let t = Instant::now();
        while !(0..2).all(|r| dir.0.join(format!("ready{r}")).exists()) {
            assert!(t.elapsed() < Duration::from_secs(5), "the workers did not start");
            thread::sleep(Duration::from_millis(10));
        }
        let t = Instant::now();
        for _ in 0..times {
            stop.store(true, Ordering::SeqCst);
            while stop.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(10));
            }
        }
        (run.join().unwrap(), t.elapsed())
    }

    #[test]
    fn stop_forwards_sigint() {
        // The workers end by SIGINT's default action, else after 30 s: no shell trap, whose timing against the
        // shell's own waits can make a signal arrive unseen. The signal that ended them must be SIGINT (2).
        let script = r#"touch "$1/ready$RANK"; exec sleep 30"#;
        let (result, took) = stopped(script, "int", 1);
        let e = result.unwrap_err().to_string();
        assert!(e.ends_with("killed by signal 2"), "{e}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn a_second_stop_sends_sigterm() {
        // The workers shrug SIGINT off; SIGTERM ends them.
        let script = r#"trap '' INT; touch "$1/ready$RANK"; exec sleep 30"#;
        let (result, took) = stopped(script, "term", 2);
        let e = result.unwrap_err().to_string();
        assert!(e.ends_with("killed by signal 15"), "{e}");
        assert!(took < Duration::from_secs(5), "{took:?}");
    }

    #[test]
    fn nothing_to_start_is_an_error() {
        let e = run_local(&LocalLaunch::new("/bin/true", 0), &AtomicBool::new(false)).unwrap_err().to_string();
        assert!(e.contains("nproc is 0"), "{e}");
        let e = run_local(&LocalLaunch::new("/nonexistent/worker", 1), &AtomicBool::new(false)).unwrap_err();
        assert!(e.to_string().contains("starting rank 0: /nonexistent/worker"), "{e}");
    }
}
