//! The training and validation loaders: the sampler's recipes executed on the pipeline runner.
//!
//! Each epoch is one pipeline: a source emitting batch numbers → a `decode` stage that draws the batch's recipes
//! (from the per-sample stream `(seed, epoch, position)`) and fetches every source image they need → an `augment`
//! stage that composes each sample straight into a pooled batch's slot → the consumer, in batch order. Workers only
//! execute recipes, so batches are byte-identical for any worker count. The decoded-image cache, the batch pool and
//! the job pool live in the loader and persist across epochs; only the threads are per epoch (starting them costs
//! microseconds, unlike PyTorch's worker processes).
//!
//! Multi-scale training (`multi_scale > 0`, Ultralytics' `multi_scale`): batch `k` of epoch `e` gets its side from
//! its own stream (`batch_rng(seed, e, k)`), a stride multiple around `imgsz`; the `decode` stage sets it on every
//! recipe of the batch and the `augment` stage renders each sample straight at that size (no resize pass). The
//! pooled batches are allocated for the largest size, so changing sizes allocates nothing.
//!
//! A sample whose image fails to read or decode is skipped and counted (the batch has one image fewer), with the
//! first messages kept for the report; with `strict` the epoch stops with that error instead.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use sluice_augment::recipe::{RecipeSampler, TrainRecipe, draw_multiscale, multiscale_bounds};
use sluice_augment::{Hyp, RectPlan, TrainAugment, ValLetterbox, ValRecipe};
use sluice_core::stage::SourceImage;
use sluice_core::{
    Augment, Batch, BatchShape, DistributedSampler, Error, ImageSource, Pipeline, PipelineIter, Pool, Pooled, Result,
    SampleId, batch_rng, sample_rng,
};

use crate::source::DecodedSource;

/// The model stride canvases are aligned to (validation rect batches, multi-scale sizes).
pub const STRIDE: u32 = 32;

/// Loader settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoaderConfig {
    /// Training / validation size (square canvas for training, long side for validation).
    pub imgsz: u32,
    /// Images per batch.
    pub batch: usize,
    /// Worker threads per stage.
    pub workers: usize,
    /// Finished batches that may wait for the consumer.
    pub prefetch: usize,
    /// Run seed.
    pub seed: u64,
    /// Stop on the first bad sample instead of skipping and counting it.
    pub strict: bool,
    /// Multi-scale range as a fraction of `imgsz` (Ultralytics' `multi_scale`, 0 = off): each training batch gets
    /// its own side, a multiple of [`STRIDE`] drawn by [`draw_multiscale`]. The validation loader ignores it.
    pub multi_scale: f64,
}

impl LoaderConfig {
    /// Defaults: workers ≈ 80% of the cores (at least 1), prefetch 2.
    pub fn new(imgsz: u32, batch: usize, seed: u64) -> Self {
        Self {
            imgsz,
            batch: batch.max(1),
            workers: default_workers(),
            prefetch: 2,
            seed,
            strict: false,
            multi_scale: 0.0,
        }
    }

    /// The smallest and largest training side: `imgsz` twice without multi-scale.
    pub fn train_sides(&self) -> (u32, u32) {
        if self.multi_scale > 0.0 {
            multiscale_bounds(self.imgsz, self.multi_scale, STRIDE)
        } else {
            (self.imgsz, self.imgsz)
        }
    }

    /// The side of training batch `batch` of `epoch`: a pure function of `(seed, epoch, batch)`, so it does not
    /// depend on worker count, rank or where an epoch was resumed.
    pub fn train_side(&self, epoch: u32, batch: u64) -> u32 {
        if self.multi_scale > 0.0 {
            draw_multiscale(self.imgsz, self.multi_scale, STRIDE, &mut batch_rng(self.seed, u64::from(epoch), batch))
        } else {
            self.imgsz
        }
    }

    fn max_in_flight(&self) -> usize {
        self.prefetch.max(1) + 2 * self.workers.max(1)
    }
}

/// About 80% of the available cores, at least one.
pub fn default_workers() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores * 4 / 5).max(1)
}

/// Samples skipped for bad input, with the first few messages.
#[derive(Debug, Default)]
struct Skips {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl Skips {
    const KEEP: usize = 10;

    fn record(&self, err: &Error) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(PoisonError::into_inner);
        if first.len() < Self::KEEP {
            first.push(err.to_string());
        }
    }

    fn snapshot(&self) -> (u64, Vec<String>) {
        (self.count.load(Ordering::Relaxed), self.first.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

/// What a loader skipped so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SkipReport {
    /// Samples skipped because their image could not be read or decoded.
    pub skipped: u64,
    /// The first messages, each naming the file.
    pub first: Vec<String>,
}

impl SkipReport {
    /// Both reports together: the counts added, the messages of `self` first.
    pub fn merged(&self, other: &SkipReport) -> SkipReport {
        let first = self.first.iter().chain(&other.first).cloned().collect();
        SkipReport { skipped: self.skipped + other.skipped, first }
    }

    /// One line for the console (`None` when nothing was skipped): how many samples `what` left out, and the first
    /// messages.
    pub fn line(&self, what: &str) -> Option<String> {
        (self.skipped > 0).then(|| {
            let more = self.skipped.saturating_sub(self.first.len() as u64);
            let tail = if more > 0 { format!("; and {more} more") } else { String::new() };
            format!("{what}: {} images skipped: {}{tail}", self.skipped, self.first.join("; "))
        })
    }
}

/// The images a batch needs, fetched by the `decode` stage and held until the `augment` stage is done.
#[derive(Debug, Default)]
struct Held {
    images: Vec<(SampleId, Arc<SourceImage>)>,
}

impl ImageSource for Held {
    fn get(&self, id: SampleId) -> Result<Arc<SourceImage>> {
        self.images.iter().find(|(i, _)| *i == id).map(|(_, img)| Arc::clone(img)).ok_or_else(|| Error::Invalid {
            what: "loader job",
            reason: format!("image {id} was not fetched for this batch"),
        })
    }
}

/// One batch's work between the two stages: its recipes and their images.
#[derive(Debug)]
struct Job<R> {
    index: u64,
    shape: BatchShape,
    recipes: Vec<(SampleId, R)>,
    failed: Vec<Error>,
    held: Held,
    ids: Vec<SampleId>,
    /// The source rows the batch's samples read, as the augmentation reports them (kept only over a mapped file).
    rows: Vec<(SampleId, Range<u32>)>,
}

impl<R> Job<R> {
    fn new(batch: usize) -> Self {
        Self {
            index: 0,
            shape: BatchShape::rgb(0, 0, 0),
            recipes: Vec::with_capacity(batch),
            failed: Vec::new(),
            held: Held::default(),
            ids: Vec::with_capacity(8),
            rows: Vec::new(),
        }
    }

    fn clear(&mut self, index: u64) {
        self.index = index;
        self.recipes.clear();
        self.failed.clear();
        self.held.images.clear();
    }
}

/// Fetches every image `ids` needs into `held`; the first failure is returned (naming the file).
fn fetch(source: &dyn ImageSource, ids: &[SampleId], held: &mut Held) -> Result<()> {
    for &id in ids {
        if held.images.iter().all(|(i, _)| *i != id) {
            held.images.push((id, source.get(id)?));
        }
    }
    Ok(())
}

/// Shared machinery of both loaders: pools, skips, source.
struct Core<R> {
    source: Arc<DecodedSource>,
    cfg: LoaderConfig,
    batches: Pool<Batch>,
    jobs: Pool<Job<R>>,
    skips: Arc<Skips>,
}

impl<R: Send + 'static> Core<R> {
    fn new(source: Arc<DecodedSource>, cfg: LoaderConfig, canvas: BatchShape) -> Self {
        // Pools cover every batch in flight, the reorder ring and two batches held by the consumer.
        let cap = cfg.max_in_flight() + 3;
        let batch = cfg.batch;
        Self {
            source,
            cfg,
            batches: Pool::new(cap, move || Batch::new(canvas, batch * 8)),
            jobs: Pool::new(cap, move || Job::new(batch)),
            skips: Arc::new(Skips::default()),
        }
    }

    /// Builds one epoch's pipeline. `plan(k, job)` fills batch `k`'s recipes and returns its canvas shape.
    fn run<A>(
        &self,
        batches: std::ops::Range<usize>,
        augment: A,
        ids_of: fn(&R, &mut Vec<SampleId>),
        plan: impl Fn(u64, &mut Job<R>) -> BatchShape + Send + Sync + 'static,
    ) -> PipelineIter<Pooled<Batch>>
    where
        A: Augment<Recipe = R> + Clone + 'static,
    {
        let (source, jobs, pool) = (Arc::clone(&self.source), self.jobs.clone(), self.batches.clone());
        let (skips, strict) = (Arc::clone(&self.skips), self.cfg.strict);
        // Only a mapped file reads lazily: with images in memory (or none cached) there is nothing to read ahead.
        let hint = self.source.node_cache().is_some().then(|| augment.clone());
        Pipeline::from_iter("sampler", batches.start as u64..batches.end as u64)
            .stage("decode", self.cfg.workers, move |k: u64, ctx| {
                let mut job = jobs.acquire(ctx.cancel())?;
                job.clear(k);
                job.shape = plan(k, &mut job);
                let Job { recipes, failed, held, ids, rows, .. } = &mut *job;
                recipes.retain(|(_, r)| {
                    ids.clear();
                    ids_of(r, ids);
                    match fetch(&*source, ids, held) {
                        Ok(()) => true,
                        Err(e) => {
                            failed.push(e);
                            false
                        }
                    }
                });
                // Over a mapped file, the batch's rows are all asked for at once (the reads run together), then
                // waited for here, so the augmentation finds them in memory and the wait counts as reading. A hint
                // that fails is dropped: `apply` meets the same error and reports it.
                if let Some(hint) = &hint {
                    rows.clear();
                    for (_, r) in recipes.iter() {
                        let _ = hint.source_rows(r, held, &mut |id, r| rows.push((id, r)));
                    }
                    for (id, r) in rows.iter() {
                        source.prefetch(*id, r.clone());
                    }
                    for (id, r) in rows.iter() {
                        source.fault_in(*id, r.clone());
                    }
                }
                Ok(job)
            })
            .stage("augment", self.cfg.workers, move |mut job: Pooled<Job<R>>, ctx| {
                for e in job.failed.drain(..) {
                    if strict {
                        return Err(e);
                    }
                    skips.record(&e);
                }
                let mut batch = pool.acquire(ctx.cancel())?;
                batch.reset(job.shape, job.index);
                for (_, recipe) in &job.recipes {
                    if let Err(e) = augment.apply(recipe, &job.held, &mut batch) {
                        if strict {
                            return Err(e);
                        }
                        skips.record(&e);
                    }
                }
                // Release the source images now: with `cache=none` they are the only copies.
                job.held.images.clear();
                ctx.add_bytes(batch.byte_size());
                Ok(batch)
            })
            .prefetch(self.cfg.prefetch)
            .max_in_flight(self.cfg.max_in_flight())
            .into_iter()
    }

    fn skips(&self) -> SkipReport {
        let (skipped, first) = self.skips.snapshot();
        SkipReport { skipped, first }
    }
}

/// The training loader: shuffled (per `(seed, epoch)`), mosaic until `close_mosaic`, square `imgsz` batches (or,
/// with `multi_scale`, square batches of a side drawn per batch).
pub struct TrainLoader {
    core: Core<TrainRecipe>,
    sampler: DistributedSampler,
    recipes: RecipeSampler,
    hyp: Hyp,
}

impl std::fmt::Debug for TrainLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainLoader").field("cfg", &self.core.cfg).field("len", &self.len()).finish_non_exhaustive()
    }
}

impl TrainLoader {
    /// A loader over every sample of `source` with augmentation `hyp`; `drop_last` as PyTorch's. Fails on a
    /// `multi_scale` outside `[0, 1]`.
    pub fn new(source: Arc<DecodedSource>, cfg: LoaderConfig, hyp: Hyp) -> Result<Self> {
        if !(0.0..=1.0).contains(&cfg.multi_scale) {
            return Err(Error::Invalid {
                what: "multi_scale",
                reason: format!("{} is not a fraction of imgsz in [0, 1]", cfg.multi_scale),
            });
        }
        let n = source.index().len();
        let recipes = RecipeSampler::new(hyp, n as u64).map_err(Error::other)?;
        let sampler = DistributedSampler::new(n, cfg.seed);
        // Pooled batches are sized for the largest side, so a smaller one reuses the buffer.
        let side = cfg.train_sides().1 as usize;
        let canvas = BatchShape::rgb(cfg.batch, side, side);
        Ok(Self { core: Core::new(source, cfg, canvas), sampler, recipes, hyp })
    }

    /// Shards the epochs for `rank` of `world_size` (PyTorch `DistributedSampler` semantics).
    pub fn shard(mut self, rank: usize, world_size: usize) -> Result<Self> {
        self.sampler = self.sampler.shard(rank, world_size)?;
        Ok(self)
    }

    /// Batches per epoch (the last one may be short).
    pub fn len(&self) -> usize {
        self.sampler.num_samples().div_ceil(self.core.cfg.batch)
    }

    /// The side of batch `batch` of `epoch` (`imgsz` without multi-scale).
    pub fn side(&self, epoch: u32, batch: usize) -> u32 {
        self.core.cfg.train_side(epoch, batch as u64)
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The decoded-image source (cache statistics).
    pub fn source(&self) -> &DecodedSource {
        &self.core.source
    }

    /// Samples skipped so far.
    pub fn skips(&self) -> SkipReport {
        self.core.skips()
    }

    /// The batches of `epoch` (0-based) out of `epochs`, in order.
    pub fn epoch(&self, epoch: u32, epochs: u32) -> PipelineIter<Pooled<Batch>> {
        self.epoch_from(epoch, epochs, 0)
    }

    /// The batches of `epoch` from batch `first` on (resuming an interrupted epoch): the same batches, byte for
    /// byte, that [`epoch`](Self::epoch) delivers at those positions.
    pub fn epoch_from(&self, epoch: u32, epochs: u32, first: usize) -> PipelineIter<Pooled<Batch>> {
        let order = Arc::new(self.sampler.epoch(u64::from(epoch)));
        let mosaic = self.hyp.mosaic_active(epoch, epochs);
        let (recipes, cfg) = (self.recipes, self.core.cfg);
        let ids_of: fn(&TrainRecipe, &mut Vec<SampleId>) = |r, ids| {
            ids.extend_from_slice(r.geometry.layout.ids());
            if let Some(m) = &r.mixup {
                ids.extend_from_slice(m.geometry.layout.ids());
            }
        };
        self.core.run(first.min(self.len())..self.len(), TrainAugment, ids_of, move |k, job| {
            let side = cfg.train_side(epoch, k);
            let start = k as usize * cfg.batch;
            let end = (start + cfg.batch).min(order.len());
            for pos in start..end {
                let (id, recipe) = draw_at(&recipes, &cfg, epoch, mosaic, &order, pos);
                job.recipes.push((id, recipe.with_size(side)));
            }
            BatchShape::rgb(cfg.batch, side as usize, side as usize)
        })
    }

    /// The samples of `epoch` (0-based, out of `epochs`) in batch order with their recipes, as
    /// [`epoch`](Self::epoch) draws them, without reading an image: which images meet in each mosaic, its centre,
    /// the perspective, mixup and flips (at `imgsz`; a multi-scale batch side is drawn apart).
    pub fn recipes(&self, epoch: u32, epochs: u32) -> Vec<(SampleId, TrainRecipe)> {
        let order = self.sampler.epoch(u64::from(epoch));
        let mosaic = self.hyp.mosaic_active(epoch, epochs);
        (0..order.len()).map(|pos| draw_at(&self.recipes, &self.core.cfg, epoch, mosaic, &order, pos)).collect()
    }
}

/// The sample at position `pos` of an epoch's `order` and its recipe, drawn from the position's own stream.
fn draw_at(
    recipes: &RecipeSampler,
    cfg: &LoaderConfig,
    epoch: u32,
    mosaic: bool,
    order: &[usize],
    pos: usize,
) -> (SampleId, TrainRecipe) {
    let id = order[pos] as SampleId;
    let mut rng = sample_rng(cfg.seed, u64::from(epoch), pos as u64);
    (id, recipes.draw(id, cfg.imgsz, mosaic, &mut rng))
}

/// The validation loader: every image once, in rect batches (sorted by aspect ratio, one padded canvas per batch,
/// Ultralytics' `pad = 0.5`, stride 32), letterboxed without augmentation.
pub struct ValLoader {
    core: Core<ValRecipe>,
    plan: Arc<RectPlan>,
    left_out: SkipReport,
    /// The plan's batches this loader's passes visit (all of them, or a rank's share).
    batches: std::ops::Range<usize>,
}

impl std::fmt::Debug for ValLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValLoader").field("cfg", &self.core.cfg).field("batches", &self.plan.len()).finish()
    }
}

impl ValLoader {
    /// Model stride the canvases are aligned to.
    pub const STRIDE: u32 = STRIDE;

    /// A loader over every sample of `source`.
    pub fn new(source: Arc<DecodedSource>, cfg: LoaderConfig) -> Self {
        let sizes: Vec<(u32, u32)> = source.index().samples.iter().map(|s| (s.labels.width, s.labels.height)).collect();
        let plan = Arc::new(RectPlan::new(&sizes, cfg.batch, cfg.imgsz, Self::STRIDE, 0.5));
        let max_side = plan.shapes.iter().map(|&(w, h)| w.max(h)).max().unwrap_or(cfg.imgsz) as usize;
        let canvas = BatchShape::rgb(cfg.batch, max_side, max_side);
        let batches = 0..plan.len();
        Self { core: Core::new(source, cfg, canvas), plan, left_out: SkipReport::default(), batches }
    }

    /// Records the split's images that indexing already left out ([`crate::split::LoadedSplit::left_out`]), so
    /// that every pass reports them with the ones it skips itself.
    pub fn with_left_out(mut self, left_out: SkipReport) -> Self {
        self.left_out = left_out;
        self
    }

    /// The split's images left out before the first pass (unreadable headers, invalid label files).
    pub fn left_out(&self) -> &SkipReport {
        &self.left_out
    }

    /// Visits only the plan's batches `range` (clamped to the plan): a data-parallel rank's share of the split.
    /// The batches keep the images and canvases they have in the whole plan, so every image is letterboxed and
    /// batched exactly as in a single-process pass.
    pub fn with_batches(mut self, range: std::ops::Range<usize>) -> Self {
        let n = self.plan.len();
        self.batches = range.start.min(n)..range.end.min(n);
        self
    }

    /// The rect plan (visiting order and canvas per batch).
    pub fn plan(&self) -> &RectPlan {
        &self.plan
    }

    /// Batches per pass.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    /// Whether there is nothing to validate.
    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Images per pass (the images of [`ValLoader::with_batches`]'s share).
    pub fn images(&self) -> usize {
        self.batches.clone().map(|k| self.plan.batch(k).len()).sum()
    }

    /// The decoded-image source (cache statistics).
    pub fn source(&self) -> &DecodedSource {
        &self.core.source
    }

    /// Samples skipped so far.
    pub fn skips(&self) -> SkipReport {
        self.core.skips()
    }

    /// One pass over the validation split, in rect-batch order.
    pub fn pass(&self) -> PipelineIter<Pooled<Batch>> {
        let (plan, cfg) = (Arc::clone(&self.plan), self.core.cfg);
        self.core.run(
            self.batches.clone(),
            ValLetterbox,
            |r, ids| ids.push(r.id),
            move |k, job| {
                let canvas = plan.shapes[k as usize];
                for &i in plan.batch(k as usize) {
                    let id = i as SampleId;
                    job.recipes.push((id, ValRecipe { id, imgsz: cfg.imgsz, canvas }));
                }
                BatchShape::rgb(cfg.batch, canvas.1 as usize, canvas.0 as usize)
            },
        )
    }
}
