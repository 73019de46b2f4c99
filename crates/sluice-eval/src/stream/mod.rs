//! The validation loop without sync stalls: a [`StreamingValidator`] that the trainer feeds once per validation
//! batch and that runs the post-process (NMS) and the metric on a bounded pool of worker threads while the next
//! batch is inferred, then finalizes the metric once at [`StreamingValidator::finish`].
//!
//! Both stages come in through the `sluice-core` stage traits: a [`PostProcess`] with input [`PredBatch`] and a
//! [`MergeMetric`]. [`StreamingValidator::new`] uses Ultralytics' validation NMS ([`Nms`] with
//! [`StreamConfig::nms`]) and [`UltralyticsMetric`] (mAP50, mAP50-95, ...); [`StreamingValidator::with_stages`]
//! takes any other pair, e.g. exact per-class NMS and [`crate::CocoMetric`].
//!
//! What runs where:
//! - **Device (inference thread).** The eval forward, then `crate::shrink` (feature `candle`): per image only
//!   the anchors whose best class score is `> conf` (at most `top_k`), gathered in anchor order, plus per-image
//!   counts and a finiteness flag. Only this small buffer crosses to the host; nothing else is read back inside
//!   the inference loop and no device tensor is kept across batches.
//! - **Inference thread, host side.** [`StreamingValidator::buffer`] lends a [`ValBatch`] from a [`Pool`]; a
//!   batch's output is unpacked into it (or the caller fills it itself) together with the batch's sample ids and
//!   targets; [`StreamingValidator::submit`] puts it on a bounded `crossbeam` queue and returns at once unless
//!   `queue_depth` batches are already waiting (back-pressure: the only time the inference loop waits on
//!   post-processing, measured as [`StreamStats::submit_blocked`]). With the `candle` feature a validation
//!   batch's output on its device (`crate::ValOutput`: shrunk predictions, or the rows an NMS on the device kept)
//!   is packed into one tensor, read back (asynchronously off the CPU, in place on it) and handed to the one
//!   submit of outputs, `StreamingValidator::submit_output`, so the inference loop does not wait on the copy.
//! - **Worker threads** (`workers` of them). Each shares the post-process and owns its scratch
//!   ([`PostProcess::Scratch`]), its detection and ground-truth buffers and its own part of the metric; per batch
//!   it runs the post-process, then updates its metric once per image, and drops the batch, which returns the
//!   buffer to the pool.
//! - **`finish`** closes the queue, lets the workers drain it, joins them, merges their metrics
//!   ([`MergeMetric::merge`]) and finalizes the result once. The default metric sorts its records into a fixed
//!   order, so its report is identical for any number of workers and any order of submission.
//!
//! Detections back (for plots such as `val_batch0_pred.jpg`): with [`StreamConfig::keep_batches`] `= n`, the
//! worker that post-processes one of the first `n` submitted batches also keeps a copy of that batch's
//! post-process output in its own partial result (no lock, no channel back to the inference thread, nothing the
//! inference loop waits on), and `finish` returns them in [`StreamReport::kept`], in submission order. The memory
//! this costs is bounded by `n × batch × max_det` detections; `n = 0` (the default) keeps nothing.
//!
//! Bounded memory: at most `queue_depth` batches wait, `workers` are being processed and the pool holds
//! `queue_depth + workers + 2` buffers in all; buffers, scratches and detection vectors keep their allocations,
//! so in steady state nothing is allocated per batch for predictions or detections. What grows is what the
//! metric needs: for the default metric one `(confidence, class, tp bits)` record per kept detection and the GT
//! count per class (its per-image matching, `ApAccumulator::add_image`, makes a few small temporary vectors).
//!
//! Errors: a worker that fails (a NaN in a prediction, a class out of range) stores the error, which names the
//! sample id (or, for a post-process error that names no image, the batch), and stops every worker; the next
//! [`submit`](StreamingValidator::submit) or `finish` returns it. A worker panic is caught and reported the same
//! way. Dropping the validator (e.g. on an early exit of the training loop) cancels the workers, which stop after
//! their current batch, and joins them.
//!
//! Coordinates: predictions and ground truth must be in the same frame, e.g. the letterboxed input canvas. IoU
//! is invariant under the letterbox's uniform scale and shift, so matching there gives Ultralytics' numbers up to
//! float rounding, except that Ultralytics clips predicted boxes to the original image (`scale_boxes`), which a
//! canvas-space match does not do for boxes reaching into the padding.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError, select};
use sluice_core::{
    CancelSource, Detection, ImageLabels, Label, MergeMetric, Pool, Pooled, PostProcess, SampleId, Target,
};

use crate::error::{Error, Result};
use crate::metric::UltralyticsMetric;
use crate::nms::{Layout, Nms, NmsParams, PredBatch};
use crate::ultralytics::ApReport;

/// Settings of a [`StreamingValidator`].
#[derive(Debug, Clone, PartialEq)]
pub struct StreamConfig {
    /// Number of classes of the model (rows `4..4 + nc` of a prediction).
    pub num_classes: u32,
    /// NMS settings of the default post-process ([`StreamingValidator::new`]);
    /// [`NmsParams::ultralytics_val`] reproduces Ultralytics' validator. [`StreamingValidator::with_stages`]
    /// does not read them.
    pub nms: NmsParams,
    /// Post-process worker threads (at least 1).
    pub workers: usize,
    /// Batches that may wait in the queue before [`StreamingValidator::submit`] blocks (at least 1).
    pub queue_depth: usize,
    /// Keep the post-process output of the first `keep_batches` submitted batches and return them from
    /// [`StreamingValidator::finish`] in [`StreamReport::kept`] (0: keep none).
    pub keep_batches: usize,
}

impl StreamConfig {
    /// Ultralytics' validation NMS, 2 workers, a queue of 2 batches.
    pub fn new(num_classes: u32) -> Self {
        Self { num_classes, nms: NmsParams::ultralytics_val(), workers: 2, queue_depth: 2, keep_batches: 0 }
    }
}

/// One validation batch on the host: predictions plus what the worker needs to match them. Lent by
/// [`StreamingValidator::buffer`]; every vector keeps its allocation when the buffer returns to the pool.
#[derive(Debug, Clone, Default)]
pub struct ValBatch {
    /// The decoded eval output `(B, 4 + nc, A)` (or anchors-first): boxes `cx, cy, w, h` in canvas pixels, then
    /// class probabilities. After `crate::shrink`, `A` is the number of kept anchors.
    pub preds: PredBatch,
    /// Sample id of each image (`B` of them).
    pub ids: Vec<SampleId>,
    /// Ground truth of every image in the predictions' frame, image-major (`image` = index within the batch),
    /// like [`sluice_core::Batch::targets`]. The metric sees each image's targets as an [`ImageLabels`] whose
    /// `width` and `height` are 0 (the validator does not know the frame's size).
    pub targets: Vec<Target>,
    /// Optional (empty = none): for each image, for each anchor of `preds`, the anchor's index in the full head
    /// output (`B * A` values). Used to name the original anchor in errors.
    pub anchor_index: Vec<u32>,
    /// Optional (empty = unknown): for each image, how many anchors had a class score above `conf` on the
    /// device. More than the `A` kept means `top_k` truncated that image (counted in [`StreamStats`]).
    pub above_conf: Vec<u32>,
    /// Optional (empty = unknown): for each image, whether every value of its full head output was finite.
    pub all_finite: Vec<bool>,
    /// `preds` holds the rows an NMS on the device kept (`max_det` anchors-first rows `x1, y1, x2, y2, score,
    /// class` per image, `crate::masknms::unpack_kept`), not head outputs: its `num_classes` is 2 whatever the
    /// model's, and the post-process must be [`crate::ValPost::Kept`].
    pub kept_rows: bool,
    /// Position of the batch in submission order (set by [`StreamingValidator::submit`]).
    seq: u64,
}

impl ValBatch {
    /// Empties the batch, keeping every allocation.
    pub fn clear(&mut self) {
        self.preds.data.clear();
        self.preds.batch = 0;
        self.ids.clear();
        self.targets.clear();
        self.anchor_index.clear();
        self.above_conf.clear();
        self.all_finite.clear();
        self.kept_rows = false;
        self.seq = 0;
    }

    /// Sets the sample ids and the targets from per-image labels (boxes in the predictions' frame).
    pub fn set_labels(&mut self, ids: &[SampleId], labels: &[ImageLabels]) -> Result<()> {
        if ids.len() != labels.len() {
            return Err(Error::Invalid {
                what: "validation batch",
                reason: format!("{} sample ids for {} label sets", ids.len(), labels.len()),
            });
        }
        self.ids.clear();
        self.ids.extend_from_slice(ids);
        self.targets.clear();
        for (b, l) in labels.iter().enumerate() {
            let image = b as u32;
            self.targets.extend(l.objects.iter().map(|o| Target { image, class: o.class, bbox: o.bbox }));
        }
        Ok(())
    }

    /// Checks the shapes that do not need the data: ids, classes, optional per-image vectors, image-major targets.
    fn check(&self, num_classes: u32) -> Result<()> {
        let b = self.preds.batch;
        let p = &self.preds;
        let bad = |reason: String| Err(Error::Invalid { what: "validation batch", reason });
        if self.ids.len() != b {
            return bad(format!("{} sample ids for {b} images", self.ids.len()));
        }
        if self.kept_rows {
            if p.num_classes != 2 || p.layout != crate::Layout::AnchorsFirst {
                return bad(format!("kept NMS rows of 4 + {} values in {:?}", p.num_classes, p.layout));
            }
        } else if p.num_classes != num_classes as usize {
            return bad(format!("{} classes in the predictions, the validator has {num_classes}", p.num_classes));
        }
        if p.data.len() != b * (4 + p.num_classes) * p.num_anchors {
            return bad(format!(
                "{} prediction values for {b} images x (4 + {}) x {} anchors",
                p.data.len(),
                p.num_classes,
                p.num_anchors
            ));
        }
        if !self.anchor_index.is_empty() && self.anchor_index.len() != b * p.num_anchors {
            return bad(format!("{} anchor indices for {b} x {} anchors", self.anchor_index.len(), p.num_anchors));
        }
        for (name, len) in [("above_conf", self.above_conf.len()), ("all_finite", self.all_finite.len())] {
            if len != 0 && len != b {
                return bad(format!("{len} `{name}` values for {b} images"));
            }
        }
        if let Some(t) = self.targets.iter().find(|t| t.image as usize >= b) {
            return bad(format!("a target of image {} in a batch of {b}", t.image));
        }
        if !self.targets.is_sorted_by_key(|t| t.image) {
            return bad("targets are not image-major (sorted by image index)".into());
        }
        Ok(())
    }
}

/// Counts and times of one validation run; they say which stage bounds validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamStats {
    /// Images evaluated.
    pub images: u64,
    /// Batches evaluated.
    pub batches: u64,
    /// Detections the post-process kept.
    pub detections: u64,
    /// Images whose anchors above `conf` exceeded the shrink step's `top_k` (their post-process input was cut).
    pub truncated_images: u64,
    /// Worker threads.
    pub workers: usize,
    /// Time the workers spent post-processing, summed over workers.
    pub worker_busy: Duration,
    /// Time `submit` waited for room in the queue (inference waiting on post-processing).
    pub submit_blocked: Duration,
    /// Time `finish` waited for the workers to drain the queue.
    pub finish_wait: Duration,
    /// Time from [`StreamingValidator::new`] to the end of `finish`.
    pub wall: Duration,
}

impl StreamStats {
    /// Whether post-processing bounded validation: the inference loop waited for it (blocked in `submit`, plus
    /// the final drain in `finish`) more than 5% of the wall time. Otherwise inference was the bottleneck.
    pub fn post_process_bound(&self) -> bool {
        (self.submit_blocked + self.finish_wait).as_secs_f64() > 0.05 * self.wall.as_secs_f64()
    }

    /// One line for the training log.
    pub fn summary(&self) -> String {
        format!(
            "val post-process: {} images, {} detections, {} workers busy {:.3} s (sum), submit blocked {:.3} s, \
             final drain {:.3} s, wall {:.3} s -> bound by {}{}",
            self.images,
            self.detections,
            self.workers,
            self.worker_busy.as_secs_f64(),
            self.submit_blocked.as_secs_f64(),
            self.finish_wait.as_secs_f64(),
            self.wall.as_secs_f64(),
            if self.post_process_bound() { "post-process (add workers)" } else { "inference" },
            if self.truncated_images > 0 {
                format!(", {} images cut by top_k", self.truncated_images)
            } else {
                String::new()
            }
        )
    }
}

/// The detections of one batch kept for the caller (see [`StreamConfig::keep_batches`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeptBatch {
    /// 0-based position of the batch in submission order.
    pub batch: u64,
    /// Sample id of each image of the batch.
    pub ids: Vec<SampleId>,
    /// Post-process output of each image (in the predictions' frame), as the metric saw it.
    pub detections: Vec<Vec<Detection>>,
}

/// What [`StreamingValidator::finish`] returns; `R` is the metric's report.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamReport<R = ApReport> {
    /// The finalized metric; for the default metric P, R, mAP50, mAP50-95 per class and overall (`fitness()` on
    /// it).
    pub metrics: R,
    /// Counts and stage times.
    pub stats: StreamStats,
    /// The detections of the first [`StreamConfig::keep_batches`] submitted batches, in submission order.
    pub kept: Vec<KeptBatch>,
}

impl ValBatch {
    /// Ties an error of the post-process to this batch: an error at one image ([`Error::NonFinite`]) names its
    /// sample and, when known, the anchor's index in the full head output; any other names the batch.
    fn locate(&self, e: Error) -> Error {
        match e {
            Error::NonFinite { image, anchor, row, value } if image < self.ids.len() => {
                let na = self.preds.num_anchors;
                let anchor = self.anchor_index.get(image * na + anchor).map_or(anchor, |&a| a as usize);
                let source = Box::new(Error::NonFinite { image, anchor, row, value });
                Error::Sample { id: self.ids[image], source }
            }
            e => Error::Batch { batch: self.seq, source: Box::new(e) },
        }
    }
}

/// State shared by the validator and its workers.
#[derive(Debug)]
struct Shared {
    cancel: CancelSource,
    error: Mutex<Option<Error>>,
    /// Batches the workers have finished.
    processed: AtomicU64,
}

impl Shared {
    /// Records the first error and stops every worker.
    fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(e);
        }
        self.cancel.cancel();
    }

    fn take_error(&self) -> Option<Error> {
        self.error.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A worker's result.
#[derive(Debug)]
struct Partial<M> {
    metric: M,
    stats: StreamStats,
    kept: Vec<KeptBatch>,
}

/// One post-process worker: the shared post-process, its own scratch, reusable buffers and part of the metric.
struct Worker<P: PostProcess, M> {
    post: Arc<P>,
    scratch: P::Scratch,
    num_classes: u32,
    /// The post-process output of the current batch, one vector per image.
    dets: Vec<Vec<Detection>>,
    /// The ground truth of the current image.
    truth: ImageLabels,
    metric: M,
    stats: StreamStats,
    /// Batches with `seq` below this have their detections kept.
    keep_batches: u64,
    kept: Vec<KeptBatch>,
}

impl<P: PostProcess<Input = PredBatch>, M: MergeMetric> Worker<P, M> {
    fn process(&mut self, batch: &ValBatch) -> Result<()> {
        let in_sample = |id: SampleId, e: Error| Error::Sample { id, source: Box::new(e) };
        if let Some(b) = batch.all_finite.iter().position(|&finite| !finite) {
            return Err(in_sample(
                batch.ids[b],
                Error::Invalid {
                    what: "prediction",
                    reason: "a NaN or infinite value in the head output (found on the device before shrinking)".into(),
                },
            ));
        }
        self.post
            .process(&batch.preds, &mut self.scratch, &mut self.dets)
            .map_err(|e| batch.locate(Error::from_stage(e)))?;
        if self.dets.len() != batch.ids.len() {
            let reason = format!("{} detection lists for {} images", self.dets.len(), batch.ids.len());
            let source = Box::new(Error::Invalid { what: "post-process output", reason });
            return Err(Error::Batch { batch: batch.seq, source });
        }
        let na = batch.preds.num_anchors;
        self.stats.truncated_images += batch.above_conf.iter().filter(|&&n| n as usize > na).count() as u64;
        let mut t0 = 0;
        for (b, (&id, dets)) in batch.ids.iter().zip(&self.dets).enumerate() {
            // Targets are image-major: this image's are the run starting at t0.
            let t1 = t0 + batch.targets[t0..].iter().take_while(|t| t.image as usize == b).count();
            self.truth.objects.clear();
            for t in &batch.targets[t0..t1] {
                let bb = &t.bbox;
                if t.class >= self.num_classes || ![bb.x1, bb.y1, bb.x2, bb.y2].iter().all(|v| v.is_finite()) {
                    let reason = format!("class {} (of {}), box {bb:?}", t.class, self.num_classes);
                    return Err(in_sample(id, Error::Invalid { what: "ground truth", reason }));
                }
                self.truth.objects.push(Label { class: t.class, bbox: t.bbox });
            }
            t0 = t1;
            self.metric.update(id, dets, &self.truth).map_err(|e| in_sample(id, Error::from_stage(e)))?;
            self.stats.images += 1;
            self.stats.detections += dets.len() as u64;
        }
        self.stats.batches += 1;
        if batch.seq < self.keep_batches {
            self.kept.push(KeptBatch { batch: batch.seq, ids: batch.ids.clone(), detections: self.dets.clone() });
        }
        Ok(())
    }

    /// The worker thread: takes batches until the queue closes or the run is cancelled.
    fn run(mut self, rx: Receiver<Pooled<ValBatch>>, shared: Arc<Shared>) -> Partial<M> {
        let cancel = shared.cancel.token();
        loop {
            if cancel.is_cancelled() {
                break;
            }
            let batch = select! {
                recv(rx) -> m => match m {
                    Ok(b) => b,
                    Err(_) => break,
                },
                recv(cancel.receiver()) -> _ => break,
            };
            let start = Instant::now();
            let outcome = catch_unwind(AssertUnwindSafe(|| self.process(&batch)));
            self.stats.worker_busy += start.elapsed();
            // The buffer returns to the pool here.
            drop(batch);
            shared.processed.fetch_add(1, Ordering::Relaxed);
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    shared.fail(e);
                    break;
                }
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "non-string payload".into());
                    shared.fail(Error::Stream(format!("a worker panicked: {msg}")));
                    break;
                }
            }
        }
        Partial { metric: self.metric, stats: self.stats, kept: self.kept }
    }
}

/// Streaming validation: [`submit`](Self::submit) one batch at a time from the inference loop,
/// [`finish`](Self::finish) once. `P` is the post-process, shared by the workers; `M` the metric, one part per
/// worker. The defaults are Ultralytics' validation NMS and metrics ([`StreamingValidator::new`]); see the module
/// documentation for the design.
///
/// ```
/// use sluice_core::{BoxXyxy, Target};
/// use sluice_eval::{StreamConfig, StreamingValidator};
///
/// let mut v = StreamingValidator::new(StreamConfig { workers: 1, ..StreamConfig::new(2) })?;
/// let mut batch = v.buffer()?;
/// // One image, one anchor: a class-1 box at (10, 10)-(30, 30) with score 0.9.
/// batch.preds.data.extend_from_slice(&[20.0, 20.0, 20.0, 20.0, 0.05, 0.9]);
/// (batch.preds.batch, batch.preds.num_classes, batch.preds.num_anchors) = (1, 2, 1);
/// batch.ids.push(7);
/// batch.targets.push(Target { image: 0, class: 1, bbox: BoxXyxy::new(10.0, 10.0, 30.0, 30.0) });
/// v.submit(batch)?;
/// let report = v.finish()?;
/// assert_eq!((report.stats.images, report.stats.detections), (1, 2));
/// assert!(report.metrics.map50 > 0.99);
/// # Ok::<(), sluice_eval::Error>(())
/// ```
#[derive(Debug)]
pub struct StreamingValidator<P = Nms, M = UltralyticsMetric> {
    cfg: StreamConfig,
    tx: Option<Sender<Pooled<ValBatch>>>,
    pool: Pool<ValBatch>,
    shared: Arc<Shared>,
    post: Arc<P>,
    workers: Vec<JoinHandle<Partial<M>>>,
    /// Batches submitted so far.
    submitted: u64,
    submit_blocked: Duration,
    started: Instant,
    failed: bool,
}

impl StreamingValidator {
    /// The default stages: [`Nms`] with `cfg.nms` (Ultralytics' validation NMS from [`StreamConfig::new`]) and
    /// [`UltralyticsMetric`] over `cfg.num_classes` classes. Starts `cfg.workers` worker threads behind a queue
    /// of `cfg.queue_depth` batches.
    pub fn new(cfg: StreamConfig) -> Result<Self> {
        if !(cfg.nms.conf_thres.is_finite() && cfg.nms.iou_thres.is_finite()) {
            return Err(Error::Invalid { what: "NMS thresholds", reason: format!("{:?}", cfg.nms) });
        }
        let (nms, nc) = (Nms::new(cfg.nms), cfg.num_classes);
        Self::with_stages(cfg, nms, move || UltralyticsMetric::new(nc))
    }
}

impl<P, M> StreamingValidator<P, M>
where
    P: PostProcess<Input = PredBatch> + 'static,
    M: MergeMetric + 'static,
{
    /// A validator with the post-process `post` (shared by the workers, each with its own
    /// [`PostProcess::Scratch`]) and one metric per worker made by `metric` (each must start empty). Starts
    /// `cfg.workers` worker threads behind a queue of `cfg.queue_depth` batches; `cfg.nms` is not read.
    pub fn with_stages(cfg: StreamConfig, post: P, metric: impl Fn() -> M) -> Result<Self> {
        if cfg.workers == 0 || cfg.queue_depth == 0 || cfg.num_classes == 0 {
            return Err(Error::Invalid {
                what: "stream config",
                reason: format!(
                    "workers {}, queue_depth {}, num_classes {} (each must be >= 1)",
                    cfg.workers, cfg.queue_depth, cfg.num_classes
                ),
            });
        }
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue_depth);
        let shared =
            Arc::new(Shared { cancel: CancelSource::new(), error: Mutex::new(None), processed: AtomicU64::new(0) });
        let pool = Pool::new(cfg.queue_depth + cfg.workers + 2, ValBatch::default);
        let mut v = Self {
            tx: Some(tx),
            pool,
            shared,
            post: Arc::new(post),
            workers: Vec::with_capacity(cfg.workers),
            submitted: 0,
            submit_blocked: Duration::ZERO,
            started: Instant::now(),
            failed: false,
            cfg,
        };
        for i in 0..v.cfg.workers {
            let worker = Worker {
                post: Arc::clone(&v.post),
                scratch: P::Scratch::default(),
                num_classes: v.cfg.num_classes,
                dets: Vec::new(),
                truth: ImageLabels::default(),
                metric: metric(),
                stats: StreamStats::default(),
                keep_batches: v.cfg.keep_batches as u64,
                kept: Vec::new(),
            };
            let (rx, shared) = (rx.clone(), Arc::clone(&v.shared));
            let handle = std::thread::Builder::new()
                .name(format!("sluice-val-{i}"))
                .spawn(move || worker.run(rx, shared))
                .map_err(|e| Error::Stream(format!("cannot start worker {i}: {e}")))?;
            v.workers.push(handle);
        }
        Ok(v)
    }

    /// Waits for the workers to finish every submitted batch, joins them, merges their metrics and finalizes.
    pub fn finish(self) -> Result<StreamReport<M::Report>> {
        self.finish_with(Ok)
    }

    /// [`StreamingValidator::finish`] with `combine` applied to the merged metric before it is finalized: a
    /// data-parallel pass gathers every rank's part there, so the report covers the whole split.
    pub fn finish_with(mut self, combine: impl FnOnce(M) -> Result<M>) -> Result<StreamReport<M::Report>> {
        self.check_failed()?;
        let wait = Instant::now();
        // Closing the queue lets the workers drain it and exit.
        self.tx = None;
        let mut partials = Vec::with_capacity(self.workers.len());
        let mut panicked = false;
        for h in self.workers.drain(..) {
            match h.join() {
                Ok(p) => partials.push(p),
                Err(_) => panicked = true,
            }
        }
        let finish_wait = wait.elapsed();
        if let Some(e) = self.shared.take_error() {
            return Err(e);
        }
        if panicked {
            return Err(Error::Stream("a worker thread panicked".into()));
        }
        let mut stats = StreamStats {
            workers: self.cfg.workers,
            submit_blocked: self.submit_blocked,
            finish_wait,
            ..StreamStats::default()
        };
        let mut metric: Option<M> = None;
        let mut kept = Vec::new();
        for p in partials {
            kept.extend(p.kept);
            match metric.as_mut() {
                None => metric = Some(p.metric),
                Some(m) => m.merge(p.metric).map_err(Error::from_stage)?,
            }
            stats.images += p.stats.images;
            stats.batches += p.stats.batches;
            stats.detections += p.stats.detections;
            stats.truncated_images += p.stats.truncated_images;
            stats.worker_busy += p.stats.worker_busy;
        }
        let metric = metric.ok_or_else(|| Error::Stream("no worker returned its metric".into()))?;
        let mut metric = combine(metric)?;
        let metrics = metric.finalize().map_err(Error::from_stage)?;
        stats.wall = self.started.elapsed();
        kept.sort_unstable_by_key(|k: &KeptBatch| k.batch);
        Ok(StreamReport { metrics, stats, kept })
    }
}

impl<P, M> StreamingValidator<P, M> {
    /// The settings.
    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    /// The post-process the workers run.
    pub fn post_process(&self) -> &P {
        &self.post
    }

    /// An empty buffer from the pool (layout channels-first). Waits only when every buffer is in use, which
    /// cannot happen while the caller holds at most two at a time.
    pub fn buffer(&self) -> Result<Pooled<ValBatch>> {
        let mut b = self
            .pool
            .acquire(&self.shared.cancel.token())
            .map_err(|_| Error::Stream("stopped after a worker failed".into()))?;
        b.clear();
        b.preds.layout = Layout::ChannelsFirst;
        Ok(b)
    }

    /// Batches the workers have finished so far (for progress displays).
    pub fn processed_batches(&self) -> u64 {
        self.shared.processed.load(Ordering::Relaxed)
    }

    /// The buffer pool (e.g. to pre-fill buffers before the first batch). Its capacity is
    /// `queue_depth + workers + 2`.
    pub fn pool(&self) -> &Pool<ValBatch> {
        &self.pool
    }

    /// Hands a filled batch to the workers. Returns at once unless `queue_depth` batches are already waiting;
    /// returns the error of a worker that failed since the last call (naming the sample).
    pub fn submit(&mut self, mut batch: Pooled<ValBatch>) -> Result<()> {
        self.check_failed()?;
        batch.check(self.cfg.num_classes)?;
        batch.seq = self.submitted;
        self.submitted += 1;
        let Some(tx) = self.tx.as_ref() else {
            return Err(Error::Stream("already finished".into()));
        };
        let sent = match tx.try_send(batch) {
            Ok(()) => true,
            Err(TrySendError::Full(batch)) => {
                let start = Instant::now();
                let cancel = self.shared.cancel.token();
                let sent = select! {
                    send(tx, batch) -> r => r.is_ok(),
                    recv(cancel.receiver()) -> _ => false,
                };
                self.submit_blocked += start.elapsed();
                sent
            }
            Err(TrySendError::Disconnected(_)) => false,
        };
        if sent { Ok(()) } else { Err(self.stopped_error()) }
    }

    /// The stored worker error, once; afterwards a generic "stopped" error.
    fn check_failed(&mut self) -> Result<()> {
        if self.failed {
            return Err(Error::Stream("stopped after an earlier error".into()));
        }
        match self.shared.take_error() {
            Some(e) => {
                self.failed = true;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// The error to return when the queue refused a batch because the workers stopped.
    fn stopped_error(&mut self) -> Error {
        match self.check_failed() {
            Err(e) => e,
            Ok(()) => {
                self.failed = true;
                Error::Stream("the workers stopped (a worker thread panicked)".into())
            }
        }
    }
}

#[cfg(feature = "candle")]
impl<P, M> StreamingValidator<P, M> {
    /// Submits one validation batch from the host copy of its packed output (`host`, shaped `dims`:
    /// [`crate::ValOutput::pack`]) with the batch's sample ids and targets (image-major, in the predictions' frame,
    /// e.g. [`sluice_core::Batch`]'s `sample_ids` and `targets`). Blocks only when `queue_depth` batches are waiting.
    pub fn submit_output(
        &mut self,
        host: &[f32],
        dims: crate::Packed,
        ids: &[sluice_core::SampleId],
        targets: &[sluice_core::Target],
    ) -> Result<()> {
        let mut buf = self.buffer()?;
        match dims {
            crate::Packed::Shrunk(d) => crate::shrink::unpack(host, d, &mut buf)?,
            crate::Packed::Kept(d) => crate::masknms::unpack_kept(host, d, &mut buf)?,
        }
        buf.ids.extend_from_slice(ids);
        buf.targets.extend_from_slice(targets);
        self.submit(buf)
    }

    /// Submits one validation batch from its output where it lies ([`crate::ValOutput::copy_into`] the pooled
    /// buffer: no packing on the CPU), with the batch's sample ids and targets as for
    /// [`submit_output`](Self::submit_output). The validation loop on the CPU submits this way; a device loop
    /// reads packed outputs back asynchronously and submits those.
    pub fn submit_on_host(
        &mut self,
        out: &crate::ValOutput,
        ids: &[sluice_core::SampleId],
        targets: &[sluice_core::Target],
    ) -> Result<()> {
        let mut buf = self.buffer()?;
        out.copy_into(&mut buf)?;
        buf.ids.extend_from_slice(ids);
        buf.targets.extend_from_slice(targets);
        self.submit(buf)
    }
}

impl<P, M> Drop for StreamingValidator<P, M> {
    fn drop(&mut self) {
        // Stop after the current batch, drop whatever waits in the queue, and join every worker.
        self.shared.cancel.cancel();
        self.tx = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests;
