//! The training run: [`Trainer`] builds everything a run needs (loaders over the reader the configuration names,
//! model, optimizer, loss, transfer) and [`Trainer::run`] drives its phases — train an epoch, end it (validate,
//! record, checkpoint), and after the last one Ultralytics' `final_eval` — reporting through an [`Observer`]. The
//! phases themselves are in [`super::epoch`]. `--resume` continues from a checkpoint exactly (same batches, same
//! optimizer state, same loss sequence).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use sluice_loader::{LoaderConfig, TrainLoader, ValLoader};
use sluice_model::candle_core::DType;
use sluice_model::{DetectionLoss, Yolo};
use sluice_transfer::{DeviceTransfer, Readback};

use super::config::TrainConfig;
use super::epoch::RunTotals;
use super::events::{FinalEvalEvent, Observer, Quiet};
use super::results::{JsonLines, ResultsCsv};
use super::setup::{Report, loader_config, model, node_source, splits};
use super::state::{CheckpointMeta, Progress, RunPaths, TrainSummary, read_meta};
use crate::dist::Dist;
use crate::error::{Context, Result};
use crate::optim::{Optimization, RunShape, ScalerSettings, StepOptions, StepPath};
use sluice_infer::loss_path::dense_on;
use sluice_infer::{ValOptions, validate_on};
use sluice_infer::{device_of, load_model, rank_device};

/// A message of the set-up, kept until the run has an observer.
#[derive(Debug)]
pub(super) enum Note {
    /// Information (what was chosen).
    Info(String),
    /// A warning (a setting that does not apply).
    Warn(String),
}

/// A training run.
pub struct Trainer {
    pub(super) cfg: TrainConfig,
    pub(super) paths: RunPaths,
    pub(super) names: Vec<String>,
    pub(super) model: Yolo,
    pub(super) opt: Optimization,
    pub(super) loss: DetectionLoss,
    pub(super) transfer: DeviceTransfer,
    /// Steps take the dense (device) loss path ([`sluice_infer::loss_path`]).
    pub(super) dense_loss: bool,
    /// Asynchronous reads of the device path's loss items.
    pub(super) readback: Readback,
    /// The values of the last readback taken.
    pub(super) readback_buf: Vec<f32>,
    /// The device pool's growth, step by step across epochs (taken per epoch for the telemetry).
    pub(super) pool_growth: sluice_transfer::PoolGrowth,
    /// The loss scaler's skipped steps counted into earlier epochs' telemetry.
    pub(super) overflows_seen: u64,
    /// The latest loss items known on the host (device path: a batch or two old).
    pub(super) last_items: [f64; 3],
    pub(super) train: TrainLoader,
    pub(super) val: ValLoader,
    pub(super) progress: Progress,
    pub(super) stop: Arc<AtomicBool>,
    /// Non-finite steps in a row (the run stops at `max_nonfinite`).
    pub(super) consecutive_nonfinite: u32,
    /// What the set-up has to say (the AutoBatch choice, a setting that does not apply here), given to the
    /// observer when the run starts.
    pub(super) notes: Vec<Note>,
    /// The ranks of a data-parallel run (one rank otherwise).
    pub(super) dist: Dist,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer").field("run", &self.paths.dir).field("progress", &self.progress).finish()
    }
}

impl Trainer {
    /// Prepares a new run: indexes the data, builds loaders, model and optimizer, creates the run folder.
    pub fn new(cfg: TrainConfig) -> Result<Self> {
        Self::new_with(cfg, Dist::single(), &mut Quiet)
    }

    /// [`Trainer::new`] as one rank of a data-parallel run: every rank calls it with the same configuration;
    /// rank 0 names and creates the run folder. `observer` sees the set-up's long steps ([`Observer::setup`]).
    pub fn new_with(cfg: TrainConfig, dist: Dist, observer: &mut dyn Observer) -> Result<Self> {
        cfg.validate()?;
        let mut dir = RunPaths::fresh(&cfg).dir.into_os_string().into_encoded_bytes();
        dist.comm().broadcast_bytes(&mut dir, 0).context("sending the run folder's name from rank 0")?;
        // SAFETY: the bytes come from `OsString::into_encoded_bytes` on rank 0, a process of this same build.
        let dir = unsafe { std::ffi::OsString::from_encoded_bytes_unchecked(dir) };
        let t = Self::build(cfg, RunPaths::new(dir.into()), None, dist, observer)?;
        if t.dist.is_main() {
            t.paths.create()?;
            std::fs::write(t.paths.dir.join("args.yaml"), t.cfg.to_yaml()?)?;
        }
        Ok(t)
    }

    /// Continues the run whose checkpoint is `path` (see [`find_resume`](super::find_resume)).
    pub fn resume(path: &Path) -> Result<Self> {
        Self::resume_with(path, Dist::single(), &[], &mut Quiet)
    }

    /// [`Trainer::resume`] as one rank of a data-parallel run (every rank reads the same checkpoint), with the
    /// object-store client's settings ([`TrainConfig::store_settings`], which checkpoints never hold);
    /// `observer` sees the set-up's long steps ([`Observer::setup`]).
    pub fn resume_with(
        path: &Path,
        dist: Dist,
        store_settings: &[(String, String)],
        observer: &mut dyn Observer,
    ) -> Result<Self> {
        let meta = read_meta(path)?;
        let mut cfg = TrainConfig::from_yaml_str(&meta.config)?;
        cfg.store_settings = store_settings.to_vec();
        cfg.validate()?;
        let mut t = Self::build(cfg, RunPaths::new(meta.run_dir.clone()), Some(path), dist, observer)?;
        if t.dist.is_main() {
            t.paths.create()?;
        }
        t.opt.load_state(&mut t.model, path).with_context(|| format!("restoring {}", path.display()))?;
        if !t.dist.is_main() {
            t.opt.drop_pending();
        }
        t.overflows_seen = t.opt.loss_scale()?.map_or(0, |s| s.overflows);
        t.progress = meta.progress;
        if t.progress.epoch >= t.cfg.epochs {
            crate::bail!("{}: the run already finished its {} epochs; nothing to resume", path.display(), t.cfg.epochs);
        }
        Ok(t)
    }

    /// A run from `cfg`: a new one (initial weights from `cfg.weights`), or, with `resume_from`, the model shaped
    /// for that checkpoint (its weights are loaded by the caller).
    fn build(
        cfg: TrainConfig,
        paths: RunPaths,
        resume_from: Option<&Path>,
        dist: Dist,
        observer: &mut dyn Observer,
    ) -> Result<Self> {
        let mut report = Report { notes: Vec::new(), observer };
        let (mut train_split, mut val_split) = splits(&cfg, &dist, &mut report)?;
        let val_left_out = val_split.left_out();
        let train_index = std::mem::take(&mut train_split.indexed.index);
        let val_index = std::mem::take(&mut val_split.indexed.index);
        let (data, nc) = (&train_split.config, train_split.config.nc());
        let device = match dist.device() {
            Some(d) => d.clone(),
            None => device_of(&rank_device(&cfg.device, dist.launch().local_rank)?)?,
        };
        let mut cfg = cfg;
        let lcfg = loader_config(&mut cfg, &dist, nc, &device, train_index.len(), &mut report.notes)?;
        let (rank, world) = (dist.rank(), dist.world());
        let train = TrainLoader::new(
            node_source(&dist, &train_split.source, train_index, true, &cfg, &mut report)?,
            lcfg,
            cfg.hyp,
        )?
        .shard(rank, world)?;
        let val_index = val_index.subset(cfg.val_fraction, cfg.seed);
        // Ultralytics validates with twice the (per-rank) training batch, at `imgsz` (multi-scale is for training
        // only). Each rank validates a contiguous share of the rect plan's batches.
        let vcfg = LoaderConfig { batch: lcfg.batch * 2, multi_scale: 0.0, ..lcfg };
        let val = ValLoader::new(node_source(&dist, &val_split.source, val_index, false, &cfg, &mut report)?, vcfg)
            .with_left_out(val_left_out);
        let share = sluice_dist::contiguous_share(val.len(), rank, world);
        let val = val.with_batches(share);
        let (model, half) = model(&cfg, resume_from, nc, &device, &dist, &mut report.notes)?;
        let shape = RunShape {
            batch: cfg.batch,
            epochs: cfg.epochs as usize,
            batches_per_epoch: train.len(),
            train_images: train.source().index().len(),
        };
        // The device paths no device run has passed yet are opt-in (`DevicePaths`); by default a GPU takes the
        // composed optimizer step and cuDNN's heuristic algorithm choice. Off the CPU, clipping and the non-finite
        // skip stay on the device (no read per step), fused on request. Float16 needs loss scaling; bfloat16 not.
        let opt_in = cfg.device_paths;
        sluice_kernels::conv::search::set_algorithm_search(opt_in.cudnn_search.kernels(), cfg.deterministic);
        sluice_kernels::pool::set_fused_pool(device.is_cuda() && opt_in.fused_pool);
        if !opt_in.enabled().is_empty() && device.is_cuda() {
            let line =
                format!("device paths not yet verified on a device, on by request: {}", opt_in.enabled().join(", "));
            report.notes.push(Note::Info(line));
        }
        let path = match (dense_on(&device, cfg.dense_loss), device.is_cuda() && opt_in.fused_step) {
            (false, _) => StepPath::Host,
            (true, false) => StepPath::Device,
            (true, true) => StepPath::DeviceFused,
        };
        let loss_scaling = (half == Some(DType::F16)).then(ScalerSettings::default);
        // On a GPU each parameter group's update is then a few kernels over one buffer instead of a dozen per
        // parameter; the CPU gains nothing from it (its update is one parallel pass per tensor either way) and would
        // pay the gradients' concatenation.
        let model = if device.is_cuda() { Optimization::pack_model(model, &cfg.optim, shape)? } else { model };
        let mut opt = Optimization::with_step(&model, &cfg.optim, shape, StepOptions { path, loss_scaling })?;
        if dist.is_distributed() {
            opt.set_grad_reduce(dist.grad_reduce());
        }
        let mut loss = DetectionLoss::new(nc);
        loss.gains = cfg.loss_gains();
        loss.assigner.fused_ciou = device.is_cuda() && opt_in.fused_ciou;
        loss.fused_bce = device.is_cuda() && opt_in.fused_bce;
        Ok(Self {
            names: data.names.clone(),
            dense_loss: dense_on(&device, cfg.dense_loss) && !model.config().family.end2end(),
            readback: Readback::new(&device).context("loss readback")?,
            readback_buf: Vec::new(),
            pool_growth: sluice_transfer::PoolGrowth::new(),
            overflows_seen: 0,
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
            consecutive_nonfinite: 0,
            notes: report.notes,
            dist,
        })
    }

    /// The ranks of the run.
    pub fn dist(&self) -> &Dist {
        &self.dist
    }

    /// The ranks of the run, the trainer done with (to end their connections in order).
    pub fn into_dist(self) -> Dist {
        self.dist
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

    /// Writes a checkpoint. Every rank calls it at the same point (the open accumulation window is summed over
    /// the ranks); rank 0 writes it (the ranks hold the same weights).
    pub(super) fn save(&mut self, path: &Path) -> Result<()> {
        let meta = CheckpointMeta {
            config: self.cfg.to_yaml()?,
            run_dir: self.paths.dir.clone(),
            progress: self.progress.clone(),
        };
        let write = self.dist.is_main();
        self.opt
            .save_state_collective(&self.model, path, &serde_json::to_value(&meta)?, write)
            .with_context(|| format!("saving {}", path.display()))
    }

    /// Ultralytics' `final_eval`: validates `best` once more after the last epoch and reports it to the observer
    /// (per class; with `plots` on, with the first validation batch and its detections for the plots). Nothing to
    /// do when no validation ever wrote `best`.
    fn final_eval(&self, observer: &mut dyn Observer) -> Result<()> {
        let best = &self.paths.best;
        // Rank 0 wrote `best` and reads it; the other ranks take its weights from rank 0 (their machines may not
        // share its file system), into a copy of their EMA, which has the same layers and names.
        let main = self.dist.is_main();
        if !self.dist.any(main && best.exists())? {
            return Ok(());
        }
        let model = if main {
            load_model(best, None, self.loss.nc, self.model.device())?
        } else {
            self.opt.ema_model().try_clone()?
        };
        self.dist.broadcast_vars(&crate::dist::all_vars(&model)).context("sending `best` from rank 0")?;
        let opts = ValOptions {
            keep_first_batch: self.cfg.plots,
            end2end: self.cfg.nms == Some(false),
            ..ValOptions::default()
        };
        let opts = self.cfg.val_options(opts);
        let v = validate_on(&model, &self.val, &self.loss, &self.transfer, opts, &self.dist)?;
        observer.final_eval(&FinalEvalEvent {
            weights: best,
            epoch: self.progress.best_epoch,
            result: &v,
            names: &self.names,
            run_dir: &self.paths.dir,
        });
        Ok(())
    }

    /// Runs the remaining epochs: each is trained (`Trainer::train_epoch`) then ended (`Trainer::end_epoch`);
    /// a stop request (Ctrl-C) saves `last` and returns, and a finished run ends with the final validation.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<TrainSummary> {
        for note in std::mem::take(&mut self.notes) {
            match note {
                Note::Info(m) => observer.info(&m),
                Note::Warn(m) => observer.warn(&m),
            }
        }
        let start = Instant::now();
        let l1 = self.model.config().family.reg_max() == 1;
        let main = self.dist.is_main();
        let results = if main {
            Some(ResultsCsv::open_named(&self.paths.results, self.progress.epoch, l1, self.opt.lrs().len())?)
        } else {
            None
        };
        let telemetry = main.then(|| JsonLines::new(&self.paths.telemetry));
        let mut totals = RunTotals::default();
        let mut interrupted = false;
        while self.progress.epoch < self.cfg.epochs {
            let pass = self.train_epoch(observer)?;
            if pass.interrupted {
                self.progress.elapsed_s += start.elapsed().as_secs_f64();
                let last = self.paths.last.clone();
                self.save(&last)?;
                interrupted = true;
                break;
            }
            self.end_epoch(pass, start, (results.as_ref(), telemetry.as_ref()), &mut totals, observer)?;
            // A data-parallel run goes on into the next epoch while an accumulation window is open (see
            // `train_epoch`), so that every rank's gradients are in the step before it stops.
            let stop = self.dist.any(self.stop.load(Ordering::Relaxed))?;
            let window_open = self.dist.is_distributed() && self.opt.window_open();
            if stop && self.progress.epoch < self.cfg.epochs && !window_open {
                interrupted = true;
                break;
            }
        }
        if !interrupted && self.progress.epoch >= self.cfg.epochs {
            self.final_eval(observer)?;
        }
        let summary = self.summary(start, &totals, interrupted);
        if main {
            std::fs::write(&self.paths.summary, serde_json::to_string_pretty(&summary)?)?;
        }
        observer.finished(&summary);
        Ok(summary)
    }

    fn summary(&self, start: Instant, totals: &RunTotals, interrupted: bool) -> TrainSummary {
        TrainSummary {
            run_dir: self.paths.dir.clone(),
            epochs: self.progress.epoch,
            interrupted,
            final_metrics: self.progress.last_metrics,
            best_metrics: self.progress.best_metrics,
            best_epoch: self.progress.best_epoch,
            wall_s: start.elapsed().as_secs_f64(),
            train_s: totals.train_s,
            mean_images_per_s: totals.images as f64 / totals.train_s.max(1e-9),
            mean_data_wait_fraction: totals.wait_s / totals.train_s.max(1e-9),
            bottleneck: most_frequent(&totals.bottlenecks),
            nonfinite_steps: self.progress.nonfinite_steps,
            skipped_samples: self.train.skips().skipped,
            last: self.paths.last.clone(),
            best: self.paths.best.clone(),
        }
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
    fn most_frequent_stage() {
        let v: Vec<String> = ["model", "decode", "model"].iter().map(|s| s.to_string()).collect();
        assert_eq!(most_frequent(&v), "model");
        assert_eq!(most_frequent(&[]), "");
    }
}
