//! The training loop: data → transfer → train-mode forward → loss → backward/accumulate/step/EMA, then each
//! epoch validation with the EMA weights, `results.csv`, telemetry, and atomic checkpoints; `--resume` continues
//! from a checkpoint exactly (same batches, same optimizer state, same loss sequence).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use sluice_core::{Transfer, sample_rng};
use sluice_dataset::{DataConfig, IndexOptions, SampleIndex, Split};
use sluice_kernels::threads::on_compute_pool;
use sluice_model::candle_core::{DType, Device};
use sluice_model::{DetectionLoss, LoadMode, Mode, YoloConfig, YoloV8};
use sluice_transfer::{DeviceTransfer, Readback};

use super::config::{CacheMode, TrainConfig};
use super::loss_path::{Items, dense_on, step_loss};
use super::results::{EpochRow, JsonLines, ResultsCsv};
use super::telemetry::{EpochTelemetry, LoopTimes, PoolTelemetry, SyncTelemetry, ValTelemetry};
use super::validate::{ValOptions, ValResult, validate};
use crate::loader::{DecodedSource, LoaderConfig, STRIDE, TrainLoader, ValLoader, default_workers};
use crate::optim::{Optimization, RunShape, read_user_metadata};

/// What the loop reports to its caller after every batch (progress bars, tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchEvent {
    /// 0-based epoch.
    pub epoch: u32,
    /// Batch within the epoch.
    pub batch: usize,
    /// Batches in the epoch.
    pub batches: usize,
    /// Side of the batch's square images (`imgsz`, or the batch's size with `multi_scale`; Ultralytics' `Size`).
    pub side: usize,
    /// Global iteration (batches since the start of training).
    pub iteration: u64,
    /// Loss items (box, cls, dfl) of this batch.
    pub loss: [f64; 3],
    /// Running mean of the epoch's loss items.
    pub mean_loss: [f64; 3],
    /// Images per second so far this epoch.
    pub images_per_s: f64,
    /// Fraction of this epoch's loop time spent waiting for data.
    pub data_wait_fraction: f64,
    /// Whether the step was skipped for a non-finite loss/gradient.
    pub skipped: bool,
}

/// What the loop reports after every epoch.
#[derive(Debug, Clone)]
pub struct EpochEvent {
    /// The results row.
    pub row: EpochRow,
    /// The telemetry.
    pub telemetry: EpochTelemetry,
    /// Whether this epoch set a new best fitness.
    pub best: bool,
}

/// The final validation of a finished run: `best` validated once more, as Ultralytics' `final_eval` does.
#[derive(Debug, Clone, Copy)]
pub struct FinalEvalEvent<'a> {
    /// The weights validated (`weights/best.safetensors`).
    pub weights: &'a Path,
    /// The 1-based epoch they are from.
    pub epoch: u32,
    /// The validation, with per-class metrics in `result.report.classes`.
    pub result: &'a ValResult,
    /// Class names, index = class id.
    pub names: &'a [String],
}

/// Callbacks of a run.
pub trait Observer {
    /// After each batch.
    fn batch(&mut self, _event: &BatchEvent) {}
    /// After each epoch (validation included).
    fn epoch(&mut self, _event: &EpochEvent) {}
    /// After the last epoch: the validation of `best` (Ultralytics' `final_eval`).
    fn final_eval(&mut self, _event: &FinalEvalEvent<'_>) {}
    /// A warning (non-finite step, skipped samples).
    fn warn(&mut self, message: &str) {
        tracing_free_warn(message);
    }
}

fn tracing_free_warn(message: &str) {
    eprintln!("warning: {message}");
}

/// An observer that does nothing but print warnings.
#[derive(Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// `runs/<name>/summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Epochs completed (including those before a resume).
    pub epochs: u32,
    /// Whether the run stopped early (Ctrl-C); `last` holds the position to resume from.
    pub interrupted: bool,
    /// Metrics of the last validation: precision, recall, mAP50, mAP50-95.
    pub final_metrics: Metrics,
    /// Metrics of the best epoch (by fitness).
    pub best_metrics: Metrics,
    /// 1-based epoch of the best fitness.
    pub best_epoch: u32,
    /// Wall seconds of this invocation (training and validation).
    pub wall_s: f64,
    /// Seconds in the training loops only.
    pub train_s: f64,
    /// Mean training images per second.
    pub mean_images_per_s: f64,
    /// Mean fraction of the loop spent waiting for data.
    pub mean_data_wait_fraction: f64,
    /// The stage named bottleneck most often.
    pub bottleneck: String,
    /// Steps skipped for non-finite values.
    pub nonfinite_steps: u64,
    /// Samples skipped for bad input.
    pub skipped_samples: u64,
    /// `weights/last.safetensors`.
    pub last: PathBuf,
    /// `weights/best.safetensors`.
    pub best: PathBuf,
}

/// Precision, recall and the two mAPs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Mean precision.
    pub precision: f64,
    /// Mean recall.
    pub recall: f64,
    /// mAP at IoU 0.5.
    pub map50: f64,
    /// mAP over IoU 0.5:0.95.
    pub map50_95: f64,
    /// `0.1·mAP50 + 0.9·mAP50-95`.
    pub fitness: f64,
}

impl Metrics {
    fn of(v: &ValResult) -> Self {
        let r = &v.report;
        Self { precision: r.mp, recall: r.mr, map50: r.map50, map50_95: r.map50_95, fitness: r.fitness() }
    }
}

/// Where the loop stands; stored in every checkpoint's metadata.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The epoch to run next (0-based).
    pub epoch: u32,
    /// The batch of `epoch` to run next (non-zero after an interrupted epoch).
    pub batch: usize,
    /// Global iteration count.
    pub iteration: u64,
    /// Sum of loss items over the batches of `epoch` done so far.
    pub epoch_loss_sum: [f64; 3],
    /// Best fitness so far and its epoch.
    pub best_fitness: Option<f64>,
    /// 1-based epoch of the best fitness.
    pub best_epoch: u32,
    /// Metrics of the best epoch.
    pub best_metrics: Metrics,
    /// Metrics of the last validation.
    pub last_metrics: Metrics,
    /// Validation losses of the last validation.
    pub last_val_loss: [f64; 3],
    /// Seconds trained before this invocation.
    pub elapsed_s: f64,
    /// Non-finite steps so far.
    pub nonfinite_steps: u64,
}

/// The metadata kept in a checkpoint beside the tensors.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CheckpointMeta {
    /// The resolved configuration (YAML).
    config: String,
    /// The run folder.
    run_dir: PathBuf,
    /// Loop position.
    progress: Progress,
}

/// The files of a run.
#[derive(Debug, Clone)]
pub struct RunPaths {
    /// `runs/<name>`.
    pub dir: PathBuf,
    /// `weights/last.safetensors`.
    pub last: PathBuf,
    /// `weights/best.safetensors`.
    pub best: PathBuf,
    /// `results.csv`.
    pub results: PathBuf,
    /// `telemetry.jsonl`.
    pub telemetry: PathBuf,
    /// `summary.json`.
    pub summary: PathBuf,
}

impl RunPaths {
    fn new(dir: PathBuf) -> Self {
        Self {
            last: dir.join("weights/last.safetensors"),
            best: dir.join("weights/best.safetensors"),
            results: dir.join("results.csv"),
            telemetry: dir.join("telemetry.jsonl"),
            summary: dir.join("summary.json"),
            dir,
        }
    }

    /// `project/name`, or `project/name2`, `name3`, … when it exists (unless `exist_ok`); not created yet.
    fn fresh(cfg: &TrainConfig) -> Self {
        let base = cfg.project.join(&cfg.name);
        let mut dir = base.clone();
        let mut n = 2;
        while dir.exists() && !cfg.exist_ok {
            dir = cfg.project.join(format!("{}{n}", cfg.name));
            n += 1;
        }
        Self::new(dir)
    }

    fn create(&self) -> Result<()> {
        let weights = self.dir.join("weights");
        std::fs::create_dir_all(&weights).with_context(|| format!("creating {}", weights.display()))
    }
}

/// Finds the checkpoint to resume: a `.safetensors` file, a run folder, or (none given) the most recently
/// modified `*/weights/last.safetensors` under `project`.
pub fn find_resume(path: Option<&Path>, project: &Path) -> Result<PathBuf> {
    match path {
        Some(p) if p.is_dir() => Ok(p.join("weights/last.safetensors")),
        Some(p) => Ok(p.to_path_buf()),
        None => {
            let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
            let entries = std::fs::read_dir(project).with_context(|| format!("no runs in {}", project.display()))?;
            for e in entries.flatten() {
                let p = e.path().join("weights/last.safetensors");
                if let Ok(m) = p.metadata().and_then(|m| m.modified())
                    && best.as_ref().is_none_or(|(t, _)| m > *t)
                {
                    best = Some((m, p));
                }
            }
            best.map(|(_, p)| p).with_context(|| format!("no */weights/last.safetensors under {}", project.display()))
        }
    }
}

/// Reads the configuration stored in a checkpoint (for `--resume`).
pub fn checkpoint_config(path: &Path) -> Result<TrainConfig> {
    let meta = read_meta(path)?;
    TrainConfig::from_yaml_str(&meta.config).with_context(|| format!("{}: stored configuration", path.display()))
}

fn read_meta(path: &Path) -> Result<CheckpointMeta> {
    serde_json::from_value(read_user_metadata(path)?)
        .with_context(|| format!("{}: not a sluice training checkpoint", path.display()))
}

/// The dtype of the convolutions under `amp` (bf16 on a CUDA device), `None` for full f32.
pub(crate) fn amp_dtype(cfg: &TrainConfig, device: &Device) -> Option<DType> {
    (cfg.amp && device.is_cuda()).then_some(DType::BF16)
}

fn device_of(name: &str) -> Result<Device> {
    if name == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = name.strip_prefix("cuda").map(|s| s.trim_start_matches(':')).unwrap_or("0");
    let ordinal: usize = if ordinal.is_empty() { 0 } else { ordinal.parse().context("device ordinal")? };
    let device = Device::new_cuda(ordinal)
        .with_context(|| format!("device {name}: this build has no CUDA support or no GPU"))?;
    // Freed tensors stay in the stream-ordered pool across synchronisations (a caching allocator), so steady-state
    // steps reserve no new device memory; the telemetry counts the steps that still did.
    sluice_transfer::retain_device_pool(&device).with_context(|| format!("device {name}: memory pool"))?;
    Ok(device)
}

/// A model for validation or prediction from `weights`: a training checkpoint (its EMA weights, architecture from
/// the stored configuration unless `model` is given) or a plain weights file (Ultralytics key names; `model`
/// required). `nc` is the dataset's class count.
pub fn load_model(weights: &Path, model: Option<&str>, nc: usize, device: &Device) -> Result<YoloV8> {
    let stored = read_meta(weights).ok();
    let name = match (model, &stored) {
        (Some(m), _) => m.to_string(),
        (None, Some(meta)) => TrainConfig::from_yaml_str(&meta.config)?.model,
        (None, None) => bail!("{}: a plain weights file; say which architecture with --model", weights.display()),
    };
    let cfg = TrainConfig { model: name, ..Default::default() };
    let mut m = YoloV8::new(YoloConfig::new(cfg.scale()?, nc), DType::F32, device)?;
    match stored {
        Some(_) => m.load_weights_prefixed(weights, "ema.", LoadMode::Strict),
        None => m.load_weights(weights, LoadMode::Strict),
    }
    .with_context(|| format!("loading {} for {nc} classes", weights.display()))?;
    Ok(m)
}

/// Validates `weights` on a split of `data` (`sluice val`).
pub fn validate_weights(
    weights: &Path,
    model: Option<&str>,
    data: &Path,
    split: Split,
    imgsz: u32,
    batch: usize,
    workers: usize,
) -> Result<(ValResult, Vec<String>)> {
    let cfg = DataConfig::load(data).with_context(|| format!("dataset {}", data.display()))?;
    let opts = IndexOptions { cache: true, find_orphans: false };
    let index = cfg.index(split, &opts).with_context(|| format!("indexing the {} split", split.as_str()))?.index;
    let device = Device::Cpu;
    let m = load_model(weights, model, cfg.nc(), &device)?;
    let workers = if workers == 0 { default_workers() } else { workers };
    let lcfg = LoaderConfig { workers, ..LoaderConfig::new(imgsz, batch, 0) };
    let val = ValLoader::new(source(index, imgsz, false, CacheMode::None)?, lcfg);
    let loss = DetectionLoss::new(cfg.nc());
    let v = validate(&m, &val, &loss, &DeviceTransfer::new(&device, DType::F32)?, ValOptions::default())?;
    Ok((v, cfg.names))
}

/// Seed-determined subset of `fraction` of the samples (at least one), in their original order.
fn subset(index: &SampleIndex, fraction: f64, seed: u64) -> SampleIndex {
    if fraction >= 1.0 || index.samples.is_empty() {
        return index.clone();
    }
    let keep = ((index.len() as f64 * fraction).ceil() as usize).clamp(1, index.len());
    let mut order: Vec<usize> = (0..index.len()).collect();
    order.shuffle(&mut sample_rng(seed, u64::MAX, 0));
    let mut chosen = order[..keep].to_vec();
    chosen.sort_unstable();
    SampleIndex {
        names: index.names.clone(),
        samples: chosen.into_iter().map(|i| index.samples[i].clone()).collect(),
        category_ids: index.category_ids.clone(),
    }
}

fn source(index: SampleIndex, imgsz: u32, augment: bool, cache: CacheMode) -> Result<Arc<DecodedSource>> {
    Ok(Arc::new(DecodedSource::from_files(index, imgsz, augment, cache.budget_bytes())?))
}

/// A training run.
pub struct Trainer {
    cfg: TrainConfig,
    paths: RunPaths,
    names: Vec<String>,
    model: YoloV8,
    opt: Optimization,
    loss: DetectionLoss,
    transfer: DeviceTransfer,
    /// Steps take the dense (device) loss path ([`super::loss_path`]).
    dense_loss: bool,
    /// Asynchronous reads of the device path's loss items.
    readback: Readback,
    /// The values of the last readback taken.
    readback_buf: Vec<f32>,
    /// The device pool's growth, step by step across epochs (taken per epoch for the telemetry).
    pool_growth: sluice_transfer::PoolGrowth,
    /// The latest loss items known on the host (device path: a batch or two old).
    last_items: [f64; 3],
    train: TrainLoader,
    val: ValLoader,
    progress: Progress,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("run", &self.paths.dir).field("progress", &self.progress).finish()
    }
}

impl Trainer {
    /// Takes the device path's loss items that have landed (all of them, waiting, with `block`) into the epoch's
    /// sums and [`Trainer::last_items`].
    fn take_landed_items(&mut self, block: bool) -> Result<()> {
        loop {
            let tag = if block {
                self.readback.wait(&mut self.readback_buf)?
            } else {
                self.readback.poll(&mut self.readback_buf)?
            };
            if tag.is_none() {
                return Ok(());
            }
            self.landed_items();
        }
    }

    /// Adds the items in the readback buffer to the epoch's sums (when finite) and keeps them as the latest.
    fn landed_items(&mut self) {
        let b = &self.readback_buf;
        if b.len() < 3 {
            return;
        }
        let items = [f64::from(b[0]), f64::from(b[1]), f64::from(b[2])];
        self.last_items = items;
        if items.iter().all(|v| v.is_finite()) {
            for (s, v) in self.progress.epoch_loss_sum.iter_mut().zip(items) {
                *s += v;
            }
        }
    }

    /// Prepares a new run: indexes the data, builds loaders, model and optimizer, creates the run folder.
    pub fn new(cfg: TrainConfig) -> Result<Self> {
        cfg.validate()?;
        let paths = RunPaths::fresh(&cfg);
        let t = Self::build(cfg, paths, true)?;
        t.paths.create()?;
        std::fs::write(t.paths.dir.join("args.yaml"), t.cfg.to_yaml()?)?;
        Ok(t)
    }

    /// Continues the run whose checkpoint is `path` (see [`find_resume`]).
    pub fn resume(path: &Path) -> Result<Self> {
        let meta = read_meta(path)?;
        let cfg = TrainConfig::from_yaml_str(&meta.config)?;
        cfg.validate()?;
        let mut t = Self::build(cfg, RunPaths::new(meta.run_dir.clone()), false)?;
        t.paths.create()?;
        t.opt.load_state(&mut t.model, path).with_context(|| format!("restoring {}", path.display()))?;
        t.progress = meta.progress;
        if t.progress.epoch >= t.cfg.epochs {
            bail!("{}: the run already finished its {} epochs; nothing to resume", path.display(), t.cfg.epochs);
        }
        Ok(t)
    }

    fn build(cfg: TrainConfig, paths: RunPaths, initial_weights: bool) -> Result<Self> {
        let data = DataConfig::load(&cfg.data).with_context(|| format!("dataset {}", cfg.data.display()))?;
        let opts = IndexOptions { cache: true, find_orphans: false };
        let train_index = data.index(Split::Train, &opts).context("indexing the train split")?.index;
        let val_index = data.index(Split::Val, &opts).context("indexing the val split")?.index;
        if train_index.is_empty() {
            bail!("{}: the train split has no usable images", cfg.data.display());
        }
        let nc = data.nc();
        let device = device_of(&cfg.device)?;
        let mut cfg = cfg;
        if cfg.batch == super::config::AUTO_BATCH {
            cfg.batch = super::autobatch::auto_batch(&cfg, nc, &device)?;
        }
        let workers = if cfg.workers == 0 { default_workers() } else { cfg.workers };
        let lcfg = LoaderConfig {
            workers,
            strict: cfg.strict,
            multi_scale: cfg.multi_scale,
            ..LoaderConfig::new(cfg.imgsz, cfg.batch, cfg.seed)
        };
        // Ultralytics' guard: a final batch of one image at a side under two strides gives BatchNorm one value per
        // channel.
        let (min_side, _) = lcfg.train_sides();
        let last_batch = match train_index.len() % cfg.batch {
            0 => cfg.batch,
            r => r,
        };
        if min_side < 2 * STRIDE && last_batch == 1 {
            bail!(
                "final batch=1 training at imgsz={min_side} gives BatchNorm a single value per channel; change batch, \
                 or use imgsz and multi_scale that keep every size >= {}",
                2 * STRIDE
            );
        }
        let train = TrainLoader::new(source(train_index, cfg.imgsz, true, cfg.cache)?, lcfg, cfg.hyp)?;
        let val_index = subset(&val_index, cfg.val_fraction, cfg.seed);
        // Ultralytics validates with twice the training batch, at `imgsz` (multi-scale is for training only).
        let vcfg = LoaderConfig { batch: cfg.batch * 2, multi_scale: 0.0, ..lcfg };
        let val = ValLoader::new(source(val_index, cfg.imgsz, false, cfg.cache)?, vcfg);
        let mut model = YoloV8::new_seeded(YoloConfig::new(cfg.scale()?, nc), DType::F32, &device, cfg.seed)?;
        if let (true, Some(w)) = (initial_weights, &cfg.weights) {
            model.load_weights(w, LoadMode::Strict).with_context(|| format!("initial weights {}", w.display()))?;
        }
        if let Some(half) = amp_dtype(&cfg, &device) {
            model.set_autocast(Some(half))?;
        } else if cfg.amp {
            eprintln!("amp: mixed precision is for CUDA devices; training in f32 on the CPU");
        }
        let shape = RunShape {
            batch: cfg.batch,
            epochs: cfg.epochs as usize,
            batches_per_epoch: train.len(),
            train_images: train.source().index().len(),
        };
        let mut opt = Optimization::new(&model, &cfg.optim, shape)?;
        // Off the CPU, clipping and the non-finite skip stay on the device (no read per optimizer step).
        opt.set_device_checks(dense_on(&device));
        let mut loss = DetectionLoss::new(nc);
        loss.gains = cfg.loss_gains();
        Ok(Self {
            names: data.names.clone(),
            dense_loss: dense_on(&device),
            readback: Readback::new(&device).context("loss readback")?,
            readback_buf: Vec::new(),
            pool_growth: sluice_transfer::PoolGrowth::new(),
            last_items: [0.0; 3],
            transfer: DeviceTransfer::new(&device, DType::F32).context("transfer to the device")?,
            cfg,
            paths,
            model,
            opt,
            loss,
            train,
            val,
            progress: Progress::default(),
            stop: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The resolved configuration.
    pub fn config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The run's files.
    pub fn paths(&self) -> &RunPaths {
        &self.paths
    }

    /// Class names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Training images and validation images.
    pub fn sizes(&self) -> (usize, usize) {
        (self.train.source().index().len(), self.val.source().index().len())
    }

    /// A flag that, once set (Ctrl-C), makes the loop save `last` after the current batch and return.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.stop)
    }

    fn save(&self, path: &Path) -> Result<()> {
        let meta = CheckpointMeta {
            config: self.cfg.to_yaml()?,
            run_dir: self.paths.dir.clone(),
            progress: self.progress.clone(),
        };
        self.opt
            .save_state(&self.model, path, &serde_json::to_value(&meta)?)
            .with_context(|| format!("saving {}", path.display()))
    }

    /// Ultralytics' `final_eval`: validates `best` once more after the last epoch, reports it to the observer
    /// (per class) and draws the final validation's plots from it (PR curve, the first val batch with its labels
    /// and with its predictions). Nothing to do when no validation ever wrote `best`.
    fn final_eval(&self, observer: &mut dyn Observer) -> Result<()> {
        let best = &self.paths.best;
        if !best.exists() {
            return Ok(());
        }
        let model = load_model(best, None, self.loss.nc, self.model.device())?;
        let opts = ValOptions { keep_first_batch: self.cfg.plots };
        let v = validate(&model, &self.val, &self.loss, &self.transfer, opts)?;
        if self.cfg.plots {
            let out = self.paths.dir.join("PR_curve.png");
            if let Err(e) = crate::plots::plot_pr_curve(&v.report, &self.names, &out) {
                observer.warn(&format!("{}: {e}", out.display()));
            }
            if let Some(first) = &v.first_batch {
                for (file, dets) in
                    [("val_batch0_labels.jpg", None), ("val_batch0_pred.jpg", Some(&first.detections[..]))]
                {
                    let out = self.paths.dir.join(file);
                    if let Err(e) = crate::plots::plot_batch(&first.batch, &self.names, dets, &out) {
                        observer.warn(&format!("{}: {e}", out.display()));
                    }
                }
            }
        }
        observer.final_eval(&FinalEvalEvent {
            weights: best,
            epoch: self.progress.best_epoch,
            result: &v,
            names: &self.names,
        });
        Ok(())
    }

    /// Runs the remaining epochs.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<TrainSummary> {
        let start = Instant::now();
        let results = ResultsCsv::open(&self.paths.results, self.progress.epoch)?;
        let telemetry_log = JsonLines::new(&self.paths.telemetry);
        let (mut train_s, mut images, mut wait_s) = (0f64, 0u64, 0f64);
        let mut bottlenecks: Vec<String> = Vec::new();
        let mut interrupted = false;
        let mut consecutive_nonfinite = 0u32;
        let epochs = self.cfg.epochs;
        while self.progress.epoch < epochs {
            let epoch = self.progress.epoch;
            let first = self.progress.batch;
            let batches = self.train.len();
            let skipped_before = self.train.skips().skipped;
            let src0 = self.train.source().stats();
            let mut times = LoopTimes::default();
            let mut nonfinite_epoch = 0u64;
            let mut done_in_epoch = first;
            let t_epoch = Instant::now();
            let syncs0 = sluice_core::syncs::snapshot();
            let mut memory_peak: Option<u64> = None;
            let mut iter = self.train.epoch_from(epoch, epochs, first);
            let mut t_wait = Instant::now();
            for batch in iter.by_ref() {
                let batch = batch.with_context(|| format!("epoch {}: loading a batch", epoch + 1))?;
                times.data_wait_s += t_wait.elapsed().as_secs_f64();
                if self.cfg.plots && self.progress.iteration == 0 {
                    let out = self.paths.dir.join("train_batch0.jpg");
                    if let Err(e) = crate::plots::plot_batch(&batch, &self.names, None, &out) {
                        observer.warn(&format!("{}: {e}", out.display()));
                    }
                }
                let t = Instant::now();
                let x = self.transfer.transfer(&batch).context("transfer")?;
                times.transfer_s += t.elapsed().as_secs_f64();
                let t = Instant::now();
                // The forward + loss, and below the backward + update, each on a worker of the compute pool
                // (`sluice_kernels::threads::on_compute_pool`).
                let (model, loss, dense) = (&self.model, &self.loss, self.dense_loss);
                let out = on_compute_pool(model.device(), || -> Result<_> {
                    let (raw, _) = model.forward_raw(&x.images, Mode::Train)?;
                    step_loss(loss, &raw, &batch, &x, dense)
                })?;
                let (ni, ep) = (self.progress.iteration as usize, epoch as usize);
                // The CPU path reads its items now (they are logged, and they tell a non-finite loss). The device
                // path queues them for an asynchronous read, shows the latest that has landed, and leaves the
                // non-finite check to the gradient norm at the optimizer step (a non-finite batch then drops its
                // accumulation window), so no read waits on the device.
                let (items, finite) = match &out.items {
                    Items::Host(v) => (*v, v.iter().all(|v| v.is_finite())),
                    Items::Device(t) => {
                        if self.readback.submit(ni as u64, t, &mut self.readback_buf)?.is_some() {
                            self.landed_items();
                        }
                        self.take_landed_items(false)?;
                        (self.last_items, true)
                    }
                };
                let (opt, model) = (&mut self.opt, &self.model);
                let step =
                    on_compute_pool(model.device(), || opt.batch_known_finite(model, &out.total, finite, ni, ep))?;
                times.model_s += t.elapsed().as_secs_f64();
                if let Some(m) = sluice_transfer::device_memory_in_use(self.transfer.device()) {
                    memory_peak = Some(memory_peak.map_or(m, |p| p.max(m)));
                }
                self.pool_growth.observe(sluice_transfer::device_pool_reserved(self.transfer.device()));
                times.images += batch.len() as u64;
                times.batches += 1;
                let k = done_in_epoch;
                done_in_epoch += 1;
                self.progress.iteration += 1;
                self.progress.batch = done_in_epoch;
                if step.skipped_nonfinite {
                    nonfinite_epoch += 1;
                    consecutive_nonfinite += 1;
                    self.progress.nonfinite_steps += 1;
                    observer.warn(&format!(
                        "epoch {} batch {k}: non-finite loss or gradient ({:?}); step skipped",
                        epoch + 1,
                        items
                    ));
                    if consecutive_nonfinite >= self.cfg.max_nonfinite {
                        bail!(
                            "{} consecutive non-finite steps (epoch {} batch {k}); stopping. The last good \
                             checkpoint is {} (try a lower lr0 or check the labels)",
                            consecutive_nonfinite,
                            epoch + 1,
                            self.paths.last.display()
                        );
                    }
                } else {
                    consecutive_nonfinite = 0;
                    if !self.dense_loss {
                        for (s, v) in self.progress.epoch_loss_sum.iter_mut().zip(items) {
                            *s += v;
                        }
                    }
                }
                // Device items still in flight are not in the sums yet.
                let in_flight = self.readback.pending() as u64;
                let counted = (done_in_epoch as u64).saturating_sub(nonfinite_epoch + in_flight).max(1) as f64;
                let wall = t_epoch.elapsed().as_secs_f64();
                observer.batch(&BatchEvent {
                    epoch,
                    batch: k,
                    batches,
                    side: batch.shape().width,
                    iteration: self.progress.iteration,
                    loss: items,
                    mean_loss: self.progress.epoch_loss_sum.map(|s| s / counted),
                    images_per_s: times.images as f64 / wall.max(1e-9),
                    data_wait_fraction: times.data_wait_s / wall.max(1e-9),
                    skipped: step.skipped_nonfinite,
                });
                if self.stop.load(Ordering::Relaxed) && done_in_epoch < batches {
                    interrupted = true;
                    break;
                }
                t_wait = Instant::now();
            }
            // The epoch's last device items (one wait at the end of the epoch, not per batch), and the optimizer
            // steps the device skipped for a non-finite gradient norm.
            self.take_landed_items(true)?;
            let device_skips = self.opt.take_device_skips()?;
            if device_skips > 0 {
                nonfinite_epoch += device_skips;
                self.progress.nonfinite_steps += device_skips;
                observer.warn(&format!(
                    "epoch {}: {device_skips} optimizer steps skipped on the device for a non-finite gradient norm",
                    epoch + 1
                ));
            }
            times.wall_s = t_epoch.elapsed().as_secs_f64();
            let loader_report = iter.report();
            drop(iter);
            if interrupted {
                self.progress.elapsed_s += start.elapsed().as_secs_f64();
                self.save(&self.paths.last)?;
                break;
            }
            let mean_loss = self.progress.epoch_loss_sum.map(|s| s / (done_in_epoch.max(1) as f64));
            self.opt.end_epoch(epoch as usize)?;
            let src1 = self.train.source().stats();
            let mut tel = EpochTelemetry::new(
                epoch + 1,
                times,
                &loader_report,
                src1.read_s - src0.read_s,
                src1.decode_s - src0.decode_s,
            );
            tel.blocking_syncs = SyncTelemetry::since(&syncs0, times.batches);
            tel.device_memory_peak_bytes = memory_peak;
            let pool = self.pool_growth.take();
            tel.device_pool = (pool.steps > 0).then(|| PoolTelemetry::from(pool));
            tel.nonfinite_steps = nonfinite_epoch;
            tel.skipped_samples = self.train.skips().skipped - skipped_before;
            if tel.skipped_samples > 0 {
                let first = self.train.skips().first;
                observer.warn(&format!(
                    "epoch {}: {} bad samples skipped (first: {})",
                    epoch + 1,
                    tel.skipped_samples,
                    first.first().map(String::as_str).unwrap_or("?")
                ));
            }
            let mut best = false;
            if self.cfg.validates(epoch) {
                let syncs0 = sluice_core::syncs::snapshot();
                let v = validate(self.opt.ema_model(), &self.val, &self.loss, &self.transfer, ValOptions::default())?;
                tel.val_s = v.seconds;
                let mut vt = ValTelemetry::new(v.images, v.seconds, v.data_wait_s, v.model_s, &v.stats);
                vt.blocking_syncs = SyncTelemetry::since(&syncs0, v.batches);
                tel.val = Some(vt);
                let m = Metrics::of(&v);
                self.progress.last_metrics = m;
                self.progress.last_val_loss = v.loss;
                if self.progress.best_fitness.is_none_or(|b| m.fitness > b) {
                    self.progress.best_fitness = Some(m.fitness);
                    self.progress.best_epoch = epoch + 1;
                    self.progress.best_metrics = m;
                    best = true;
                }
            }
            let m = self.progress.last_metrics;
            let row = EpochRow {
                epoch: epoch + 1,
                time: self.progress.elapsed_s + start.elapsed().as_secs_f64(),
                train_loss: mean_loss,
                metrics: [m.precision, m.recall, m.map50, m.map50_95],
                val_loss: self.progress.last_val_loss,
                lr: self.opt.lrs(),
            };
            results.append(&row)?;
            telemetry_log.append(&tel)?;
            train_s += times.wall_s;
            images += times.images;
            wait_s += times.data_wait_s;
            bottlenecks.push(tel.bottleneck.clone());
            self.progress.epoch += 1;
            self.progress.batch = 0;
            self.progress.epoch_loss_sum = [0.0; 3];
            // `last` after `best`: a kill between the two leaves the previous `last`, never a torn file.
            if best {
                self.save(&self.paths.best)?;
            }
            self.save(&self.paths.last)?;
            observer.epoch(&EpochEvent { row, telemetry: tel, best });
            if self.stop.load(Ordering::Relaxed) && self.progress.epoch < epochs {
                interrupted = true;
                break;
            }
        }
        if !interrupted && self.progress.epoch >= epochs {
            self.final_eval(observer)?;
        }
        let summary = TrainSummary {
            run_dir: self.paths.dir.clone(),
            epochs: self.progress.epoch,
            interrupted,
            final_metrics: self.progress.last_metrics,
            best_metrics: self.progress.best_metrics,
            best_epoch: self.progress.best_epoch,
            wall_s: start.elapsed().as_secs_f64(),
            train_s,
            mean_images_per_s: images as f64 / train_s.max(1e-9),
            mean_data_wait_fraction: wait_s / train_s.max(1e-9),
            bottleneck: most_frequent(&bottlenecks),
            nonfinite_steps: self.progress.nonfinite_steps,
            skipped_samples: self.train.skips().skipped,
            last: self.paths.last.clone(),
            best: self.paths.best.clone(),
        };
        std::fs::write(&self.paths.summary, serde_json::to_string_pretty(&summary)?)?;
        if self.cfg.plots {
            let out = self.paths.dir.join("results.png");
            if let Err(e) = crate::plots::plot_results(&self.paths.results, &out) {
                observer.warn(&format!("{}: {e}", out.display()));
            }
        }
        Ok(summary)
    }
}

fn most_frequent(v: &[String]) -> String {
    let mut best = (0usize, String::new());
    for s in v {
        let n = v.iter().filter(|x| *x == s).count();
        if n > best.0 {
            best = (n, s.clone());
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_is_seeded_ordered_and_nonempty() {
        let mut index = SampleIndex::default();
        for i in 0..10 {
            index.samples.push(sluice_dataset::Sample {
                image: PathBuf::from(format!("{i}.jpg")),
                format: sluice_dataset::ImageFormat::Jpeg,
                label_file: None,
                labels: sluice_core::ImageLabels::default(),
                crowd: Vec::new(),
                image_id: None,
            });
        }
        let a = subset(&index, 0.3, 1);
        assert_eq!(a.len(), 3);
        assert_eq!(a, subset(&index, 0.3, 1));
        assert!(a.samples.windows(2).all(|w| w[0].image < w[1].image));
        assert_ne!(a, subset(&index, 0.3, 2));
        assert_eq!(subset(&index, 0.01, 1).len(), 1);
        assert_eq!(subset(&index, 1.0, 1).len(), 10);
    }

    #[test]
    fn most_frequent_stage() {
        let v: Vec<String> = ["model", "decode", "model"].iter().map(|s| s.to_string()).collect();
        assert_eq!(most_frequent(&v), "model");
        assert_eq!(most_frequent(&[]), "");
    }
}
