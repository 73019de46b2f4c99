//! The heartbeat across real processes: two probe ranks meet, one is killed, and the other must end with an error
//! naming it well before a collective would have given up. The ranks are this test binary run again as the helper
//! [`probe`].

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

use sluice_dist::{DistError, Launch, Rendezvous, RendezvousConfig};

/// Starts a probe rank of two; its stdout lines arrive on the receiver.
fn probe(rank: usize, port: u16) -> (Child, Receiver<String>) {
    let mut child = sluice_testkit::helper::command("probe_rank")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("SLUICE_DIST_TIMEOUT_S", "10")
        .env("SLUICE_HEARTBEAT_S", "0.1")
        .env("SLUICE_LOST_AFTER_S", "2")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the probe");
    let stdout: ChildStdout = child.stdout.take().expect("the probe's stdout is piped");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// The next line of the probe's own output (the test harness's lines, such as `running 1 test`, skipped), which
/// must start with `prefix`.
fn expect_line(rx: &Receiver<String>, prefix: &str, who: &str) -> String {
    loop {
        let line =
            rx.recv_timeout(Duration::from_secs(15)).unwrap_or_else(|e| panic!("{who}: no {prefix:?} line: {e}"));
        if line.is_empty() || line.starts_with("running ") {
            continue;
        }
        assert!(line.starts_with(prefix), "{who}: {line:?}");
        return line;
    }
}

#[test]
fn a_killed_rank_ends_the_other_with_its_name() {
    let (mut r0, out0) = probe(0, 0);
    let listening = expect_line(&out0, "listening ", "rank 0");
    let port: u16 = listening.rsplit(':').next().unwrap().parse().unwrap();
    let (mut r1, out1) = probe(1, port);
    expect_line(&out1, "ready", "rank 1");
    expect_line(&out0, "ready", "rank 0");

    r1.kill().unwrap();
    r1.wait().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(status) = r0.try_wait().unwrap() {
            break status;
        }
        if t.elapsed() > Duration::from_secs(30) {
            r0.kill().unwrap();
            panic!("rank 0 did not notice the loss of rank 1 within 30 s");
        }
        thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    r0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("rank 1") && stderr.contains("is lost"), "{stderr}");
}

/// How long a probe lives at most, so that nothing waits on it forever.
const LIFETIME: Duration = Duration::from_secs(60);

/// A probe rank (started by [`probe`]): reads its place from the launcher's variables, joins the rendezvous, prints
/// `ready`, and checks on its peers every 100 ms. A lost peer ends it with the error on stderr and exit code 3; it
/// ends by itself (code 0) after [`LIFETIME`]. Rank 0 binds its listener first and prints `listening <addr>`, so
/// the test starts it on port 0 and passes the real port to the other rank.
#[test]
#[ignore = "a rank of `a_killed_rank_ends_the_other_with_its_name`, which starts it"]
fn probe_rank() {
    if !sluice_testkit::helper::is("probe_rank") {
        return;
    }
    let code = match run_probe() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("probe: {e}");
            3
        }
    };
    std::process::exit(code);
}

fn run_probe() -> Result<(), DistError> {
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
