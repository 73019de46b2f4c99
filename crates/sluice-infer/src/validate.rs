//! One validation pass: the val loader's rect batches through the (EMA) model's eval forward and the validation
//! loss on the raw head outputs on this thread, while NMS with Ultralytics' validator settings (conf 0.001, IoU
//! 0.7, multi-label, 300 detections) and Ultralytics' matching run on the streaming validator's workers
//! (`sluice_eval::stream`); mAP is computed once at the end.
//!
//! Predictions and ground truth are compared in the letterboxed canvas: the letterbox is a uniform scale plus a
//! shift, so IoUs — and therefore the metrics — equal those computed in original image pixels.
//!
//! With [`ValOptions::keep_first_batch`] the pass also returns the first batch with its detections
//! ([`FirstBatch`], for `val_batch0_labels.jpg` / `val_batch0_pred.jpg`): the batch's pixels and targets are
//! copied on this thread (one host `memcpy`, no device read), and its detections come back from the worker that
//! post-processed it through [`sluice_eval::StreamReport::kept`], so the inference loop gains no wait.

use std::collections::VecDeque;
use std::time::Instant;

use crate::error::{InferError, Result, ctx};
use sluice_core::{Batch, Detection, MergeMetric, SampleId, Target, Transfer};
use sluice_eval::masknms::nms_tensor;
use sluice_eval::{
    ApReport, Layout, Nms, NmsMode, NmsParams, Packed, ShrinkParams, StreamConfig, StreamStats, StreamingValidator,
    UltralyticsMetric, ValOutput, ValPost, shrink,
};
use sluice_kernels::threads::on_compute_pool;
use sluice_model::candle_core::DType;
use sluice_model::{DetectionLoss, Yolo};
use sluice_transfer::{DeviceTransfer, Readback};

use crate::loss_path::{Items, StepLoss, dense_on, step_loss};

use sluice_loader::{SkipReport, ValLoader};

/// What a validation pass should keep besides the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ValOptions {
    /// Return the first batch and its NMS detections ([`ValResult::first_batch`]).
    pub keep_first_batch: bool,
    /// Validate an end-to-end model (YOLO26) on its one-to-one head's top-k output with no NMS (Ultralytics'
    /// `nms=False`); a model without that head is validated with NMS, as Ultralytics falls back.
    pub end2end: bool,
    /// Run NMS where the predictions are (`sluice_eval::masknms::nms_tensor`: the kernels on a CUDA device, their
    /// host twin on the CPU) and copy only the kept rows, instead of shrinking the predictions and running NMS on
    /// the post-process workers. The two keep the same detections; on a GPU it is an opt-in device path
    /// ([`crate::DevicePaths::device_nms`]).
    pub device_nms: bool,
    /// Measure the GPU's busy share with CUDA events on the compute stream ([`ValResult::gpu_s`]); an opt-in
    /// device path ([`crate::DevicePaths::gpu_timer`]), nothing on the CPU.
    pub gpu_timer: bool,
    /// The device's loss path on the CPU too (the config's `dense_loss`).
    pub dense_loss: bool,
    /// Ultralytics' `half`: the fused model cast to float16 after folding ([`Yolo::fuse_to`]), the images cast
    /// on the device, the head's outputs back to f32 for the loss, NMS and the metrics. Honoured on any device;
    /// `sluice val` and `sluice predict` turn it on for CUDA devices only, as Ultralytics does.
    pub half: bool,
}

impl ValOptions {
    /// These options with the device paths of `paths` and the config's `dense_loss`.
    pub fn with_paths(self, paths: &crate::DevicePaths, dense_loss: bool) -> Self {
        Self { device_nms: paths.device_nms, gpu_timer: paths.gpu_timer, dense_loss, ..self }
    }
}

/// The other ranks of a data-parallel validation: each passes its share of the batches, then their metric states
/// are gathered and their losses and counts summed. [`Alone`] is a process validating by itself.
pub trait Ranks {
    /// Whether other ranks share the pass.
    fn is_distributed(&self) -> bool;
    /// Every rank's `mine`, in rank order (called by every rank at the same point).
    fn gather_bytes(&self, mine: &[u8]) -> std::result::Result<Vec<Vec<u8>>, BoxError>;
    /// `values` summed element-wise over the ranks, in place.
    fn sum_f64(&self, values: &mut [f64]) -> std::result::Result<(), BoxError>;
}

/// The error of a [`Ranks`] operation.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A process validating the whole split by itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Ranks for Alone {
    fn is_distributed(&self) -> bool {
        false
    }

    fn gather_bytes(&self, mine: &[u8]) -> std::result::Result<Vec<Vec<u8>>, BoxError> {
        Ok(vec![mine.to_vec()])
    }

    fn sum_f64(&self, _values: &mut [f64]) -> std::result::Result<(), BoxError> {
        Ok(())
    }
}

/// The first validation batch (letterboxed images and targets, as the model saw them) and the NMS output of each
/// of its images in the same canvas pixels.
#[derive(Debug, Clone)]
pub struct FirstBatch {
    /// A copy of the loader's batch.
    pub batch: Batch,
    /// Detections per filled slot (Ultralytics' validation NMS: conf 0.001, so filter before drawing).
    pub detections: Vec<Vec<Detection>>,
}

/// What a validation pass measured.
#[derive(Debug, Clone)]
pub struct ValResult {
    /// Ultralytics' metrics.
    pub report: ApReport,
    /// Mean validation losses (box, cls, dfl) per batch.
    pub loss: [f64; 3],
    /// Images validated.
    pub images: u64,
    /// Batches validated.
    pub batches: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Seconds the loop waited for the val loader's next batch.
    pub data_wait_s: f64,
    /// Seconds in transfer, the eval forward, the validation loss and the shrink step with its copy to the host.
    pub model_s: f64,
    /// Seconds of device time in the eval forward, the loss and the shrink or NMS, measured with CUDA events on
    /// the compute stream (`sluice_transfer::GpuTimer`) when [`ValOptions::gpu_timer`] asks; `None` otherwise. Over [`ValResult::seconds`] it is the
    /// share of the pass the GPU was busy with inference.
    pub gpu_s: Option<f64>,
    /// Post-process (NMS + matching) figures: worker busy time, time inference waited for it, which one bound.
    pub stats: StreamStats,
    /// Whether the pass ran NMS (false for an end-to-end head validated on its top-k output).
    pub nms: bool,
    /// The first batch with its detections, when [`ValOptions::keep_first_batch`] asked for it.
    pub first_batch: Option<FirstBatch>,
    /// Images of the split that could not be read or decoded (left out at indexing, or skipped by this pass): not
    /// validated, their boxes not counted, as Ultralytics leaves out a corrupt image; counted here with the first
    /// messages, each naming the file. With the loader's `strict` the pass fails on the first one instead.
    pub skipped: SkipReport,
}

impl ValResult {
    /// Ultralytics' validation table: a header, the `all` row (images, instances, P, R, mAP50, mAP50-95), then one
    /// row per class with instances; `names[i]` names class `i` (its number when missing).
    pub fn class_table(&self, names: &[String]) -> String {
        use std::fmt::Write as _;
        let r = &self.report;
        let instances: u64 = r.classes.iter().map(|c| c.num_gt).sum();
        let mut s = format!(
            "{:>20} {:>7} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95"
        );
        let _ = writeln!(
            s,
            "{:>20} {:>7} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            "all", self.images, instances, r.mp, r.mr, r.map50, r.map50_95
        );
        for c in &r.classes {
            let name = names.get(c.class as usize).cloned().unwrap_or_else(|| c.class.to_string());
            let _ = writeln!(
                s,
                "{:>20} {:>7} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                name,
                "",
                c.num_gt,
                c.p,
                c.r,
                c.ap50(),
                c.ap50_95()
            );
        }
        s
    }
}

/// The validator of a pass: its workers run [`ValPost`].
type Validator = StreamingValidator<ValPost, UltralyticsMetric>;

/// Validation batches whose shrunk outputs are being read back: their shapes, sample ids and targets in
/// submission order (the readback's order), with the vectors reused.
#[derive(Debug, Default)]
struct InFlight {
    queue: VecDeque<(Packed, Vec<SampleId>, Vec<Target>)>,
    spare: Vec<(Vec<SampleId>, Vec<Target>)>,
    /// The last readback taken.
    host: Vec<f32>,
}

impl InFlight {
    fn push(&mut self, dims: Packed, ids: &[SampleId], targets: &[Target]) {
        let (mut i, mut t) = self.spare.pop().unwrap_or_default();
        i.clear();
        i.extend_from_slice(ids);
        t.clear();
        t.extend_from_slice(targets);
        self.queue.push_back((dims, i, t));
    }

    /// Hands the oldest batch, whose readback is in `host`, to the validator.
    fn submit_oldest(&mut self, validator: &mut Validator) -> Result<()> {
        let (dims, ids, targets) = self
            .queue
            .pop_front()
            .ok_or_else(|| InferError::Msg("validation: a readback landed for no batch in flight".into()))?;
        validator.submit_output(&self.host, dims, &ids, &targets)?;
        self.spare.push((ids, targets));
        Ok(())
    }
}

/// Every rank's metric state merged (in rank order; the merge does not depend on it), or `mine` alone.
fn gather_metric(mine: UltralyticsMetric, dist: &dyn Ranks) -> sluice_eval::Result<UltralyticsMetric> {
    if !dist.is_distributed() {
        return Ok(mine);
    }
    let fail = |what: &str, e: &dyn std::fmt::Display| sluice_eval::Error::Stream(format!("{what}: {e}"));
    let bytes = mine.to_bytes()?;
    let parts = dist.gather_bytes(&bytes).map_err(|e| fail("gathering the ranks' metric states", &e))?;
    let mut merged: Option<UltralyticsMetric> = None;
    for (rank, part) in parts.iter().enumerate() {
        let m = UltralyticsMetric::from_bytes(part, &format!("rank {rank}'s metric state"))?;
        match merged.as_mut() {
            None => merged = Some(m),
            Some(all) => all.merge(m).map_err(|e| fail(&format!("merging rank {rank}'s metric state"), &e))?,
        }
    }
    merged.ok_or_else(|| sluice_eval::Error::Stream("no rank sent its metric state".into()))
}

/// The model a pass runs when it is not `model` itself: the weights are fixed for the pass, so each Conv's BatchNorm
/// is folded once here, not in every batch's forward (the eval-mode forward folds on the fly with the same
/// `BatchNorm::fold`, so the outputs are the same bits); `half` folds in f32 and casts. Under autocast the model
/// keeps its own half-precision path, which the folded copy does not take.
fn folded_for_pass(model: &Yolo, half: bool) -> Result<Option<Yolo>> {
    if half {
        if model.is_fused() {
            return Err(InferError::Msg("validation in half precision takes the unfused model, to fold in f32".into()));
        }
        return Ok(Some(model.fuse_to(DType::F16).map_err(ctx("validation: the half-precision copy"))?));
    }
    if model.is_fused() || model.autocast().is_some() {
        return Ok(None);
    }
    Ok(Some(model.fuse().map_err(ctx("validation: folding BatchNorm into the convs"))?))
}

/// The pass's validator (NMS on its workers, or the rows NMS on the device kept) and its NMS settings:
/// Ultralytics' validation settings, no suppression for an end-to-end head's top-k rows.
fn validator_for(nc: usize, opts: ValOptions, end2end: bool) -> Result<(Validator, NmsParams)> {
    let nc = u32::try_from(nc).map_err(ctx("class count"))?;
    let nms = if end2end {
        NmsParams { mode: NmsMode::None, ..NmsParams::ultralytics_val() }
    } else {
        NmsParams::ultralytics_val()
    };
    let post =
        if opts.device_nms { ValPost::Kept { conf: nms.conf_thres as f32 } } else { ValPost::Nms(Nms::new(nms)) };
    let cfg =
        StreamConfig { workers: 2, keep_batches: usize::from(opts.keep_first_batch), nms, ..StreamConfig::new(nc) };
    Ok((StreamingValidator::with_stages(cfg, post, || UltralyticsMetric::new(nc))?, nms))
}

/// A pass's loss items: host items summed as they come, device items summed on the device and read once at the end.
#[derive(Debug, Default)]
struct LossSums {
    host: [f64; 3],
    device: Option<sluice_model::candle_core::Tensor>,
}

impl LossSums {
    fn add(&mut self, items: Items) -> Result<()> {
        match items {
            Items::Host(v) => self.host.iter_mut().zip(v).for_each(|(s, v)| *s += v),
            Items::Device(t) => {
                self.device = Some(match self.device.take() {
                    None => t,
                    Some(s) => (s + t)?,
                })
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<[f64; 3]> {
        if let Some(t) = self.device.take() {
            let v = Items::Device(t).read()?;
            self.host.iter_mut().zip(v).for_each(|(s, v)| *s += v);
        }
        Ok(self.host)
    }
}

/// The first batch with the detections the validator kept for it, checked to be the same samples.
fn first_batch(first: Option<Batch>, kept: Option<sluice_eval::KeptBatch>) -> Result<Option<FirstBatch>> {
    let (Some(batch), Some(kept)) = (first, kept) else { return Ok(None) };
    if kept.ids != batch.sample_ids {
        return Err(InferError::Msg(format!(
            "validation: the kept detections are of samples {:?}, the first batch holds {:?}",
            kept.ids, batch.sample_ids
        )));
    }
    Ok(Some(FirstBatch { batch, detections: kept.detections }))
}

/// How one validation batch runs on the device.
#[derive(Debug, Clone, Copy)]
pub struct BatchWork {
    /// NMS on the device ([`ValOptions::device_nms`]).
    pub device_nms: bool,
    /// The model is a half-precision copy ([`ValOptions::half`]).
    pub half: bool,
    /// The end-to-end head's top-k output, no NMS ([`ValOptions::end2end`]).
    pub end2end: bool,
    /// The dense (device) loss path ([`crate::loss_path::dense_on`]).
    pub dense: bool,
}

/// One validation batch's device work: the forward, the loss and the shrink (or NMS) of the predictions, all on
/// the model's device; nothing is read back here.
pub fn batch_on_device(
    model: &Yolo,
    loss: &DetectionLoss,
    batch: &Batch,
    x: &sluice_transfer::DeviceBatch,
    work: BatchWork,
    nms: &NmsParams,
    shrink_params: &ShrinkParams,
) -> Result<(StepLoss, ValOutput)> {
    // The images in the model's dtype (a cast on the device for a half-precision copy).
    let images = x.images.to_dtype(model.dtype())?;
    let mut out = model.forward(&images)?;
    // An end-to-end head's validation loss is Ultralytics' E2ELoss, whose items come from the one-to-one
    // branches (the metrics use the one-to-many output, as Ultralytics' default `nms` does).
    out.raw.one2one = model.forward_one2one(&out.feats, sluice_model::Mode::Eval)?.map(Box::new);
    // The head's outputs back in f32.
    let raw = if work.half { out.raw.to_dtype(DType::F32)? } else { out.raw };
    let l = step_loss(loss, &raw, batch, x, work.dense)?;
    // An end-to-end pass takes the one-to-one head's top 300 rows (one per object), laid out as the eval
    // output, which the post-process passes through with no suppression.
    let y = if work.end2end { model.forward_end2end_decoded(&images, 300)? } else { out.y };
    let y = y.to_dtype(DType::F32)?;
    // Only the anchors above the validation conf cross to the host (the whole head output stays put), or,
    // with NMS on the device, only the rows it keeps.
    let out = if work.device_nms {
        ValOutput::Kept(nms_tensor(&y, Layout::ChannelsFirst, nms)?)
    } else {
        ValOutput::Shrunk(shrink(&y, shrink_params)?)
    };
    Ok((l, out))
}

/// Validates `model` over one pass of `loader`: inference on this thread, NMS and matching on `workers`
/// post-process threads fed through a bounded queue, so the two overlap.
pub fn validate(
    model: &Yolo,
    loader: &ValLoader,
    loss: &DetectionLoss,
    transfer: &DeviceTransfer,
    opts: ValOptions,
) -> Result<ValResult> {
    validate_on(model, loader, loss, transfer, opts, &Alone)
}

/// [`validate`] as one rank of a data-parallel run: each rank passes its share of the batches
/// ([`ValLoader::with_batches`]), then the ranks' metric states are gathered and merged (the report covers the
/// whole split, identical to one process validating it with the same batches), and the losses and counts summed.
/// Timings and the post-process figures stay this rank's.
pub fn validate_on(
    model: &Yolo,
    loader: &ValLoader,
    loss: &DetectionLoss,
    transfer: &DeviceTransfer,
    opts: ValOptions,
    dist: &dyn Ranks,
) -> Result<ValResult> {
    let start = Instant::now();
    let folded = folded_for_pass(model, opts.half)?;
    let model = folded.as_ref().unwrap_or(model);
    let end2end = opts.end2end && model.config().family.end2end();
    let (mut validator, nms) = validator_for(loss.nc, opts, end2end)?;
    let (mut batches, mut images) = (0u64, 0u64);
    let mut losses = LossSums::default();
    // An end-to-end head (YOLO26) has its loss on the host path only.
    let dense = dense_on(transfer.device(), opts.dense_loss) && !model.config().family.end2end();
    // On the device path the shrunk batch is packed, read back asynchronously and handed to the post-process
    // workers once it has landed (a batch or two later), so inference never waits on a copy.
    let mut readback = Readback::new(transfer.device()).map_err(ctx("validation readback"))?;
    // Sizing the shrunk batch to the counts above conf reads them on the host first: free on the CPU, a blocking
    // sync per batch on a device. There the batch keeps every anchor (exact, a larger copy, and asynchronous), so
    // validation has no blocking read at any image size.
    let shrink_params = ShrinkParams { fit: transfer.device().is_cpu(), ..ShrinkParams::default() };
    let mut in_flight = InFlight::default();
    // Without the timer the pass takes the CPU's timer, which records nothing.
    let timed = if opts.gpu_timer { transfer.device() } else { &sluice_model::candle_core::Device::Cpu };
    let mut gpu = sluice_transfer::GpuTimer::new(timed).map_err(ctx("validation GPU timer"))?;
    let (mut model_s, mut data_wait_s) = (0f64, 0f64);
    let mut first: Option<Batch> = None;
    let skipped_before = loader.skips().skipped;
    let mut t_wait = Instant::now();
    for batch in loader.pass() {
        let batch = batch.map_err(ctx("validation loader"))?;
        data_wait_s += t_wait.elapsed().as_secs_f64();
        if opts.keep_first_batch && first.is_none() {
            // A copy, not the pooled batch itself: holding that would take a buffer from the loader's pool.
            first = Some((*batch).clone());
        }
        let t = Instant::now();
        let x = transfer.transfer(&batch).map_err(ctx("validation transfer"))?;
        // The forward, loss and shrink on a worker of the compute pool (`sluice_kernels::threads::on_compute_pool`).
        gpu.start()?;
        let work = BatchWork { device_nms: opts.device_nms, half: opts.half, end2end, dense };
        let (l, out) =
            on_compute_pool(model.device(), || batch_on_device(model, loss, &batch, &x, work, &nms, &shrink_params))?;
        gpu.stop()?;
        model_s += t.elapsed().as_secs_f64();
        if dense {
            let (packed, dims) = out.pack()?;
            if readback.submit(batches, &packed, &mut in_flight.host)?.is_some() {
                in_flight.submit_oldest(&mut validator)?;
            }
            in_flight.push(dims, &batch.sample_ids, &batch.targets);
            while readback.poll(&mut in_flight.host)?.is_some() {
                in_flight.submit_oldest(&mut validator)?;
            }
        } else {
            // On the CPU the output is copied straight into the validator's pooled buffer.
            validator.submit_on_host(&out, &batch.sample_ids, &batch.targets)?;
        }
        losses.add(l.items)?;
        batches += 1;
        images += batch.len() as u64;
        t_wait = Instant::now();
    }
    while readback.wait(&mut in_flight.host)?.is_some() {
        in_flight.submit_oldest(&mut validator)?;
    }
    let gpu_s = gpu.finish()?;
    let loss_sum = losses.finish()?;
    let report = validator.finish_with(|mine| gather_metric(mine, dist))?;
    let skips = loader.skips();
    let skipped = skips.skipped - skipped_before;
    let mut sums = [loss_sum[0], loss_sum[1], loss_sum[2], batches as f64, images as f64, skipped as f64];
    dist.sum_f64(&mut sums).map_err(|e| InferError::Context {
        context: "validation: summing the ranks' losses and counts".into(),
        inner: e,
    })?;
    let (loss_sum, batches, images, skipped) =
        ([sums[0], sums[1], sums[2]], sums[3] as u64, sums[4] as u64, sums[5] as u64);
    let first_batch = first_batch(first, report.kept.into_iter().next())?;
    let n = batches.max(1) as f64;
    let skipped =
        loader.left_out().merged(&SkipReport { skipped, first: if skipped > 0 { skips.first } else { Vec::new() } });
    Ok(ValResult {
        nms: !end2end,
        report: report.metrics,
        loss: loss_sum.map(|s| s / n),
        images,
        batches,
        seconds: start.elapsed().as_secs_f64(),
        data_wait_s,
        model_s,
        gpu_s,
        stats: report.stats,
        first_batch,
        skipped,
    })
}
