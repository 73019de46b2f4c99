//! A tiny rank for the heartbeat's process-death test (`tests/heartbeat.rs`): reads its place from the launcher's
//! variables, joins the rendezvous, prints `ready`, and checks on its peers every 100 ms. A lost peer ends it with
//! the error on stderr and exit code 3; it ends by itself (code 0) after 60 s so that nothing waits on it forever.
//!
//! Rank 0 binds its listener first and prints `listening <addr>`, so a test can start it on port 0 and pass the
//! real port to the other ranks.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use sluice_dist::{DistError, Launch, Rendezvous, RendezvousConfig};

const LIFETIME: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice-dist-probe: {e}");
            ExitCode::from(3)
        }
    }
}

fn run() -> Result<(), DistError> {
    let launch = Launch::from_vars(|k| std::env::var(k).ok())?;
    let addr = launch.master.clone().unwrap_or_else(|| "127.0.0.1:0".into());
    let listener = if launch.rank == 0 {
        let l = Rendezvous::bind(&addr)?;
        let local =
            l.local_addr().map_err(|source| DistError::Io { what: "reading the listener's address".into(), source })?;
        println!("listening {local}");
        Some((l, local.to_string()))
    } else {
        None
    };
    let addr = listener.as_ref().map_or(addr, |(_, a)| a.clone());
    let cfg = RendezvousConfig::new(addr, launch.rank, launch.world).with_vars(|k| std::env::var(k).ok())?;
    let (rdv, _) = Rendezvous::join(&cfg, listener.map(|(l, _)| l), b"probe")?;
    println!("ready");
    let start = Instant::now();
    while start.elapsed() < LIFETIME {
        rdv.check()?;
        thread::sleep(Duration::from_millis(100));
    }
    rdv.finish()
}
