//! One validation pass: the val loader's rect batches through the (EMA) model's eval forward and the validation
//! loss on the raw head outputs on this thread, while NMS with Ultralytics' validator settings (conf 0.001, IoU
//! 0.7, multi-label, 300 detections) and Ultralytics' matching run on the streaming validator's workers
//! (`sluice_eval::stream`); mAP is computed once at the end.
//!
//! Predictions and ground truth are compared in the letterboxed canvas: the letterbox is a uniform scale plus a
//! shift, so IoUs — and therefore the metrics — equal those computed in original image pixels.

use std::time::Instant;

use anyhow::{Context, Result};
use sluice_core::Transfer;
use sluice_eval::{ApReport, ShrinkParams, StreamConfig, StreamStats, StreamingValidator, shrink};
use sluice_model::{DetectionLoss, YoloV8};
use sluice_transfer::CpuTransfer;

use crate::loader::ValLoader;

/// What a validation pass measured.
#[derive(Debug, Clone)]
pub struct ValResult {
    /// Ultralytics' metrics.
    pub report: ApReport,
    /// Mean validation losses (box, cls, dfl) per batch.
    pub loss: [f64; 3],
    /// Images validated.
    pub images: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Seconds in the model forward (and the copy of its output to the host).
    pub model_s: f64,
    /// Post-process (NMS + matching) figures: worker busy time, time inference waited for it, which one bound.
    pub stats: StreamStats,
}

/// Validates `model` over one pass of `loader`: inference on this thread, NMS and matching on `workers`
/// post-process threads fed through a bounded queue, so the two overlap.
pub fn validate(model: &YoloV8, loader: &ValLoader, loss: &DetectionLoss, transfer: &CpuTransfer) -> Result<ValResult> {
    let start = Instant::now();
    let nc = u32::try_from(loss.nc).context("class count")?;
    let mut validator = StreamingValidator::new(StreamConfig { workers: 2, ..StreamConfig::new(nc) })?;
    let (mut loss_sum, mut batches, mut images) = ([0f64; 3], 0u64, 0u64);
    let mut model_s = 0f64;
    for batch in loader.pass() {
        let batch = batch.context("validation loader")?;
        let t = Instant::now();
        let x = transfer.transfer(&batch).context("validation transfer")?;
        let out = model.forward(&x.images)?;
        let l = loss.compute(&out.raw, &batch.targets)?;
        // Only the anchors above the validation conf cross to the host (the whole head output stays put).
        let shrunk = shrink(&out.y, &ShrinkParams::default())?;
        model_s += t.elapsed().as_secs_f64();
        validator.submit_shrunk(&shrunk, &batch.sample_ids, &batch.targets)?;
        for (s, v) in loss_sum.iter_mut().zip(l.items) {
            *s += v;
        }
        batches += 1;
        images += batch.len() as u64;
    }
    let report = validator.finish()?;
    let n = batches.max(1) as f64;
    Ok(ValResult {
        report: report.metrics,
        loss: loss_sum.map(|s| s / n),
        images,
        seconds: start.elapsed().as_secs_f64(),
        model_s,
        stats: report.stats,
    })
}
