//! The TCP rendezvous of the ranks and the heartbeat that follows it. The ranks form a star around rank 0: every
//! other rank connects to rank 0's listener, announces itself, and gets back rank 0's payload (for instance the NCCL
//! unique id) with the list of peers. The connections then stay open and carry pings both ways, so that a rank that
//! dies or stalls is noticed by every other rank instead of leaving them blocked in a collective forever.
//!
//! A process whose heartbeat thread still runs but whose work has stopped (a deadlocked loader, a hung kernel) is
//! found by the stall watchdog: each rank counts the collectives it has entered ([`Progress`]) and sends the count
//! with every ping; rank 0 keeps every rank's count and, when none has changed for `stall_after`, reports the
//! ranks behind the others (the rest are waiting for them inside a collective) as lost.
//!
//! Messages are framed as one tag byte, a `u32` little-endian length and that many bytes.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};

mod wire;
use wire::{
    BYE, Cursor, HELLO, LOST, MAGIC, PING, REJECT, WELCOME, frame, parse_hello, put_bytes, put_u64, read_frame,
    take_frame,
};

/// What [`Rendezvous::on_lost`] runs.
pub type LossCallback = Box<dyn FnOnce(&DistError) + Send>;

/// The other ranks' connections by rank.
type Links = Vec<(usize, TcpStream)>;

const CLOSED: &str = "connection closed: the process exited or was killed";

/// Where rank 0 listens and how patient the ranks are with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousConfig {
    /// Rank 0's listener, `host:port`.
    pub addr: String,
    /// This process's rank.
    pub rank: usize,
    /// The number of ranks.
    pub world: usize,
    /// How long the ranks wait for each other at the start.
    pub connect_timeout: Duration,
    /// The interval between pings.
    pub heartbeat: Duration,
    /// The silence after which a peer counts as stalled.
    pub lost_after: Duration,
    /// How long no rank may enter a new collective while some are behind the others before those are reported
    /// stalled (long: a rank may legitimately work alone for a while, writing a checkpoint or plots).
    pub stall_after: Duration,
}

impl RendezvousConfig {
    /// The defaults: 60 s to meet, a ping every second, a peer lost after 10 s of silence, a rank behind the others
    /// stalled after 30 minutes without progress.
    pub fn new(addr: impl Into<String>, rank: usize, world: usize) -> Self {
        Self {
            addr: addr.into(),
            rank,
            world,
            connect_timeout: Duration::from_secs(60),
            heartbeat: Duration::from_secs(1),
            lost_after: Duration::from_secs(10),
            stall_after: Duration::from_secs(1800),
        }
    }

    /// Applies `SLUICE_DIST_TIMEOUT_S` (the connect timeout), `SLUICE_HEARTBEAT_S`, `SLUICE_LOST_AFTER_S` and
    /// `SLUICE_STALL_S`, in seconds (fractions allowed), read through `get` (the binary passes the process
    /// environment, tests a map). An empty value counts as unset.
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let secs = |var: &str| -> Result<Option<Duration>> {
            let Some(v) = get(var).filter(|v| !v.trim().is_empty()) else { return Ok(None) };
            let bad =
                || DistError::Env { var: var.into(), reason: format!("{v:?} is not a positive number of seconds") };
            let s: f64 = v.trim().parse().map_err(|_| bad())?;
            if s.is_nan() || s <= 0.0 {
                return Err(bad());
            }
            Duration::try_from_secs_f64(s).map(Some).map_err(|_| bad())
        };
        if let Some(d) = secs("SLUICE_DIST_TIMEOUT_S")? {
            self.connect_timeout = d;
        }
        if let Some(d) = secs("SLUICE_HEARTBEAT_S")? {
            self.heartbeat = d;
        }
        if let Some(d) = secs("SLUICE_LOST_AFTER_S")? {
            self.lost_after = d;
        }
        if let Some(d) = secs("SLUICE_STALL_S")? {
            self.stall_after = d;
        }
        Ok(self)
    }

    fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(DistError::Invalid { what: "rendezvous".into(), reason });
        if self.world == 0 || self.rank >= self.world {
            return invalid(format!("rank {} is not in 0..{}", self.rank, self.world));
        }
        if self.heartbeat.is_zero() || self.lost_after <= self.heartbeat {
            return invalid(format!(
                "the heartbeat interval ({}) must be positive and shorter than the loss timeout ({})",
                secs(self.heartbeat),
                secs(self.lost_after)
            ));
        }
        if self.stall_after <= self.heartbeat {
            return invalid(format!(
                "the stall timeout ({}) must be longer than the heartbeat interval ({})",
                secs(self.stall_after),
                secs(self.heartbeat)
            ));
        }
        Ok(())
    }
}

/// This rank's count of collectives entered, for the stall watchdog: cloned into whatever calls the collectives,
/// which calls [`Progress::enter`] before each one.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<AtomicU64>);

impl Progress {
    /// Counts one more collective entered.
    pub fn enter(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// The collectives entered so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The ranks' connections after the rendezvous, watched by a heartbeat.
///
/// Dropping it without [`finish`](Self::finish) closes the connections without saying goodbye, so the other ranks
/// report this one as lost: that is what an error path wants, since they would otherwise wait for it in the next
/// collective.
pub struct Rendezvous {
    shared: Arc<Shared>,
    world: usize,
    heartbeat: Option<JoinHandle<()>>,
    watchers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.shared.rank)
            .field("world", &self.world)
            .field("addr", &self.shared.addr)
            .field("peers", &self.shared.peers)
            .finish_non_exhaustive()
    }
}

impl Rendezvous {
    /// Binds rank 0's listener ahead of [`join`](Self::join), so that its address (port 0 picks any free port) can
    /// reach the other ranks by another channel, such as an MPI broadcast.
    pub fn bind(host_port: &str) -> Result<TcpListener> {
        TcpListener::bind(host_port)
            .map_err(|source| DistError::Io { what: format!("binding the rendezvous listener on {host_port}"), source })
    }

    /// Meets the other ranks and returns rank 0's `payload` on every rank (other ranks' `payload` is ignored).
    ///
    /// Rank 0 listens on `cfg.addr`, or on `listener` when given (errors still name `cfg.addr`), and waits up to
    /// `cfg.connect_timeout` for the other `world - 1` ranks. Every other rank retries connecting to `cfg.addr`
    /// until its own `connect_timeout`, then waits up to as long again for rank 0 to welcome it, since rank 0
    /// answers only once every rank is in.
    pub fn join(cfg: &RendezvousConfig, listener: Option<TcpListener>, payload: &[u8]) -> Result<(Self, Vec<u8>)> {
        cfg.validate()?;
        let me = describe_self();
        let (conns, peers, payload) = if cfg.rank == 0 {
            let listener = match listener {
                Some(l) => l,
                None => Self::bind(&cfg.addr)?,
            };
            let (conns, peers) = host(cfg, &listener, &me, payload)?;
            (conns, peers, payload.to_vec())
        } else {
            let (stream, peers, payload) = connect(cfg, &me)?;
            (vec![(0, stream)], peers, payload)
        };
        let rdv = Self::start(cfg, conns, peers)?;
        Ok((rdv, payload))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Every rank's description (host and process id) as it announced itself, indexed by rank.
    pub fn peers(&self) -> &[String] {
        &self.shared.peers
    }

    /// This rank's collective counter (see [`Progress`]).
    pub fn progress(&self) -> Progress {
        self.shared.progress.clone()
    }

    /// `Ok` while every peer is alive; after a loss, the first one as [`DistError::PeerLost`] on every call. Cheap
    /// enough for every training step.
    pub fn check(&self) -> Result<()> {
        if !self.shared.lost_flag.load(Ordering::Acquire) {
            return Ok(());
        }
        match &self.shared.state().loss {
            Some(loss) => Err(self.shared.error(loss)),
            None => Ok(()),
        }
    }

    /// Runs `f` once, on the heartbeat thread that notices the first loss, with the error (or right away, here, if
    /// a peer is already lost). A later call replaces a callback that has not run yet.
    ///
    /// A rank blocked inside a collective never calls [`check`](Self::check) again, so the trainer uses this to
    /// report the loss and end the process.
    pub fn on_lost(&self, f: LossCallback) {
        let mut state = self.shared.state();
        match &state.loss {
            Some(loss) => {
                let err = self.shared.error(loss);
                drop(state);
                f(&err);
            }
            None => state.callback = Some(f),
        }
    }

    /// Ends the run in order: tells the peers goodbye, so that closing the connections is not a loss, closes them
    /// and stops the heartbeat threads. Returns the loss if one happened before the end.
    pub fn finish(mut self) -> Result<()> {
        self.stop(true)?;
        self.check()
    }

    fn start(cfg: &RendezvousConfig, conns: Vec<(usize, TcpStream)>, peers: Vec<String>) -> Result<Self> {
        // Reads wake up this often to notice silence; shutting the socket down wakes them at once.
        let tick = (cfg.lost_after / 4).clamp(Duration::from_millis(5), Duration::from_millis(250));
        let mut readers = Vec::with_capacity(conns.len());
        let mut writers = Vec::with_capacity(conns.len());
        for (rank, stream) in conns {
            let io_err = |source| DistError::Io { what: format!("configuring the connection to rank {rank}"), source };
            stream.set_nodelay(true).map_err(io_err)?;
            stream.set_read_timeout(Some(tick)).map_err(io_err)?;
            stream.set_write_timeout(Some(cfg.lost_after)).map_err(io_err)?;
            readers.push((rank, stream.try_clone().map_err(io_err)?));
            writers.push(Conn { stream, write: Mutex::new(()) });
        }
        let shared = Arc::new(Shared {
            rank: cfg.rank,
            addr: cfg.addr.clone(),
            peers,
            lost_after: cfg.lost_after,
            shutdown: AtomicBool::new(false),
            lost_flag: AtomicBool::new(false),
            state: Mutex::new(LossState { loss: None, callback: None }),
            conns: writers,
            progress: Progress::default(),
            stall_after: cfg.stall_after,
            counts: Mutex::new(vec![(0, Instant::now()); cfg.world]),
        });
        // Built before the threads so that a failed spawn stops those already running (through Drop).
        let mut rdv = Self { shared: shared.clone(), world: cfg.world, heartbeat: None, watchers: Vec::new() };
        if shared.conns.is_empty() {
            return Ok(rdv);
        }
        let spawn_err = |source| DistError::Io { what: "starting a heartbeat thread".into(), source };
        for (rank, stream) in readers {
            let shared = shared.clone();
            let handle = thread::Builder::new()
                .name(format!("sluice-watch-{rank}"))
                .spawn(move || watch(&shared, rank, stream))
                .map_err(spawn_err)?;
            rdv.watchers.push(handle);
        }
        let interval = cfg.heartbeat;
        let handle = thread::Builder::new()
            .name("sluice-ping".into())
            .spawn(move || ping(&shared, interval))
            .map_err(spawn_err)?;
        rdv.heartbeat = Some(handle);
        Ok(rdv)
    }

    /// Stops the threads and closes the connections, saying goodbye first when `bye`.
    fn stop(&mut self, bye: bool) -> Result<()> {
        self.shared.shutdown.store(true, Ordering::Release);
        for conn in &self.shared.conns {
            if bye {
                // Best effort: a peer that is already gone cannot be told.
                let _ = conn.send(BYE, &[]);
            }
            // Wakes this rank's reader of the connection and sends the peer an end of stream.
            let _ = conn.stream.shutdown(Shutdown::Both);
        }
        let mut panicked = false;
        let me = thread::current().id();
        let handles = self.heartbeat.take().into_iter().chain(self.watchers.drain(..));
        for handle in handles {
            handle.thread().unpark();
            // A loss callback that drops the rendezvous runs on a watcher thread, which cannot join itself.
            if handle.thread().id() != me {
                panicked |= handle.join().is_err();
            }
        }
        if panicked {
            return Err(DistError::Rendezvous {
                rank: self.shared.rank,
                addr: self.shared.addr.clone(),
                reason: "a heartbeat thread panicked".into(),
            });
        }
        Ok(())
    }
}

impl Drop for Rendezvous {
    fn drop(&mut self) {
        if !self.shared.shutdown.load(Ordering::Acquire) {
            let _ = self.stop(false);
        }
    }
}

/// What the heartbeat threads share with the handle.
struct Shared {
    rank: usize,
    addr: String,
    peers: Vec<String>,
    lost_after: Duration,
    /// Set by `stop`: from then on, closed connections are this rank's own doing, not losses.
    shutdown: AtomicBool,
    /// Set once `state.loss` is, so that `check` takes no lock while all is well.
    lost_flag: AtomicBool,
    state: Mutex<LossState>,
    conns: Vec<Conn>,
    /// This rank's collective counter, sent with every ping.
    progress: Progress,
    stall_after: Duration,
    /// On rank 0: every rank's last collective count and when it last changed.
    counts: Mutex<Vec<(u64, Instant)>>,
}

struct LossState {
    loss: Option<Loss>,
    callback: Option<LossCallback>,
}

struct Loss {
    rank: usize,
    reason: String,
}

/// The writing side of a connection; the lock keeps the frames of different threads from interleaving.
struct Conn {
    stream: TcpStream,
    write: Mutex<()>,
}

impl Conn {
    fn send(&self, tag: u8, body: &[u8]) -> io::Result<()> {
        let frame = frame(tag, body);
        let _guard = self.write.lock().unwrap_or_else(PoisonError::into_inner);
        (&self.stream).write_all(&frame)
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, LossState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records rank `rank`'s collective count (rank 0: from its pings, and its own).
    fn note_count(&self, rank: usize, count: u64) {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = counts.get_mut(rank)
            && slot.0 != count
        {
            *slot = (count, Instant::now());
        }
    }

    /// Rank 0's watchdog: when no rank's count has changed for `stall_after` and some are behind the others, the
    /// first of those is reported stalled (the others are waiting for it inside a collective).
    fn watch_stalls(&self) {
        self.note_count(self.rank, self.progress.count());
        let stalled = {
            let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            let newest = counts.iter().map(|c| c.1).max();
            let ahead = counts.iter().map(|c| c.0).max().unwrap_or(0);
            match newest {
                Some(t) if t.elapsed() >= self.stall_after => {
                    counts.iter().enumerate().find(|(_, c)| c.0 < ahead).map(|(rank, c)| (rank, c.0, ahead))
                }
                _ => None,
            }
        };
        if let Some((rank, count, ahead)) = stalled {
            let reason = format!(
                "stalled: it entered {count} collectives, another rank {ahead}, and no rank has moved on for {:.0} s \
                 (SLUICE_STALL_S)",
                self.stall_after.as_secs_f64()
            );
            self.lose(rank, reason);
        }
    }

    fn error(&self, loss: &Loss) -> DistError {
        DistError::PeerLost {
            rank: loss.rank,
            peer: self.peers.get(loss.rank).cloned().unwrap_or_else(|| "unknown".into()),
            reason: loss.reason.clone(),
        }
    }

    /// Records the first loss, tells the other ranks when this is the hub, and runs the callback.
    fn lose(&self, rank: usize, reason: String) {
        if self.shutdown.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.state();
        if state.loss.is_some() {
            return;
        }
        let loss = Loss { rank, reason };
        let err = self.error(&loss);
        let mut body = Vec::new();
        put_u64(&mut body, rank as u64);
        put_bytes(&mut body, loss.reason.as_bytes());
        state.loss = Some(loss);
        self.lost_flag.store(true, Ordering::Release);
        let callback = state.callback.take();
        drop(state);
        if self.rank == 0 {
            // The other ranks see only rank 0, which stays alive: they learn of the loss from it. The lost rank too,
            // when it is alive but stalled, so that it ends as well (to a dead one the write just fails).
            for conn in &self.conns {
                let _ = conn.send(LOST, &body);
            }
        }
        if let Some(f) = callback {
            f(&err);
        }
    }
}

/// The ping thread: one ping per connection every `interval`, until shutdown.
fn ping(shared: &Shared, interval: Duration) {
    let mut next = Instant::now();
    while !shared.shutdown.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= next {
            let count = shared.progress.count().to_le_bytes();
            for conn in &shared.conns {
                // A failed write means the peer is gone, which its reader reports.
                let _ = conn.send(PING, &count);
            }
            if shared.rank == 0 {
                shared.watch_stalls();
            }
            next = now + interval;
        }
        thread::park_timeout(next.saturating_duration_since(Instant::now()));
    }
}

/// The reader of one connection: notes pings, goodbyes and (from rank 0) other ranks' losses, and reports the peer
/// lost when the connection closes without a goodbye or stays silent for `lost_after`.
fn watch(shared: &Shared, peer: usize, mut stream: TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 512];
    let mut last = Instant::now();
    let mut said_bye = false;
    loop {
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                last = Instant::now();
                buf.extend_from_slice(&chunk[..n]);
                loop {
                    match take_frame(&mut buf) {
                        Ok(Some((BYE, _))) => said_bye = true,
                        Ok(Some((PING, body))) if shared.rank == 0 => {
                            if let Some(count) = Cursor(&body).u64() {
                                shared.note_count(peer, count);
                            }
                        }
                        Ok(Some((LOST, body))) if peer == 0 => {
                            let mut r = Cursor(&body);
                            if let (Some(rank), Some(reason)) = (r.u64(), r.string()) {
                                shared.lose(usize::try_from(rank).unwrap_or(usize::MAX), reason);
                            }
                        }
                        // Pings only prove the peer alive; unknown tags are ignored so that newer peers can add some.
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(reason) => {
                            if !said_bye {
                                shared.lose(peer, reason);
                            }
                            return;
                        }
                    }
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if !said_bye && last.elapsed() >= shared.lost_after {
                    let reason = format!(
                        "no heartbeat for {:.1} s: the process or its host stalled",
                        shared.lost_after.as_secs_f64()
                    );
                    shared.lose(peer, reason);
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A reset is a close too: the peer's kernel answers for a process that died.
            Err(_) => break,
        }
    }
    if !said_bye {
        shared.lose(peer, CLOSED.into());
    }
}

/// Rank 0's side of the handshake: the other ranks' connections by rank, and every rank's description.
fn host(cfg: &RendezvousConfig, listener: &TcpListener, me: &str, payload: &[u8]) -> Result<(Links, Vec<String>)> {
    let io_err = |source| DistError::Io { what: format!("accepting ranks on {}", cfg.addr), source };
    let deadline = Instant::now() + cfg.connect_timeout;
    let mut slots: Vec<Option<(TcpStream, String)>> = (0..cfg.world).map(|_| None).collect();
    let mut missing = cfg.world - 1;
    let fail = |slots: &[Option<(TcpStream, String)>], extra: Option<&TcpStream>, rank: usize, reason: String| {
        // Tells every rank already in why the rendezvous failed, so that their errors say the same.
        let mut body = Vec::new();
        put_u64(&mut body, rank as u64);
        put_bytes(&mut body, reason.as_bytes());
        for stream in slots.iter().flatten().map(|(s, _)| s).chain(extra) {
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = (&*stream).write_all(&frame(REJECT, &body));
        }
        DistError::Rendezvous { rank, addr: cfg.addr.clone(), reason }
    };
    listener.set_nonblocking(true).map_err(io_err)?;
    while missing > 0 {
        let now = Instant::now();
        if now >= deadline {
            let rank = slots.iter().skip(1).position(Option::is_none).map_or(1, |i| i + 1);
            let reason = format!("did not connect within {}", secs(cfg.connect_timeout));
            return Err(fail(&slots, None, rank, reason));
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(20).min(deadline - now));
                continue;
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => continue,
            Err(e) => return Err(io_err(e)),
        };
        // A connection that does not greet like a Sluice rank in time is a stray one: it is dropped.
        let hello_wait = (deadline - now).clamp(Duration::from_millis(1), Duration::from_secs(10));
        if stream.set_nonblocking(false).is_err() || stream.set_read_timeout(Some(hello_wait)).is_err() {
            continue;
        }
        let Ok((HELLO, body)) = read_frame(&mut &stream) else { continue };
        let Some((rank, world, desc)) = parse_hello(&body) else { continue };
        if world != cfg.world as u64 {
            let reason = format!("announced a world of {world} ranks, but rank 0 has {}", cfg.world);
            return Err(fail(&slots, Some(&stream), usize::try_from(rank).unwrap_or(usize::MAX), reason));
        }
        let rank = match usize::try_from(rank) {
            Ok(r) if (1..cfg.world).contains(&r) => r,
            _ => {
                let reason = format!("is outside 1..{} (announced by {desc})", cfg.world);
                return Err(fail(&slots, Some(&stream), usize::try_from(rank).unwrap_or(usize::MAX), reason));
            }
        };
        if let Some((_, first)) = &slots[rank] {
            let reason = format!("connected twice (as {first} and as {desc})");
            return Err(fail(&slots, Some(&stream), rank, reason));
        }
        slots[rank] = Some((stream, desc));
        missing -= 1;
    }
    let mut peers = vec![me.to_string()];
    let mut conns = Vec::with_capacity(cfg.world - 1);
    for (rank, (stream, desc)) in slots.into_iter().enumerate().filter_map(|(r, s)| Some((r, s?))) {
        peers.push(desc);
        conns.push((rank, stream));
    }
    let mut body = Vec::new();
    put_u64(&mut body, cfg.world as u64);
    put_bytes(&mut body, payload);
    for desc in &peers {
        put_bytes(&mut body, desc.as_bytes());
    }
    let welcome = frame(WELCOME, &body);
    for (rank, stream) in &conns {
        (&*stream)
            .write_all(&welcome)
            .map_err(|source| DistError::Io { what: format!("welcoming rank {rank}"), source })?;
    }
    Ok((conns, peers))
}

/// Another rank's side of the handshake: the connection to rank 0, every rank's description and the payload.
fn connect(cfg: &RendezvousConfig, me: &str) -> Result<(TcpStream, Vec<String>, Vec<u8>)> {
    let rank0 = |reason: String| DistError::Rendezvous { rank: 0, addr: cfg.addr.clone(), reason };
    let deadline = Instant::now() + cfg.connect_timeout;
    let stream = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match connect_once(&cfg.addr, left.clamp(Duration::from_millis(1), Duration::from_secs(2))) {
            Ok(stream) => break stream,
            Err(e) => e,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(rank0(format!("did not answer within {}: {}", secs(cfg.connect_timeout), short(&last))));
        }
        thread::sleep(left.min(Duration::from_millis(75)));
    };
    let mut body = MAGIC.to_vec();
    put_u64(&mut body, cfg.rank as u64);
    put_u64(&mut body, cfg.world as u64);
    put_bytes(&mut body, me.as_bytes());
    let (tag, body) = greet(&stream, &body, cfg.connect_timeout).map_err(|e| {
        rank0(format!(
            "accepted the connection but did not welcome this rank within {}: {}",
            secs(cfg.connect_timeout),
            short(&e)
        ))
    })?;
    let mut r = Cursor(&body);
    match tag {
        WELCOME => {
            let world = r.u64();
            let payload = r.bytes().map(<[u8]>::to_vec);
            let peers: Option<Vec<String>> = (0..cfg.world).map(|_| r.string()).collect();
            match (world, payload, peers) {
                (Some(w), Some(payload), Some(peers)) if w == cfg.world as u64 => Ok((stream, peers, payload)),
                _ => Err(rank0("sent a malformed welcome".into())),
            }
        }
        REJECT => match (r.u64(), r.string()) {
            (Some(rank), Some(reason)) => Err(DistError::Rendezvous {
                rank: usize::try_from(rank).unwrap_or(usize::MAX),
                addr: cfg.addr.clone(),
                reason: format!("{reason} (reported by rank 0 to rank {})", cfg.rank),
            }),
            _ => Err(rank0("sent a malformed rejection".into())),
        },
        other => Err(rank0(format!("answered with unexpected message {other}"))),
    }
}

/// Sends the Hello and reads rank 0's answer, waiting up to `wait` for it.
fn greet(stream: &TcpStream, hello: &[u8], wait: Duration) -> io::Result<(u8, Vec<u8>)> {
    stream.set_read_timeout(Some(wait))?;
    (&*stream).write_all(&frame(HELLO, hello))?;
    read_frame(&mut &*stream)
}

/// One connection attempt to every address `addr` resolves to; the last error if none answers.
fn connect_once(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolves to nothing");
    for sa in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&sa, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// An I/O error as a short phrase ("connection refused") where its kind says it all.
fn short(e: &io::Error) -> String {
    use io::ErrorKind::*;
    match e.kind() {
        ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut | WouldBlock | UnexpectedEof
        | HostUnreachable | NetworkUnreachable | AddrNotAvailable => e.kind().to_string(),
        _ => e.to_string(),
    }
}

/// A duration in seconds for messages: "60 s", "0.3 s".
fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// This process as the other ranks see it: "host pid N".
fn describe_self() -> String {
    format!("{} pid {}", host_name(), std::process::id())
}

#[cfg(unix)]
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the pointer and length describe `buf`, which outlives the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if rc == 0 && end > 0 { String::from_utf8_lossy(&buf[..end]).into_owned() } else { "unknown-host".into() }
}

#[cfg(not(unix))]
fn host_name() -> String {
    "unknown-host".into()
}

#[cfg(test)]
mod tests;
