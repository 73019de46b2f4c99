//! `sluice bench loader`: the real training loader (Ultralytics' default augmentation, mosaic on in every epoch)
//! or validation loader (rect batches) over a dataset split, `epochs` epochs back to back with a consumer that
//! only touches each batch, as Ultralytics' loader benchmarks do (`$PEERS_DIR/m1_train_loader.py`,
//! `m2_val_loader.py`).
//!
//! The first epoch is *cold*: the loader, its pools and its (empty) decoded-image cache are fresh, so every
//! image is read and decoded, and its time includes starting the stage threads. Later epochs are *warm*: with
//! `--cache ram` they only compose batches from the cache; with `--cache none` they read and decode again. With
//! `--cache disk` the split's cache file is opened (or built, timed apart) before the first epoch, so every epoch
//! composes batches from the mapped file: run it twice to measure a file already in the page cache.
//! Figures: images/s of the cold epoch, of the first two epochs together (the definition of Ultralytics' cold
//! figure: a fresh loader, two epochs, worker start-up included), and the median, min and max over the warm
//! epochs, plus the trainer's per-stage telemetry of the cold and the last warm epoch (busy share of read,
//! decode and augment, and the named bottleneck).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use sluice_augment::Hyp;
use sluice_core::{Batch, PipelineIter, Pooled};
use sluice_dataset::{IndexOptions, Split};

use super::{BenchError, Result, Spread, rate, touch};
use crate::split::load_split;
use crate::telemetry::{EpochShares, LoopTimes};
use crate::{CacheFile, CacheMode, DecodedSource, LoaderConfig, SourceStats, TrainLoader, ValLoader, disk_cache_path};

/// The consumer reads one byte per page of every batch: the pixels are really there, and the consumer stays as
/// cheap as Ultralytics' benchmark loop (which looks only at the batch's shape).
const TOUCH_STRIDE: usize = 4096;

/// Which loader to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LoaderMode {
    /// [`TrainLoader`] on the train split: shuffled, mosaic + random perspective + HSV + flip, square batches.
    Train,
    /// [`ValLoader`] on the val split: every image once, letterboxed into rect batches.
    Val,
}

impl LoaderMode {
    /// `train` or `val`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Val => "val",
        }
    }

    /// The split this mode reads.
    pub fn split(self) -> Split {
        match self {
            Self::Train => Split::Train,
            Self::Val => Split::Val,
        }
    }
}

impl std::str::FromStr for LoaderMode {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "train" => Ok(Self::Train),
            "val" => Ok(Self::Val),
            other => Err(BenchError::Invalid { what: "mode", reason: format!("'{other}' (train or val)") }),
        }
    }
}

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct LoaderBenchOptions {
    /// The dataset YAML.
    pub data: PathBuf,
    /// Training or validation loader.
    pub mode: LoaderMode,
    /// Training size (validation: the long side before rect padding).
    pub imgsz: u32,
    /// Images per batch.
    pub batch: usize,
    /// Worker threads per loader stage.
    pub workers: usize,
    /// Epochs to run (at least 2: the first is the cold one).
    pub epochs: u32,
    /// Decoded-image cache.
    pub cache: CacheMode,
    /// The folder of `cache: disk`'s file (default: beside the split's label cache).
    pub cache_dir: Option<PathBuf>,
    /// Run seed (order and augmentation).
    pub seed: u64,
}

/// The `cache: disk` file of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskCacheFigures {
    /// The file.
    pub path: PathBuf,
    /// Whether an existing file was reused (else it was built now).
    pub reused: bool,
    /// Seconds to open or build it.
    pub seconds: f64,
}

/// One epoch's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochFigures {
    /// 1-based epoch.
    pub epoch: u32,
    /// Images delivered.
    pub images: u64,
    /// Batches delivered.
    pub batches: u64,
    /// Wall seconds from asking for the first batch to receiving the last.
    pub seconds: f64,
    /// `images / seconds`.
    pub images_per_s: f64,
}

/// The result of [`run`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoaderBenchReport {
    /// `train` or `val`.
    pub mode: LoaderMode,
    /// `ram` or `none`.
    pub cache: CacheMode,
    /// The split read.
    pub split: &'static str,
    /// Training size.
    pub imgsz: u32,
    /// Images per batch.
    pub batch: usize,
    /// Workers per stage.
    pub workers: usize,
    /// Epochs run.
    pub epochs: u32,
    /// Usable images in the split.
    pub split_images: usize,
    /// Images delivered over all epochs (`split_images × epochs` unless samples were skipped).
    pub images: u64,
    /// Batches delivered over all epochs.
    pub batches: u64,
    /// Images/s of the first epoch (read + decode + filling the cache + thread start).
    pub cold_images_per_s: f64,
    /// Images/s of the first two epochs together (Ultralytics' cold figure: fresh loader, two epochs).
    pub cold_two_epochs_images_per_s: f64,
    /// Median images/s over the warm epochs (2nd onwards).
    pub warm_images_per_s: f64,
    /// Slowest warm epoch, images/s.
    pub warm_min: f64,
    /// Fastest warm epoch, images/s.
    pub warm_max: f64,
    /// Every epoch's figures.
    pub per_epoch: Vec<EpochFigures>,
    /// Samples skipped for bad input (all epochs).
    pub skipped: u64,
    /// The decoded-image cache at the end.
    pub cache_stats: SourceStats,
    /// The `cache: disk` file (`None` in the other modes).
    pub disk_cache: Option<DiskCacheFigures>,
    /// Stage shares and bottleneck of the cold epoch (stages `read`, `decode`, `augment`).
    pub cold_telemetry: EpochShares,
    /// Stage shares and bottleneck of the last warm epoch.
    pub warm_telemetry: EpochShares,
    /// The limiting stage in the warm epochs (`warm_telemetry.bottleneck`).
    pub bottleneck: String,
    /// The process's anonymous resident memory (`RssAnon` of `/proc/self/status`) after the last epoch, loader
    /// and cache alive: what the decoded images cost in private memory (the pages of a `cache: disk` file are
    /// file-backed and do not count). `None` where the kernel does not report it.
    pub rss_anon_bytes: Option<u64>,
    /// A checksum of the bytes the consumer touched (keeps the consumer honest).
    pub checksum: u64,
}

enum Built {
    Train(Box<TrainLoader>),
    Val(ValLoader),
}

impl Built {
    fn epoch(&self, epoch: u32, epochs: u32) -> PipelineIter<Pooled<Batch>> {
        match self {
            Self::Train(l) => l.epoch(epoch, epochs),
            Self::Val(l) => l.pass(),
        }
    }

    fn skipped(&self) -> u64 {
        match self {
            Self::Train(l) => l.skips().skipped,
            Self::Val(l) => l.skips().skipped,
        }
    }
}

/// Drains one epoch, touching every batch; the loop's times as the trainer records them (the consumer's own
/// work in `model_s`).
fn consume(iter: &mut PipelineIter<Pooled<Batch>>, t0: Instant) -> Result<(LoopTimes, u64)> {
    let mut times = LoopTimes::default();
    let mut sum = 0u64;
    let mut t_wait = Instant::now();
    for batch in iter.by_ref() {
        let batch = batch?;
        times.data_wait_s += t_wait.elapsed().as_secs_f64();
        let t = Instant::now();
        sum = sum.wrapping_mul(31).wrapping_add(touch(batch.pixels(), TOUCH_STRIDE));
        sum = sum.wrapping_add(batch.targets.len() as u64);
        times.images += batch.len() as u64;
        times.batches += 1;
        drop(batch);
        times.model_s += t.elapsed().as_secs_f64();
        t_wait = Instant::now();
    }
    times.wall_s = t0.elapsed().as_secs_f64();
    Ok((times, std::hint::black_box(sum)))
}

/// Builds the loader the trainer would build for `opts` and runs `opts.epochs` epochs.
pub fn run(opts: &LoaderBenchOptions) -> Result<LoaderBenchReport> {
    let invalid = |what, reason: &str| Err(BenchError::Invalid { what, reason: reason.to_string() });
    if opts.epochs < 2 {
        return invalid("epochs", "at least 2 (the first epoch is the cold one, the others are warm)");
    }
    if opts.imgsz == 0 || opts.batch == 0 || opts.workers == 0 {
        return invalid("settings", "imgsz, batch and workers must be positive");
    }
    let split = opts.mode.split();
    let loaded = load_split(&opts.data, split, &IndexOptions { cache: true, find_orphans: false }, true)?;
    let split_images = loaded.index().len();
    let train = opts.mode == LoaderMode::Train;
    let mut source =
        DecodedSource::open(&loaded.source, loaded.indexed.index, opts.imgsz, train, opts.cache.budget_bytes())?;
    let mut disk_cache = None;
    if opts.cache == CacheMode::Disk
        && let Some(path) = disk_cache_path(source.index(), opts.imgsz, train, opts.cache_dir.as_deref())
    {
        let t0 = Instant::now();
        let (cache, how) = source.open_or_build_disk_cache(&path, &mut |_, _| {})?;
        let seconds = t0.elapsed().as_secs_f64();
        source = source.with_node_cache(cache)?;
        disk_cache = Some(DiskCacheFigures { path, reused: how == CacheFile::Reused, seconds });
    }
    let source = Arc::new(source);
    let cfg = LoaderConfig { workers: opts.workers, ..LoaderConfig::new(opts.imgsz, opts.batch, opts.seed) };
    let loader = match opts.mode {
        // Ultralytics' default hyp; mosaic in every epoch, as in the peer's loader (close_mosaic is the trainer's).
        LoaderMode::Train => Built::Train(Box::new(TrainLoader::new(
            Arc::clone(&source),
            cfg,
            Hyp { close_mosaic: 0, ..Hyp::default() },
        )?)),
        LoaderMode::Val => Built::Val(ValLoader::new(Arc::clone(&source), cfg)),
    };

    let mut per_epoch = Vec::with_capacity(opts.epochs as usize);
    let mut telemetry = Vec::with_capacity(opts.epochs as usize);
    let mut checksum = 0u64;
    for epoch in 0..opts.epochs {
        let src0 = source.stats();
        let t0 = Instant::now();
        let mut iter = loader.epoch(epoch, opts.epochs);
        let (times, sum) = consume(&mut iter, t0)?;
        let report = iter.report();
        drop(iter);
        let src1 = source.stats();
        let mut tel =
            EpochShares::new(epoch + 1, times, &report, src1.read_s - src0.read_s, src1.decode_s - src0.decode_s);
        tel.stages.retain(|s| matches!(s.stage.as_str(), "read" | "decode" | "augment"));
        checksum = checksum.wrapping_mul(31).wrapping_add(sum);
        per_epoch.push(EpochFigures {
            epoch: epoch + 1,
            images: times.images,
            batches: times.batches,
            seconds: times.wall_s,
            images_per_s: rate(times.images as f64, times.wall_s),
        });
        telemetry.push(tel);
    }

    let rss_anon_bytes = rss_anon_bytes();
    let warm_rates: Vec<f64> = per_epoch[1..].iter().map(|e| e.images_per_s).collect();
    let warm = Spread::of(&warm_rates).ok_or(BenchError::Invalid { what: "epochs", reason: "no warm epoch".into() })?;
    let (first, second) = (&per_epoch[0], &per_epoch[1]);
    let cold_two = rate((first.images + second.images) as f64, first.seconds + second.seconds);
    let cold_telemetry = telemetry[0].clone();
    let warm_telemetry = telemetry[telemetry.len() - 1].clone();
    Ok(LoaderBenchReport {
        mode: opts.mode,
        cache: opts.cache,
        split: split.as_str(),
        imgsz: opts.imgsz,
        batch: opts.batch,
        workers: opts.workers,
        epochs: opts.epochs,
        split_images,
        images: per_epoch.iter().map(|e| e.images).sum(),
        batches: per_epoch.iter().map(|e| e.batches).sum(),
        cold_images_per_s: first.images_per_s,
        cold_two_epochs_images_per_s: cold_two,
        warm_images_per_s: warm.median,
        warm_min: warm.min,
        warm_max: warm.max,
        skipped: loader.skipped(),
        cache_stats: source.stats(),
        disk_cache,
        bottleneck: warm_telemetry.bottleneck.clone(),
        cold_telemetry,
        warm_telemetry,
        per_epoch,
        rss_anon_bytes,
        checksum,
    })
}

/// `RssAnon` of `/proc/self/status`, in bytes.
fn rss_anon_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.trim_start_matches("RssAnon:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

impl LoaderBenchReport {
    /// A few lines for the console.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{} loader, {} images, imgsz {}, batch {}, {} workers/stage, cache {}: {} epochs, {} images, {} batches\n",
            self.mode.as_str(),
            self.split_images,
            self.imgsz,
            self.batch,
            self.workers,
            self.cache,
            self.epochs,
            self.images,
            self.batches
        );
        s += &format!(
            "  cold (epoch 1): {:.1} img/s · first two epochs: {:.1} img/s\n",
            self.cold_images_per_s, self.cold_two_epochs_images_per_s
        );
        s += &format!(
            "  warm (epochs 2 to {}): {:.1} img/s median (min {:.1}, max {:.1})\n",
            self.epochs, self.warm_images_per_s, self.warm_min, self.warm_max
        );
        for (label, t) in [("cold", &self.cold_telemetry), ("warm", &self.warm_telemetry)] {
            s += &format!("  {label} busy:");
            for st in &t.stages {
                s += &format!(" {} {:.0}%/{}w", st.stage, st.busy_fraction * 100.0, st.workers);
            }
            s += &format!(" · bottleneck: {} ({})\n", t.bottleneck, t.hint);
        }
        if let Some(d) = &self.disk_cache {
            let how = if d.reused { "opened" } else { "built" };
            s += &format!(
                "  disk cache {} ({} images, {:.1} MB) {how} in {:.2} s\n",
                d.path.display(),
                self.cache_stats.node_cache_images,
                self.cache_stats.node_cache_bytes as f64 / 1e6,
                d.seconds
            );
        }
        if let Some(b) = self.rss_anon_bytes {
            s += &format!("  anonymous resident memory after the last epoch: {:.1} MB\n", b as f64 / 1e6);
        }
        if self.skipped > 0 {
            s += &format!("  skipped {} bad samples\n", self.skipped);
        }
        s
    }
}
