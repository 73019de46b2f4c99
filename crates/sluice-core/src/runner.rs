//! The pipeline runner: a source and a chain of stages, each on its own worker threads, joined by bounded
//! `crossbeam-channel` queues.
//!
//! The contract follows datafusion's `ExecutionPlan`: no thread starts before the first pull; errors travel inside
//! the stream, tagged with the stage, the item's position and its sample id; dropping the consumer cancels every
//! producer and joins every thread. A ticket scheme bounds the items in flight (source to consumer, including the
//! reorder buffer), which gives back-pressure and lets ordered delivery use a fixed ring instead of a growing map:
//! after start-up nothing here allocates per item. Stage closures run under `catch_unwind`, so a panic on one
//! item becomes an error naming that item instead of a hang.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded, select};

use crate::error::{Error, Result};
use crate::labels::SampleId;
use crate::telemetry::{PipelineReport, StageCounters};

/// The owning side of a cancellation signal: [`CancelSource::cancel`] (or dropping it) fires every token.
#[derive(Debug)]
pub struct CancelSource {
    tx: Mutex<Option<Sender<()>>>,
    rx: Receiver<()>,
}

impl Default for CancelSource {
    fn default() -> Self {
        Self::new()
    }
}

impl CancelSource {
    /// A new, not yet fired, signal.
    pub fn new() -> Self {
        // Capacity 1, never sent to: a zero-capacity channel would heap-allocate a packet every time a blocking
        // `select!` registers on it, i.e. once per blocked hand-off.
        let (tx, rx) = bounded(1);
        Self { tx: Mutex::new(Some(tx)), rx }
    }

    /// A token that observes this signal.
    pub fn token(&self) -> CancelToken {
        CancelToken { rx: self.rx.clone() }
    }

    /// Fires the signal (idempotent).
    pub fn cancel(&self) {
        self.tx.lock().unwrap_or_else(PoisonError::into_inner).take();
    }
}

/// Observes a [`CancelSource`]. Blocking waits `select!` on [`CancelToken::receiver`], which becomes ready
/// (disconnected) when the source fires.
#[derive(Debug, Clone)]
pub struct CancelToken {
    rx: Receiver<()>,
}

impl CancelToken {
    /// Whether the signal has fired.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.rx.try_recv(), Err(crossbeam_channel::TryRecvError::Disconnected))
    }

    /// The channel to select on: it never delivers a value and disconnects on cancellation.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }
}

/// What a stage closure may ask about the item it is processing.
#[derive(Debug)]
pub struct StageCtx {
    seq: u64,
    id: SampleId,
    counters: Arc<StageCounters>,
    cancel: CancelToken,
}

impl StageCtx {
    /// Position of the item in the source's order.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Sample id of the item.
    pub fn id(&self) -> SampleId {
        self.id
    }

    /// Adds to the stage's byte counter (telemetry).
    pub fn add_bytes(&self, n: usize) {
        self.counters.bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// The pipeline's cancellation token, for cancellable waits inside the stage (e.g. [`crate::Pool::acquire`]).
    pub fn cancel(&self) -> &CancelToken {
        &self.cancel
    }
}

struct Envelope<T> {
    seq: u64,
    id: SampleId,
    item: Result<T>,
}

struct Launch {
    cancel: CancelToken,
    tickets: Receiver<()>,
    threads: Vec<JoinHandle<()>>,
    capacities: Vec<usize>,
}

impl Launch {
    fn spawn(&mut self, name: String, f: impl FnOnce() + Send + 'static) -> Result<()> {
        let handle = std::thread::Builder::new()
            .name(name.clone())
            .spawn(f)
            .map_err(|e| Error::Invalid { what: "pipeline thread", reason: format!("cannot spawn {name}: {e}") })?;
        self.threads.push(handle);
        Ok(())
    }
}

type LaunchFn<T> = Box<dyn FnOnce(&mut Launch) -> Result<Receiver<Envelope<T>>> + Send>;

struct StageInfo {
    name: &'static str,
    workers: usize,
    counters: Arc<StageCounters>,
}

/// A pipeline under construction whose items are of type `T`. Build it with [`Pipeline::from_iter`] or
/// [`Pipeline::from_keyed`], add stages, then iterate it.
pub struct Pipeline<T> {
    launch: LaunchFn<T>,
    stages: Vec<StageInfo>,
    capacities: Vec<usize>,
    ordered: bool,
    in_flight: Option<usize>,
}

impl<T> std::fmt::Debug for Pipeline<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<_> = self.stages.iter().map(|s| (s.name, s.workers)).collect();
        f.debug_struct("Pipeline").field("stages", &names).field("ordered", &self.ordered).finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Pipeline<T> {
    /// A pipeline fed by `items` on a source thread named `name`; each item's sample id is its position.
    pub fn from_iter<I>(name: &'static str, items: I) -> Self
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: Send + 'static,
    {
        Self::from_keyed(name, items.into_iter().enumerate().map(|(i, t)| (i as SampleId, t)))
    }

    /// A pipeline fed by `(sample id, item)` pairs on a source thread named `name`.
    pub fn from_keyed<I>(name: &'static str, items: I) -> Self
    where
        I: IntoIterator<Item = (SampleId, T)>,
        I::IntoIter: Send + 'static,
    {
        let counters = Arc::new(StageCounters::default());
        let source_counters = Arc::clone(&counters);
        let mut items = items.into_iter();
        let launch: LaunchFn<T> = Box::new(move |ctx: &mut Launch| {
            let (tx, rx) = bounded(ctx.capacities[0]);
            let cancel = ctx.cancel.clone();
            let tickets = ctx.tickets.clone();
            ctx.spawn(format!("sluice-{name}"), move || {
                source_loop(&mut items, &tx, &tickets, &cancel, &source_counters)
            })?;
            Ok(rx)
        });
        Self {
            launch,
            stages: vec![StageInfo { name, workers: 1, counters }],
            capacities: vec![2],
            ordered: true,
            in_flight: None,
        }
    }

    /// Adds a stage of `workers` threads applying `f` to every item.
    pub fn stage<U, F>(self, name: &'static str, workers: usize, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        F: Fn(T, &StageCtx) -> Result<U> + Send + Sync + 'static,
    {
        self.stage_with(name, workers, || (), move |_: &mut (), item, ctx| f(item, ctx))
    }

    /// Adds a stage of `workers` threads, each with its own state made by `init` (scratch buffers, a decoder
    /// instance), applying `f` to every item.
    pub fn stage_with<U, S, I, F>(mut self, name: &'static str, workers: usize, init: I, f: F) -> Pipeline<U>
    where
        U: Send + 'static,
        S: 'static,
        I: Fn() -> S + Send + Sync + 'static,
        F: Fn(&mut S, T, &StageCtx) -> Result<U> + Send + Sync + 'static,
    {
        let workers = workers.max(1);
        let index = self.stages.len();
        let counters = Arc::new(StageCounters::default());
        self.stages.push(StageInfo { name, workers, counters: Arc::clone(&counters) });
        self.capacities.push(2 * workers);
        let prev = self.launch;
        let shared = Arc::new((init, f));
        let launch: LaunchFn<U> = Box::new(move |ctx: &mut Launch| {
            let input = prev(ctx)?;
            let (tx, rx) = bounded(ctx.capacities[index]);
            for w in 0..workers {
                let (input, tx, cancel) = (input.clone(), tx.clone(), ctx.cancel.clone());
                let (shared, counters) = (Arc::clone(&shared), Arc::clone(&counters));
                ctx.spawn(format!("sluice-{name}-{w}"), move || {
                    let (init, f) = &*shared;
                    let mut state = init();
                    worker_loop(name, &input, &tx, cancel, counters, |item, sctx| f(&mut state, item, sctx));
                })?;
            }
            Ok(rx)
        });
        Pipeline {
            launch,
            stages: self.stages,
            capacities: self.capacities,
            ordered: self.ordered,
            in_flight: self.in_flight,
        }
    }

    /// Whether items reach the consumer in source order (default `true`). Unordered delivery hands out each item
    /// as soon as it is ready.
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// How many finished items may wait for the consumer (the last queue's capacity; default `2 × workers`).
    pub fn prefetch(mut self, depth: usize) -> Self {
        if let Some(last) = self.capacities.last_mut() {
            *last = depth.max(1);
        }
        self
    }

    /// The most items between the source and the consumer, reorder buffer included (default: every queue slot
    /// plus every worker, which never throttles an unordered pipeline). When stages draw their outputs from a
    /// [`crate::Pool`], the pool's capacity must be at least this plus the items the consumer holds at once:
    /// otherwise an ordered pipeline can wait for a buffer that sits in its own reorder ring.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.in_flight = Some(n.max(1));
        self
    }

    fn default_in_flight(&self) -> usize {
        self.capacities.iter().sum::<usize>() + self.stages.iter().map(|s| s.workers).sum::<usize>() + 1
    }
}

impl<T: Send + 'static> IntoIterator for Pipeline<T> {
    type Item = Result<T>;
    type IntoIter = PipelineIter<T>;

    fn into_iter(self) -> PipelineIter<T> {
        let in_flight = self.in_flight.unwrap_or_else(|| self.default_in_flight());
        PipelineIter {
            state: State::Pending(self.launch),
            stages: self.stages,
            capacities: self.capacities,
            ordered: self.ordered,
            in_flight,
            cancel: CancelSource::new(),
            threads: Vec::new(),
            started: None,
            ended: None,
            wait: Duration::ZERO,
            delivered: 0,
        }
    }
}

enum State<T> {
    Pending(LaunchFn<T>),
    Running { rx: Receiver<Envelope<T>>, tickets: Sender<()>, ring: Vec<Option<Envelope<T>>>, next: u64 },
    Done,
}

/// The consumer's side of a running pipeline: an iterator of `Result<T>`. After the first error it yields that
/// error, shuts everything down and ends. Dropping it cancels and joins every thread.
pub struct PipelineIter<T> {
    state: State<T>,
    stages: Vec<StageInfo>,
    capacities: Vec<usize>,
    ordered: bool,
    in_flight: usize,
    cancel: CancelSource,
    threads: Vec<JoinHandle<()>>,
    started: Option<Instant>,
    ended: Option<Instant>,
    wait: Duration,
    delivered: u64,
}

impl<T> std::fmt::Debug for PipelineIter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineIter").field("delivered", &self.delivered).finish_non_exhaustive()
    }
}

impl<T: Send + 'static> PipelineIter<T> {
    /// The telemetry so far (cheap: a snapshot of atomic counters).
    pub fn report(&self) -> PipelineReport {
        let stages = self.stages.iter().map(|s| s.counters.snapshot(s.name, s.workers)).collect();
        let wall = match self.started {
            Some(t0) => self.ended.unwrap_or_else(Instant::now).duration_since(t0).as_secs_f64(),
            None => 0.0,
        };
        PipelineReport::new(stages, self.delivered, wall, self.wait.as_secs_f64())
    }

    fn start(&mut self, launch: LaunchFn<T>) -> Result<()> {
        self.started = Some(Instant::now());
        let (tickets_tx, tickets_rx) = bounded(self.in_flight);
        for _ in 0..self.in_flight {
            // The channel has exactly `in_flight` slots.
            let _ = tickets_tx.try_send(());
        }
        let mut ctx = Launch {
            cancel: self.cancel.token(),
            tickets: tickets_rx,
            threads: Vec::new(),
            capacities: std::mem::take(&mut self.capacities),
        };
        let launched = launch(&mut ctx);
        self.threads = ctx.threads;
        let rx = launched?;
        let ring = if self.ordered { (0..self.in_flight).map(|_| None).collect() } else { Vec::new() };
        self.state = State::Running { rx, tickets: tickets_tx, ring, next: 0 };
        Ok(())
    }

    /// Cancels every stage and joins every thread (idempotent).
    fn shutdown(&mut self) {
        self.cancel.cancel();
        self.state = State::Done;
        for handle in self.threads.drain(..) {
            // Stage code runs under catch_unwind; a panic here would be a runner bug, and joining is all we can do.
            let _ = handle.join();
        }
        self.ended.get_or_insert_with(Instant::now);
    }

    fn receive(&mut self) -> Option<Envelope<T>> {
        let State::Running { rx, .. } = &self.state else { return None };
        let t0 = Instant::now();
        let got = rx.recv().ok();
        self.wait += t0.elapsed();
        got
    }
}

impl<T: Send + 'static> Iterator for PipelineIter<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        if let State::Pending(_) = self.state {
            let State::Pending(launch) = std::mem::replace(&mut self.state, State::Done) else { return None };
            if let Err(e) = self.start(launch) {
                self.shutdown();
                return Some(Err(e));
            }
        }
        loop {
            let State::Running { ring, next, .. } = &mut self.state else { return None };
            let ready = if self.ordered {
                let slot = (*next % ring.len() as u64) as usize;
                ring[slot].take()
            } else {
                None
            };
            let env = match ready {
                Some(env) => env,
                None => match self.receive() {
                    Some(env) if self.ordered => {
                        let State::Running { ring, .. } = &mut self.state else { return None };
                        let slot = (env.seq % ring.len() as u64) as usize;
                        ring[slot] = Some(env);
                        continue;
                    }
                    Some(env) => env,
                    None => {
                        // Every producer ended. In ordered mode a missing item would be a runner bug: say so.
                        let lost = match &self.state {
                            State::Running { ring, next, .. } if ring.iter().any(Option::is_some) => Some(*next),
                            _ => None,
                        };
                        self.shutdown();
                        return lost.map(|seq| {
                            Err(Error::Invalid { what: "pipeline", reason: format!("item #{seq} was lost") })
                        });
                    }
                },
            };
            if let State::Running { tickets, next, .. } = &mut self.state {
                *next = env.seq + 1;
                // Returning the ticket lets the source emit one more item; the channel always has room for it.
                let _ = tickets.try_send(());
            }
            return match env.item {
                Ok(item) => {
                    self.delivered += 1;
                    Some(Ok(item))
                }
                Err(e) => {
                    self.shutdown();
                    Some(Err(e))
                }
            };
        }
    }
}

impl<T> Drop for PipelineIter<T> {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.state = State::Done;
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}

fn source_loop<T>(
    items: &mut impl Iterator<Item = (SampleId, T)>,
    tx: &Sender<Envelope<T>>,
    tickets: &Receiver<()>,
    cancel: &CancelToken,
    counters: &StageCounters,
) {
    let mut seq = 0u64;
    loop {
        let t0 = Instant::now();
        select! {
            recv(tickets) -> t => if t.is_err() { return },
            recv(cancel.receiver()) -> _ => return,
        }
        let t1 = Instant::now();
        let Some((id, item)) = items.next() else { return };
        let t2 = Instant::now();
        select! {
            send(tx, Envelope { seq, id, item: Ok(item) }) -> r => if r.is_err() { return },
            recv(cancel.receiver()) -> _ => return,
        }
        StageCounters::add(&counters.wait_out_ns, t1 - t0 + t2.elapsed());
        StageCounters::add(&counters.busy_ns, t2 - t1);
        counters.items.fetch_add(1, Ordering::Relaxed);
        seq += 1;
    }
}

fn worker_loop<T, U>(
    stage: &'static str,
    input: &Receiver<Envelope<T>>,
    output: &Sender<Envelope<U>>,
    cancel: CancelToken,
    counters: Arc<StageCounters>,
    mut f: impl FnMut(T, &StageCtx) -> Result<U>,
) {
    let mut ctx = StageCtx { seq: 0, id: 0, counters, cancel };
    loop {
        let t0 = Instant::now();
        let env = select! {
            recv(input) -> m => match m { Ok(env) => env, Err(_) => return },
            recv(ctx.cancel.receiver()) -> _ => return,
        };
        let t1 = Instant::now();
        let Envelope { seq, id, item } = env;
        let item = match item {
            Ok(item) => {
                ctx.seq = seq;
                ctx.id = id;
                let out = match catch_unwind(AssertUnwindSafe(|| f(item, &ctx))) {
                    Ok(Ok(out)) => Ok(out),
                    Ok(Err(e)) => Err(Error::Stage { stage, seq, id, source: Box::new(e) }),
                    Err(panic) => Err(Error::Panic { stage, seq, id, message: panic_message(panic.as_ref()) }),
                };
                ctx.counters.items.fetch_add(1, Ordering::Relaxed);
                out
            }
            // An upstream error passes through untouched.
            Err(e) => Err(e),
        };
        let t2 = Instant::now();
        select! {
            send(output, Envelope { seq, id, item }) -> r => if r.is_err() { return },
            recv(ctx.cancel.receiver()) -> _ => return,
        }
        StageCounters::add(&ctx.counters.wait_in_ns, t1 - t0);
        StageCounters::add(&ctx.counters.busy_ns, t2 - t1);
        StageCounters::add(&ctx.counters.wait_out_ns, t2.elapsed());
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
