//! Tests of the rendezvous and heartbeat: meeting, rejection of strangers, loss and stall detection, the wire format.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;

use super::*;

type Joined = thread::JoinHandle<Result<(Rendezvous, Vec<u8>)>>;

fn fast(addr: &str, rank: usize, world: usize) -> RendezvousConfig {
    RendezvousConfig {
        connect_timeout: Duration::from_secs(3),
        heartbeat: Duration::from_millis(50),
        lost_after: Duration::from_millis(400),
        ..RendezvousConfig::new(addr, rank, world)
    }
}

/// Starts ranks `ranks` of `world` on threads around a fresh listener; returns its address and the handles.
fn start(world: usize, ranks: std::ops::Range<usize>, payload: &[u8]) -> (String, Vec<Joined>) {
    let listener = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut listener = Some(listener);
    let handles = ranks
        .map(|rank| {
            let cfg = fast(&addr, rank, world);
            let l = if rank == 0 { listener.take() } else { None };
            let payload = payload.to_vec();
            thread::spawn(move || Rendezvous::join(&cfg, l, &payload))
        })
        .collect();
    (addr, handles)
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what} did not happen within {limit:?}");
        thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn three_ranks_share_the_payload_and_finish_cleanly() {
    let payload: Vec<u8> = (0..128).collect();
    let (_, handles) = start(3, 0..3, &payload);
    let joined: Vec<(Rendezvous, Vec<u8>)> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
    for (rank, (rdv, got)) in joined.iter().enumerate() {
        assert_eq!(got, &payload);
        assert_eq!((rdv.rank(), rdv.world()), (rank, 3));
        assert_eq!(rdv.peers().len(), 3);
        assert!(rdv.peers().iter().all(|p| p.contains(&format!("pid {}", std::process::id()))), "{:?}", rdv.peers());
        rdv.check().unwrap();
    }
    // A few heartbeats pass without a loss.
    thread::sleep(Duration::from_millis(200));
    let mut fired = Vec::new();
    for (rdv, _) in &joined {
        rdv.check().unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        rdv.on_lost(Box::new(move |_| f.store(true, Ordering::SeqCst)));
        fired.push(flag);
    }
    // Ranks finish at different times: goodbyes are not losses.
    let mut joined = joined;
    let (r1, _) = joined.remove(1);
    r1.finish().unwrap();
    thread::sleep(Duration::from_millis(100));
    for (rdv, _) in joined.into_iter().rev() {
        rdv.finish().unwrap();
    }
    assert!(fired.iter().all(|f| !f.load(Ordering::SeqCst)));
}

#[test]
fn one_rank_needs_nobody() {
    let cfg = fast("127.0.0.1:0", 0, 1);
    let (rdv, got) = Rendezvous::join(&cfg, None, b"id").unwrap();
    assert_eq!((got.as_slice(), rdv.peers().len()), (b"id".as_slice(), 1));
    rdv.finish().unwrap();
}

#[test]
fn a_world_size_mismatch_names_the_rank() {
    let (addr, mut handles) = start(3, 0..2, b"");
    // Gives rank 1 time to be in before rank 2 spoils the rendezvous.
    thread::sleep(Duration::from_millis(300));
    let cfg = fast(&addr, 2, 4);
    let e = Rendezvous::join(&cfg, None, b"").unwrap_err().to_string();
    assert!(e.contains("rank 2") && e.contains("world of 4"), "{e}");
    let e0 = handles.remove(0).join().unwrap().unwrap_err().to_string();
    assert!(e0.contains("rank 2: announced a world of 4 ranks, but rank 0 has 3"), "{e0}");
    // Rank 1 was already in: it hears the same reason.
    let e1 = handles.remove(0).join().unwrap().unwrap_err().to_string();
    assert!(e1.contains("rank 2") && e1.contains("world of 4"), "{e1}");
}

#[test]
fn rank_0_names_the_first_rank_that_did_not_connect() {
    let listener = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let cfg = RendezvousConfig { connect_timeout: Duration::from_millis(300), ..fast(&addr, 0, 3) };
    let c2 = fast(&addr, 2, 3);
    let r2 = thread::spawn(move || Rendezvous::join(&c2, None, b""));
    let t = Instant::now();
    let e = Rendezvous::join(&cfg, Some(listener), b"").unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(e.contains("rank 1") && e.contains(&addr) && e.contains("did not connect within 0.3 s"), "{e}");
    let e2 = r2.join().unwrap().unwrap_err().to_string();
    assert!(e2.contains("rank 1") && e2.contains("did not connect"), "{e2}");
}

#[test]
fn a_rank_names_rank_0_when_nobody_listens() {
    let closed = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let cfg = RendezvousConfig { connect_timeout: Duration::from_millis(300), ..fast(&addr, 1, 2) };
    let e = Rendezvous::join(&cfg, None, b"").unwrap_err().to_string();
    assert!(e.contains("rank 0") && e.contains(&addr) && e.contains("did not answer within 0.3 s"), "{e}");
    assert!(e.contains("connection refused"), "{e}");
}

/// Joins three ranks, registers loss counters, and kills rank `victim` without a goodbye.
fn kill_one(victim: usize) -> Vec<(Rendezvous, Arc<AtomicUsize>)> {
    let (_, handles) = start(3, 0..3, b"");
    let joined: Vec<Rendezvous> = handles.into_iter().map(|h| h.join().unwrap().unwrap().0).collect();
    let mut survivors: Vec<_> = joined
        .into_iter()
        .map(|rdv| {
            let count = Arc::new(AtomicUsize::new(0));
            let c = count.clone();
            rdv.on_lost(Box::new(move |e| {
                assert!(matches!(e, DistError::PeerLost { .. }), "{e}");
                c.fetch_add(1, Ordering::SeqCst);
            }));
            (rdv, count)
        })
        .collect();
    let (dead, dead_count) = survivors.remove(victim);
    let pid = dead.peers()[victim].clone();
    let t = Instant::now();
    // Dropped without `finish`: no goodbye, as if the process had died.
    drop(dead);
    for (rdv, count) in &survivors {
        wait_for("the loss", Duration::from_millis(400 + 500), || rdv.check().is_err());
        wait_for("the callback", Duration::from_millis(500), || count.load(Ordering::SeqCst) == 1);
        let e = rdv.check().unwrap_err();
        let DistError::PeerLost { rank, peer, reason } = &e else { panic!("{e}") };
        assert_eq!((*rank, peer.as_str(), reason.as_str()), (victim, pid.as_str(), CLOSED), "{e}");
        // The same error on every call.
        assert_eq!(rdv.check().unwrap_err().to_string(), e.to_string());
    }
    assert!(t.elapsed() < Duration::from_secs(2));
    assert_eq!(dead_count.load(Ordering::SeqCst), 0, "a rank does not report its own end");
    survivors
}

#[test]
fn a_killed_rank_is_reported_by_every_other_rank() {
    let survivors = kill_one(2);
    thread::sleep(Duration::from_millis(100));
    for (rdv, count) in survivors {
        assert!(rdv.finish().is_err(), "finish reports the loss");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_killed_rank_0_is_reported_by_the_others() {
    for (rdv, _) in kill_one(0) {
        let late = Arc::new(AtomicUsize::new(0));
        let l = late.clone();
        // Registered after the loss: runs at once.
        rdv.on_lost(Box::new(move |_| {
            l.fetch_add(1, Ordering::SeqCst);
        }));
        assert_eq!(late.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn a_silent_rank_is_reported_as_stalled() {
    let listener = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let cfg = RendezvousConfig { lost_after: Duration::from_millis(300), ..fast(&addr, 0, 2) };
    let r0 = thread::spawn(move || Rendezvous::join(&cfg, Some(listener), b"xyz"));
    // Rank 1 by hand: greets, reads the welcome, then says nothing (and reads nothing).
    let mut raw = TcpStream::connect(&addr).unwrap();
    let mut body = MAGIC.to_vec();
    put_u64(&mut body, 1);
    put_u64(&mut body, 2);
    put_bytes(&mut body, b"stub pid 1");
    raw.write_all(&frame(HELLO, &body)).unwrap();
    let (tag, _) = read_frame(&mut raw).unwrap();
    assert_eq!(tag, WELCOME);
    let (rdv, payload) = r0.join().unwrap().unwrap();
    assert_eq!(payload, b"xyz");
    rdv.check().unwrap();
    wait_for("the stall", Duration::from_millis(300 + 300), || rdv.check().is_err());
    let e = rdv.check().unwrap_err().to_string();
    assert!(e.contains("rank 1 (stub pid 1)") && e.contains("no heartbeat for 0.3 s"), "{e}");
    drop(raw);
}

#[test]
fn stray_connections_are_ignored() {
    let (addr, mut handles) = start(2, 0..1, b"p");
    // Something that is not a rank connects and sends garbage first.
    let mut stray = TcpStream::connect(&addr).unwrap();
    stray.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    drop(stray);
    let (r1, p) = Rendezvous::join(&fast(&addr, 1, 2), None, b"").unwrap();
    assert_eq!(p, b"p");
    let (r0, _) = handles.remove(0).join().unwrap().unwrap();
    r1.finish().unwrap();
    r0.finish().unwrap();
}

#[test]
fn settings_from_the_environment() {
    let read = |vars: &[(&str, &str)]| {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        RendezvousConfig::new("h:1", 0, 2).with_vars(|k| map.get(k).cloned())
    };
    let c =
        read(&[("SLUICE_DIST_TIMEOUT_S", "5"), ("SLUICE_HEARTBEAT_S", "0.25"), ("SLUICE_LOST_AFTER_S", "")]).unwrap();
    assert_eq!(c.connect_timeout, Duration::from_secs(5));
    assert_eq!(c.heartbeat, Duration::from_millis(250));
    assert_eq!(c.lost_after, Duration::from_secs(10));
    assert_eq!(c.stall_after, Duration::from_secs(1800));
    assert_eq!(read(&[("SLUICE_STALL_S", "90")]).unwrap().stall_after, Duration::from_secs(90));
    for bad in ["x", "-1", "0", "NaN", "inf"] {
        let e = read(&[("SLUICE_LOST_AFTER_S", bad)]).unwrap_err().to_string();
        assert!(e.contains("SLUICE_LOST_AFTER_S") && e.contains(bad), "{e}");
    }
    let slow = RendezvousConfig { heartbeat: Duration::from_secs(20), ..RendezvousConfig::new("h:1", 0, 2) };
    let e = Rendezvous::join(&slow, None, b"").unwrap_err().to_string();
    assert!(e.contains("heartbeat"), "{e}");
    let hasty = RendezvousConfig { stall_after: Duration::from_millis(500), ..RendezvousConfig::new("h:1", 0, 2) };
    let e = Rendezvous::join(&hasty, None, b"").unwrap_err().to_string();
    assert!(e.contains("stall timeout"), "{e}");
}

/// A rank whose process lives (its heartbeat goes on) but whose work stopped: the ranks that entered more
/// collectives wait for it; once no count has changed for `stall_after`, every rank reports it, by rank, host
/// and pid, with the counts. While the counts move, nothing is reported however long the run.
#[test]
fn a_rank_behind_the_others_is_reported_stalled() {
    let listener = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mut listener = Some(listener);
    let handles: Vec<Joined> = (0..3)
        .map(|rank| {
            let cfg = RendezvousConfig { stall_after: Duration::from_millis(600), ..fast(&addr, rank, 3) };
            let l = if rank == 0 { listener.take() } else { None };
            thread::spawn(move || Rendezvous::join(&cfg, l, b""))
        })
        .collect();
    let ranks: Vec<Rendezvous> = handles.into_iter().map(|h| h.join().unwrap().unwrap().0).collect();
    let progress: Vec<Progress> = ranks.iter().map(Rendezvous::progress).collect();
    // All ranks move on together for longer than the stall timeout: no report.
    for _ in 0..12 {
        progress.iter().for_each(Progress::enter);
        thread::sleep(Duration::from_millis(100));
        ranks.iter().for_each(|r| r.check().unwrap());
    }
    // Ranks 0 and 2 enter one more collective; rank 1 does not.
    progress[0].enter();
    progress[2].enter();
    let t = Instant::now();
    wait_for("the stall report", Duration::from_secs(5), || ranks.iter().all(|r| r.check().is_err()));
    assert!(t.elapsed() >= Duration::from_millis(500), "reported after {:?}", t.elapsed());
    for r in &ranks {
        let e = r.check().unwrap_err();
        let DistError::PeerLost { rank, peer, reason } = &e else { panic!("{e}") };
        assert_eq!(*rank, 1, "{e}");
        assert!(peer.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(reason.contains("stalled: it entered 12 collectives, another rank 13"), "{e}");
    }
}
