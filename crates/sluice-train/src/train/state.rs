//! A run's state on disk: its folder and files ([`RunPaths`]), where the loop stands ([`Progress`], stored in every
//! checkpoint with the resolved configuration), the metrics it keeps and the summary it ends with; finding the
//! checkpoint to resume.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use crate::error::{Context, Result};
use crate::optim::read_user_metadata;
use sluice_infer::ValResult;

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

/// Precision, recall and the two mAPs of a validation pass, with the images it had to leave out.
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
    /// Ultralytics 8.4's fitness, the score that picks `best`: mAP50-95.
    pub fitness: f64,
    /// Val images that could not be read or decoded, left out of the pass and of the metrics.
    #[serde(default)]
    pub skipped: u64,
}

impl Metrics {
    pub(crate) fn of(v: &ValResult) -> Self {
        let r = &v.report;
        Self {
            precision: r.mp,
            recall: r.mr,
            map50: r.map50,
            map50_95: r.map50_95,
            fitness: r.fitness(),
            skipped: v.skipped.skipped,
        }
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
pub(crate) struct CheckpointMeta {
    /// The resolved configuration (YAML).
    pub(crate) config: String,
    /// The run folder.
    pub(crate) run_dir: PathBuf,
    /// Loop position.
    pub(crate) progress: Progress,
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
    pub(crate) fn new(dir: PathBuf) -> Self {
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
    pub(crate) fn fresh(cfg: &TrainConfig) -> Self {
        let base = cfg.project.join(&cfg.name);
        let mut dir = base.clone();
        let mut n = 2;
        while dir.exists() && !cfg.exist_ok {
            dir = cfg.project.join(format!("{}{n}", cfg.name));
            n += 1;
        }
        Self::new(dir)
    }

    pub(crate) fn create(&self) -> Result<()> {
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

pub(crate) fn read_meta(path: &Path) -> Result<CheckpointMeta> {
    serde_json::from_value(read_user_metadata(path)?)
        .with_context(|| format!("{}: not a sluice training checkpoint", path.display()))
}
