//! Dataset tools the `sluice` binary and the benches share: indexing one split of a `data.yaml` the way the
//! trainer does ([`load_split`]), packing an index into one shard ([`pack_index`], `sluice pack`), and drawing one
//! augmented training batch of the real [`TrainLoader`] ([`preview`], `sluice data preview`, the trainer's
//! `train_batch0.jpg` for any seed and epoch).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use sluice_augment::Hyp;
use sluice_dataset::{DataConfig, DatasetError, IndexOptions, IndexResult, SampleIndex, Split};
use sluice_storage::{PackSummary, StorageError, encode_labels, pack_files};

use crate::loader::{DecodedSource, LoaderConfig, TrainLoader};
use crate::plots::PlotError;

/// What can go wrong in the dataset tools.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The dataset YAML or its labels could not be read.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A shard could not be written or read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The loader failed (the message names the sample).
    #[error(transparent)]
    Loader(#[from] sluice_core::Error),
    /// The batch could not be drawn or written.
    #[error(transparent)]
    Plot(#[from] PlotError),
    /// The split has no usable image.
    #[error("{}: the {split} split has no usable images (see `sluice data check`)", data.display())]
    EmptySplit {
        /// The dataset YAML.
        data: PathBuf,
        /// The split.
        split: &'static str,
    },
}

/// This module's result type.
pub type Result<T> = std::result::Result<T, DataError>;

/// A split of a dataset, indexed as the trainer indexes it (label cache read and written, no orphan search).
#[derive(Debug, Clone)]
pub struct LoadedSplit {
    /// The dataset description (class names, paths).
    pub config: DataConfig,
    /// The index and the problems found.
    pub indexed: IndexResult,
}

impl LoadedSplit {
    /// The usable samples.
    pub fn index(&self) -> &SampleIndex {
        &self.indexed.index
    }
}

/// Loads `data` and indexes `split`; with `require_images`, an empty split is an error naming the file.
pub fn load_split(data: &Path, split: Split, opts: &IndexOptions, require_images: bool) -> Result<LoadedSplit> {
    let config = DataConfig::load(data)?;
    let indexed = config.index(split, opts)?;
    if require_images && indexed.index.is_empty() {
        return Err(DataError::EmptySplit { data: data.to_path_buf(), split: split.as_str() });
    }
    Ok(LoadedSplit { config, indexed })
}

/// Packs every sample of `index` (its image file and its labels in the binary encoding) into the shard `out`,
/// atomically; record `i` is sample `i`.
pub fn pack_index(index: &SampleIndex, out: &Path) -> std::result::Result<PackSummary, StorageError> {
    let items = index.samples.iter().map(|s| {
        let mut labels = Vec::new();
        encode_labels(&s.labels, &mut labels);
        (s.image.clone(), labels)
    });
    pack_files(items, out)
}

/// What to preview.
#[derive(Debug, Clone, PartialEq)]
pub struct PreviewOptions {
    /// The dataset YAML (its train split is drawn from).
    pub data: PathBuf,
    /// The image to write (`.jpg`, `.jpeg` or `.png`).
    pub out: PathBuf,
    /// Training size.
    pub imgsz: u32,
    /// Images per batch.
    pub batch: usize,
    /// Run seed.
    pub seed: u64,
    /// The 0-based epoch whose first batch is drawn.
    pub epoch: u32,
    /// The run's epochs (mosaic is switched off for the last `close_mosaic` of them).
    pub epochs: u32,
    /// Augmentation settings.
    pub hyp: Hyp,
    /// Loader workers per stage.
    pub workers: usize,
}

/// What [`preview`] drew.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PreviewSummary {
    /// The image written.
    pub out: PathBuf,
    /// The 0-based epoch.
    pub epoch: u32,
    /// Images in the batch.
    pub images: usize,
    /// Target boxes in the batch.
    pub boxes: usize,
    /// Whether mosaic was on in that epoch.
    pub mosaic: bool,
    /// The batch's sample ids (the index positions of each slot's main image).
    pub sample_ids: Vec<u64>,
    /// Samples the loader skipped for bad input.
    pub skipped: u64,
}

/// Draws the first batch of `epoch` of the training loader the trainer would build for these settings, with
/// its target boxes and class names, as the trainer's `train_batch0.jpg` ([`crate::plots::plot_batch`]).
pub fn preview(opts: &PreviewOptions) -> Result<PreviewSummary> {
    let split = load_split(&opts.data, Split::Train, &IndexOptions { cache: true, find_orphans: false }, true)?;
    let names = split.config.names.clone();
    let source = Arc::new(DecodedSource::from_files(split.indexed.index, opts.imgsz, true, 0)?);
    let cfg = LoaderConfig { workers: opts.workers.max(1), ..LoaderConfig::new(opts.imgsz, opts.batch, opts.seed) };
    let loader = TrainLoader::new(source, cfg, opts.hyp)?;
    let batch = loader
        .epoch(opts.epoch, opts.epochs)
        .next()
        .transpose()?
        .ok_or_else(|| DataError::EmptySplit { data: opts.data.clone(), split: Split::Train.as_str() })?;
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
