//! What a training run tells its caller: an event after every batch, after every epoch, for the first batch and
//! the final validation, and warnings, through the [`Observer`] callbacks.

use std::path::Path;

use sluice_core::Batch;

use super::results::EpochRow;
use super::state::TrainSummary;
use super::telemetry::EpochTelemetry;
use sluice_infer::ValResult;

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

/// The run's first training batch, as the loader delivered it (Ultralytics draws it as `train_batch0.jpg`); sent
/// only with `plots` on.
#[derive(Debug, Clone, Copy)]
pub struct FirstBatchEvent<'a> {
    /// The batch: pixels, targets and sample ids.
    pub batch: &'a Batch,
    /// Class names, index = class id.
    pub names: &'a [String],
    /// The run folder.
    pub run_dir: &'a Path,
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
    /// The run folder.
    pub run_dir: &'a Path,
}

/// A step of the run's set-up that can take minutes, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs, reason = "each field is named in its variant's line")]
pub enum SetupTask<'a> {
    /// Copying the shard at `url` from object storage to local disk; counted in bytes.
    Fetch { url: &'a str },
    /// Decoding the images of the `train` or `val` split into the `cache: disk` file `path`; counted in images.
    DiskCache { split: &'a str, path: &'a Path },
}

/// How far a [`SetupTask`] is: `done` of `total` (bytes or images, as the task counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs, reason = "the fields are named in the type's line")]
pub struct SetupEvent<'a> {
    pub task: SetupTask<'a>,
    pub done: u64,
    pub total: u64,
}

/// Callbacks of a run. The trainer itself draws and prints nothing: a front end (the `sluice` binary, a test)
/// shows progress, draws the plots and prints warnings from these events.
pub trait Observer {
    /// While the run is built ([`super::Trainer::new_with`], [`super::Trainer::resume_with`]): a copy from object
    /// storage or a `cache: disk` build advanced. Not called when nothing has to be fetched or built.
    fn setup(&mut self, _event: &SetupEvent<'_>) {}
    /// After each batch.
    fn batch(&mut self, _event: &BatchEvent) {}
    /// After each epoch (validation included).
    fn epoch(&mut self, _event: &EpochEvent) {}
    /// The first training batch of the run (only with `plots` on).
    fn first_batch(&mut self, _event: &FirstBatchEvent<'_>) {}
    /// After the last epoch: the validation of `best` (Ultralytics' `final_eval`); with `plots` on, its
    /// `result.first_batch` holds the first validation batch and its detections.
    fn final_eval(&mut self, _event: &FinalEvalEvent<'_>) {}
    /// When the run returns (finished or interrupted), with what `summary.json` holds.
    fn finished(&mut self, _summary: &TrainSummary) {}
    /// Information about the run's set-up (the batch size AutoBatch chose): dropped unless the front end shows it.
    fn info(&mut self, _message: &str) {}
    /// A warning (non-finite step, skipped samples, a setting that does not apply): dropped unless the front end
    /// shows it.
    fn warn(&mut self, _message: &str) {}
}

/// An observer that ignores every event.
#[derive(Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}
