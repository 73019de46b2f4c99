//! `sluice data preview`: the first batch of an epoch of the real training loader, drawn as a grid with its boxes
//! and class names (the trainer's `train_batch0.jpg` for any seed and epoch).

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;
use sluice_augment::Hyp;
use sluice_loader::LoaderConfig;

/// What to preview.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PreviewOptions {
    /// The dataset YAML (its train split is drawn from).
    pub(crate) data: PathBuf,
    /// The image to write (`.jpg`, `.jpeg` or `.png`).
    pub(crate) out: PathBuf,
    /// Training size.
    pub(crate) imgsz: u32,
    /// Images per batch.
    pub(crate) batch: usize,
    /// Run seed.
    pub(crate) seed: u64,
    /// The 0-based epoch whose first batch is drawn.
    pub(crate) epoch: u32,
    /// The run's epochs (mosaic is switched off for the last `close_mosaic` of them).
    pub(crate) epochs: u32,
    /// Augmentation settings.
    pub(crate) hyp: Hyp,
    /// Loader workers per stage.
    pub(crate) workers: usize,
}

/// What [`preview`] drew.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct PreviewSummary {
    /// The image written.
    pub(crate) out: PathBuf,
    /// The 0-based epoch.
    pub(crate) epoch: u32,
    /// Images in the batch.
    pub(crate) images: usize,
    /// Target boxes in the batch.
    pub(crate) boxes: usize,
    /// Whether mosaic was on in that epoch.
    pub(crate) mosaic: bool,
    /// The batch's sample ids (the index positions of each slot's main image).
    pub(crate) sample_ids: Vec<u64>,
    /// Samples the loader skipped for bad input.
    pub(crate) skipped: u64,
}

/// Draws the first batch of `epoch` of the training loader the trainer would build for these settings, with
/// its target boxes and class names, as the trainer's `train_batch0.jpg` ([`crate::plots::plot_batch`]). The split is read as the trainer reads it
/// (its files, or the shard its data YAML names).
pub(crate) fn preview(opts: &PreviewOptions) -> Result<PreviewSummary> {
    let cfg = LoaderConfig { workers: opts.workers.max(1), ..LoaderConfig::new(opts.imgsz, opts.batch, opts.seed) };
    let (loader, names) = crate::samples::train_loader_of(&opts.data, cfg, opts.hyp, 0)?;
    let batch = loader
        .epoch(opts.epoch, opts.epochs)
        .next()
        .transpose()?
        .ok_or_else(|| anyhow::anyhow!("{}: the train split gave no batch", opts.data.display()))?;
    crate::plots::plot_batch(&batch, &names, None, &opts.out)?;
    Ok(PreviewSummary {
        out: opts.out.clone(),
        epoch: opts.epoch,
        images: batch.len(),
        boxes: batch.targets.len(),
        mosaic: opts.hyp.mosaic > 0.0 && opts.hyp.mosaic_active(opts.epoch, opts.epochs),
        sample_ids: batch.sample_ids.clone(),
        skipped: loader.skips().skipped,
    })
}
