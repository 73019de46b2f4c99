//! The heartbeat across real processes: two probe ranks meet, one is killed, and the other must end with an error
//! naming it well before a collective would have given up.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

/// Starts a probe rank of two; its stdout lines arrive on the receiver.
fn probe(rank: usize, port: u16) -> (Child, Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-dist-probe"))
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

fn expect_line(rx: &Receiver<String>, prefix: &str, who: &str) -> String {
    let line = rx.recv_timeout(Duration::from_secs(15)).unwrap_or_else(|e| panic!("{who}: no {prefix:?} line: {e}"));
    assert!(line.starts_with(prefix), "{who}: {line:?}");
    line
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
