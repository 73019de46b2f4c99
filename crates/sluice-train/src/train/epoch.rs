//! The phases of an epoch: `Trainer::train_epoch` runs the batches (data → transfer → train-mode forward → loss
//! → backward/accumulate/step/EMA, one `Trainer::step` each), and `Trainer::end_epoch` validates with the EMA
//! weights, appends to `results.csv` and `telemetry.jsonl`, and writes the checkpoints atomically (`best`, then
//! `last`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_core::{Batch, PipelineReport, Transfer};
use sluice_kernels::threads::on_compute_pool;
use sluice_loader::SourceStats;
use sluice_model::Mode;

use super::events::{BatchEvent, EpochEvent, FirstBatchEvent, Observer};
use super::results::{EpochRow, JsonLines, ResultsCsv};
use super::run::Trainer;
use super::state::Metrics;
use super::telemetry::{
    CacheTelemetry, EpochTelemetry, LoopTimes, LossScaleTelemetry, PoolTelemetry, StepSpread, SyncTelemetry,
    ValTelemetry,
};
use crate::error::{Context, Result};
use sluice_infer::loss_path::{Items, step_loss};
use sluice_infer::{ValOptions, validate_on};

/// What [`Trainer::train_epoch`] hands to [`Trainer::end_epoch`].
#[derive(Debug)]
pub(super) struct EpochPass {
    /// The 0-based epoch.
    epoch: u32,
    /// Loop-side timings.
    times: LoopTimes,
    /// The loader pipeline's report.
    loader: PipelineReport,
    /// The decoded-image source's counters at the start of the epoch.
    source_before: SourceStats,
    /// Samples skipped before this epoch.
    skipped_before: u64,
    /// Non-finite steps of this epoch.
    nonfinite: u64,
    /// Float16 loss scaling: the scale at the end of the epoch and the steps it skipped in the epoch.
    loss_scale: Option<(f32, u64)>,
    /// Batches done in this epoch (those before a resume included).
    done: usize,
    /// The most device memory in use after any step.
    memory_peak: Option<u64>,
    /// The end of each batch (and the epoch's start first): the step intervals of the telemetry.
    batch_ends: Vec<Instant>,
    /// The blocking-read counters at the start of the epoch.
    syncs_before: sluice_core::syncs::Counts,
    /// Whether a stop request ended the epoch early.
    pub(super) interrupted: bool,
}

/// Figures summed over the epochs of one invocation, for the summary.
#[derive(Debug, Default)]
pub(super) struct RunTotals {
    pub(super) train_s: f64,
    pub(super) images: u64,
    pub(super) wait_s: f64,
    pub(super) bottlenecks: Vec<String>,
}

/// What one [`Trainer::step`] did.
struct Stepped {
    /// The batch's loss items (device path: the latest that landed).
    items: [f64; 3],
    /// Whether the optimizer skipped the step for a non-finite value.
    skipped: bool,
}

impl Trainer {
    /// Trains the rest of the current epoch, from batch `progress.batch`.
    pub(super) fn train_epoch(&mut self, observer: &mut dyn Observer) -> Result<EpochPass> {
        let epoch = self.progress.epoch;
        // The end-to-end loss's one-to-many weight for this epoch (Ultralytics updates it after every epoch).
        self.loss.set_epoch(epoch as usize, self.cfg.epochs as usize);
        let batches = self.train.len();
        let mut pass = EpochPass {
            epoch,
            times: LoopTimes::default(),
            loader: PipelineReport::default(),
            source_before: self.train.source().stats(),
            skipped_before: self.train.skips().skipped,
            nonfinite: 0,
            loss_scale: None,
            done: self.progress.batch,
            memory_peak: None,
            batch_ends: Vec::with_capacity(batches + 1),
            syncs_before: sluice_core::syncs::snapshot(),
            interrupted: false,
        };
        let t_epoch = Instant::now();
        pass.batch_ends.push(t_epoch);
        let mut iter = self.train.epoch_from(epoch, self.cfg.epochs, pass.done);
        let mut t_wait = Instant::now();
        for batch in iter.by_ref() {
            let batch = batch.with_context(|| format!("epoch {}: loading a batch", epoch + 1))?;
            self.dist.check().with_context(|| format!("epoch {} batch {}", epoch + 1, pass.done))?;
            pass.times.data_wait_s += t_wait.elapsed().as_secs_f64();
            if self.cfg.plots && self.progress.iteration == 0 {
                observer.first_batch(&FirstBatchEvent { batch: &batch, names: &self.names, run_dir: &self.paths.dir });
            }
            let k = pass.done;
            let stepped = self.step(&batch, &mut pass)?;
            pass.batch_ends.push(Instant::now());
            if stepped.skipped {
                pass.nonfinite += 1;
                self.nonfinite_step(epoch, k, stepped.items, observer)?;
            } else {
                self.consecutive_nonfinite = 0;
                if !self.dense_loss {
                    for (s, v) in self.progress.epoch_loss_sum.iter_mut().zip(stepped.items) {
                        *s += v;
                    }
                }
            }
            // Device items still in flight are not in the sums yet.
            let in_flight = self.readback.pending() as u64;
            let counted = (pass.done as u64).saturating_sub(pass.nonfinite + in_flight).max(1) as f64;
            let wall = t_epoch.elapsed().as_secs_f64().max(1e-9);
            observer.batch(&BatchEvent {
                epoch,
                batch: k,
                batches,
                side: batch.shape().width,
                iteration: self.progress.iteration,
                loss: stepped.items,
                mean_loss: self.progress.epoch_loss_sum.map(|s| s / counted),
                images_per_s: pass.times.images as f64 / wall,
                data_wait_fraction: pass.times.data_wait_s / wall,
                skipped: stepped.skipped,
            });
            // The ranks of a data-parallel run stop at the same batch, or their collectives would no longer pair,
            // and where no accumulation window is open (each rank's own gradients would not survive a resume).
            let stop = self.dist.any(self.stop.load(Ordering::Relaxed))?;
            if stop && pass.done < batches && !(self.dist.is_distributed() && self.opt.window_open()) {
                pass.interrupted = true;
                break;
            }
            t_wait = Instant::now();
        }
        // The epoch's last device items (one wait at the end of the epoch, not per batch), and the optimizer
        // steps the device skipped for a non-finite gradient norm.
        self.take_landed_items(true)?;
        let device_skips = self.opt.take_device_skips()?;
        if device_skips > 0 {
            pass.nonfinite += device_skips;
            self.progress.nonfinite_steps += device_skips;
            observer.warn(&format!(
                "epoch {}: {device_skips} optimizer steps skipped on the device for a non-finite gradient norm",
                epoch + 1
            ));
        }
        // The loss scale: one read per epoch where it lives on the device.
        if let Some(s) = self.opt.loss_scale()? {
            pass.loss_scale = Some((s.scale, s.overflows.saturating_sub(self.overflows_seen)));
            self.overflows_seen = s.overflows;
        }
        pass.times.wall_s = t_epoch.elapsed().as_secs_f64();
        pass.loader = iter.report();
        Ok(pass)
    }

    /// One batch: transfer, forward + loss, backward + optimizer step; advances the loop's position.
    fn step(&mut self, batch: &Batch, pass: &mut EpochPass) -> Result<Stepped> {
        let t = Instant::now();
        let x = self.transfer.transfer(batch).context("transfer")?;
        pass.times.transfer_s += t.elapsed().as_secs_f64();
        let t = Instant::now();
        // The forward + loss, and below the backward + update, each on a worker of the compute pool
        // (`sluice_kernels::threads::on_compute_pool`).
        let (model, loss, dense) = (&self.model, &self.loss, self.dense_loss);
        let out = on_compute_pool(model.device(), || -> Result<_> {
            let (raw, _) = model.forward_raw(&x.images, Mode::Train)?;
            Ok(step_loss(loss, &raw, batch, &x, dense)?)
        })?;
        let (ni, ep) = (self.progress.iteration as usize, pass.epoch as usize);
        // The CPU path reads its items now (they are logged, and they tell a non-finite loss). The device path
        // queues them for an asynchronous read, shows the latest that has landed, and leaves the non-finite check
        // to the gradient norm at the optimizer step (a non-finite batch then drops its accumulation window), so
        // no read waits on the device.
        let (items, mut finite) = match &out.items {
            Items::Host(v) => (*v, v.iter().all(|v| v.is_finite())),
            Items::Device(t) => {
                if self.readback.submit(ni as u64, t, &mut self.readback_buf)?.is_some() {
                    self.landed_items();
                }
                self.take_landed_items(false)?;
                (self.last_items, true)
            }
        };
        // Ranks must take the same path through the optimizer (their gradient sums pair up): a non-finite loss
        // on one rank makes the summed gradient norm non-finite on all, and every rank skips that step there.
        finite |= self.dist.is_distributed();
        let (opt, model) = (&mut self.opt, &self.model);
        let step = on_compute_pool(model.device(), || opt.batch_known_finite(model, &out.total, finite, ni, ep))?;
        pass.times.model_s += t.elapsed().as_secs_f64();
        if let Some(m) = sluice_transfer::device_memory_in_use(self.transfer.device()) {
            pass.memory_peak = Some(pass.memory_peak.map_or(m, |p| p.max(m)));
        }
        self.pool_growth.observe(sluice_transfer::device_pool_reserved(self.transfer.device()));
        // Every rank trains a batch of this size at this step: the run's images, not this rank's.
        pass.times.images += (batch.len() * self.dist.world()) as u64;
        pass.times.batches += 1;
        pass.done += 1;
        self.progress.iteration += 1;
        self.progress.batch = pass.done;
        Ok(Stepped { items, skipped: step.skipped_nonfinite })
    }

    /// Counts a skipped non-finite step, warns, and stops the run after `max_nonfinite` in a row.
    fn nonfinite_step(&mut self, epoch: u32, k: usize, items: [f64; 3], observer: &mut dyn Observer) -> Result<()> {
        self.consecutive_nonfinite += 1;
        self.progress.nonfinite_steps += 1;
        observer.warn(&format!("epoch {} batch {k}: non-finite loss or gradient ({items:?}); step skipped", epoch + 1));
        if self.consecutive_nonfinite >= self.cfg.max_nonfinite {
            crate::bail!(
                "{} consecutive non-finite steps (epoch {} batch {k}); stopping. The last good checkpoint is {} (try \
                 a lower lr0 or check the labels)",
                self.consecutive_nonfinite,
                epoch + 1,
                self.paths.last.display()
            );
        }
        Ok(())
    }

    /// Ends a trained epoch: the optimizer's end-of-epoch update, telemetry, validation (when due), the results
    /// row, the checkpoints (`best` before `last`: a kill between the two leaves the previous `last`, never a torn
    /// file), then the observer's epoch event.
    pub(super) fn end_epoch(
        &mut self,
        pass: EpochPass,
        start: Instant,
        (results, telemetry): (Option<&ResultsCsv>, Option<&JsonLines>),
        totals: &mut RunTotals,
        observer: &mut dyn Observer,
    ) -> Result<()> {
        let epoch = pass.epoch;
        let mean_loss = self.progress.epoch_loss_sum.map(|s| s / (pass.done.max(1) as f64));
        self.opt.end_epoch(epoch as usize)?;
        let mut tel = self.epoch_telemetry(&pass);
        if tel.skipped_samples > 0 {
            let first = self.train.skips().first;
            observer.warn(&format!(
                "epoch {}: {} bad samples skipped (first: {})",
                epoch + 1,
                tel.skipped_samples,
                first.first().map(String::as_str).unwrap_or("?")
            ));
        }
        let best = if self.cfg.validates(epoch) { self.validate_epoch(epoch, &mut tel, observer)? } else { false };
        let m = self.progress.last_metrics;
        let row = EpochRow {
            epoch: epoch + 1,
            time: self.progress.elapsed_s + start.elapsed().as_secs_f64(),
            train_loss: mean_loss,
            metrics: [m.precision, m.recall, m.map50, m.map50_95],
            val_loss: self.progress.last_val_loss,
            lr: self.opt.lrs(),
            val_skipped: m.skipped,
        };
        if let Some(results) = results {
            results.append(&row)?;
        }
        if let Some(telemetry) = telemetry {
            telemetry.append(&tel)?;
        }
        totals.train_s += pass.times.wall_s;
        totals.images += pass.times.images;
        totals.wait_s += pass.times.data_wait_s;
        totals.bottlenecks.push(tel.shares.bottleneck.clone());
        self.progress.epoch += 1;
        self.progress.batch = 0;
        self.progress.epoch_loss_sum = [0.0; 3];
        if best {
            let best = self.paths.best.clone();
            self.save(&best)?;
        }
        let last = self.paths.last.clone();
        self.save(&last)?;
        observer.epoch(&EpochEvent { row, telemetry: tel, best });
        Ok(())
    }

    /// The epoch's telemetry from its pass (no validation yet).
    fn epoch_telemetry(&mut self, pass: &EpochPass) -> EpochTelemetry {
        let src = self.train.source().stats();
        let (read_s, decode_s) = (src.read_s - pass.source_before.read_s, src.decode_s - pass.source_before.decode_s);
        let mut tel = EpochTelemetry::new(pass.epoch + 1, pass.times, &pass.loader, read_s, decode_s);
        tel.blocking_syncs = SyncTelemetry::since(&pass.syncs_before, pass.times.batches);
        tel.device_memory_peak_bytes = pass.memory_peak;
        let pool = self.pool_growth.take();
        tel.device_pool = (pool.steps > 0).then(|| PoolTelemetry::from(pool));
        tel.nonfinite_steps = pass.nonfinite;
        tel.step_interval_ms = StepSpread::of(&pass.batch_ends);
        tel.loss_scale = pass.loss_scale.map(|(scale, overflow_steps)| LossScaleTelemetry { scale, overflow_steps });
        tel.skipped_samples = self.train.skips().skipped - pass.skipped_before;
        tel.cache = CacheTelemetry::since(&pass.source_before, &src);
        tel
    }

    /// Validates the EMA weights, records the pass in `tel` and the metrics in the progress; whether this epoch
    /// is the best so far.
    fn validate_epoch(&mut self, epoch: u32, tel: &mut EpochTelemetry, observer: &mut dyn Observer) -> Result<bool> {
        let syncs0 = sluice_core::syncs::snapshot();
        let opts = self.cfg.val_options(ValOptions::default());
        // Rank 0's EMA is the model that is saved; its BatchNorm statistics are its own, so the other ranks take
        // it before validating their shares.
        self.dist.broadcast_vars(&crate::dist::all_vars(self.opt.ema_model())).context("sending rank 0's EMA")?;
        let v = validate_on(self.opt.ema_model(), &self.val, &self.loss, &self.transfer, opts, &self.dist)?;
        tel.val_s = v.seconds;
        let mut vt = ValTelemetry::new(v.images, v.seconds, v.data_wait_s, v.model_s, &v.stats).with_gpu(v.gpu_s);
        vt.nms = v.nms;
        vt.blocking_syncs = SyncTelemetry::since(&syncs0, v.batches);
        tel.val = Some(vt);
        if let Some(line) = v.skipped.line(&format!("epoch {} validation", epoch + 1)) {
            observer.warn(&line);
        }
        let m = Metrics::of(&v);
        self.progress.last_metrics = m;
        self.progress.last_val_loss = v.loss;
        // Ultralytics' rule (`if not self.best_fitness or self.best_fitness < fitness`): a best fitness of 0 counts
        // as none, so while mAP50-95 stays 0 every epoch becomes the new best and `best` follows `last`.
        let best = self.progress.best_fitness.is_none_or(|b| b == 0.0 || m.fitness > b);
        if best {
            self.progress.best_fitness = Some(m.fitness);
            self.progress.best_epoch = epoch + 1;
            self.progress.best_metrics = m;
        }
        Ok(best)
    }

    /// Takes the device path's loss items that have landed (all of them, waiting, with `block`) into the epoch's
    /// sums and [`Trainer::last_items`].
    pub(super) fn take_landed_items(&mut self, block: bool) -> Result<()> {
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
    pub(super) fn landed_items(&mut self) {
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
}
