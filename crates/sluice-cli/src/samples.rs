//! `sluice data samples`: what the training loader hands the model, one JSON line per sample, for comparing its
//! distribution with another loader's (`scripts/augment_distribution.py` compares it with Ultralytics'). Each
//! line holds the sample's epoch, its boxes (class, centre, width and height as fractions of the canvas side) and its
//! pixels' per-channel mean and mean square (in [0, 1]); the statistics are computed by the comparing script, for
//! both loaders with the same code.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_augment::Hyp;
use sluice_dataset::{IndexOptions, Split};
use sluice_loader::split::load_split_with;
use sluice_loader::{DecodedSource, LoaderConfig, RAM_CACHE_BYTES, TrainLoader};

/// What to dump.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SampleOptions {
    /// The dataset YAML (its train split is read).
    pub(crate) data: PathBuf,
    /// Training size.
    pub(crate) imgsz: u32,
    /// Images per batch.
    pub(crate) batch: usize,
    /// Run seed.
    pub(crate) seed: u64,
    /// The 0-based epoch to start from.
    pub(crate) epoch: u32,
    /// The run's epochs (mosaic is off for the last `close_mosaic` of them).
    pub(crate) epochs: u32,
    /// Samples to dump (whole epochs are read from `epoch` on until there are this many).
    pub(crate) samples: usize,
    /// Augmentation settings.
    pub(crate) hyp: Hyp,
    /// Loader workers per stage.
    pub(crate) workers: usize,
}

/// One sample as the loader delivered it.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct SampleLine {
    epoch: u32,
    /// Whether mosaic was on in this epoch.
    mosaic: bool,
    /// Class of each box.
    cls: Vec<u32>,
    /// Box widths as fractions of the canvas width.
    w: Vec<f32>,
    /// Box heights as fractions of the canvas height.
    h: Vec<f32>,
    /// Box centres' x as fractions of the canvas width.
    x: Vec<f32>,
    /// Box centres' y as fractions of the canvas height.
    y: Vec<f32>,
    /// Per-channel (R, G, B) mean of the pixels, in [0, 1].
    mean: [f64; 3],
    /// Per-channel mean of the squared pixels, in [0, 1].
    sq: [f64; 3],
}

/// Writes `opts.samples` lines to `out`; returns how many were written and how many the loader skipped.
pub(crate) fn dump(opts: &SampleOptions, out: &mut dyn Write) -> Result<(usize, u64)> {
    let split = load_split_with(
        &opts.data,
        Split::Train,
        &IndexOptions { cache: true, find_orphans: false },
        true,
        &crate::cmd::remote_from_env(),
    )?;
    let source = Arc::new(DecodedSource::open(&split.source, split.indexed.index, opts.imgsz, true, RAM_CACHE_BYTES)?);
    let cfg = LoaderConfig { workers: opts.workers.max(1), ..LoaderConfig::new(opts.imgsz, opts.batch, opts.seed) };
    let loader = TrainLoader::new(source, cfg, opts.hyp)?;
    let mut written = 0;
    let mut epoch = opts.epoch;
    while written < opts.samples {
        anyhow::ensure!(epoch < opts.epochs, "the run's {} epochs ended after {written} samples", opts.epochs);
        let mosaic = opts.hyp.mosaic > 0.0 && opts.hyp.mosaic_active(epoch, opts.epochs);
        for batch in loader.epoch(epoch, opts.epochs) {
            let batch = batch.with_context(|| format!("epoch {epoch}"))?;
            let shape = batch.shape();
            let plane = shape.height * shape.width;
            for b in 0..batch.len() {
                if written == opts.samples {
                    break;
                }
                let targets = batch.targets_of(b as u32);
                let pixels = batch.slot(b);
                let (mut mean, mut sq) = ([0f64; 3], [0f64; 3]);
                for c in 0..3 {
                    let (s1, s2) = pixels[c * plane..(c + 1) * plane]
                        .iter()
                        .fold((0u64, 0u64), |(a, q), &p| (a + u64::from(p), q + u64::from(p) * u64::from(p)));
                    mean[c] = s1 as f64 / plane as f64 / 255.0;
                    sq[c] = s2 as f64 / plane as f64 / (255.0 * 255.0);
                }
                let line = SampleLine {
                    epoch,
                    mosaic,
                    cls: targets.iter().map(|t| t.class).collect(),
                    w: targets.iter().map(|t| (t.bbox.x2 - t.bbox.x1) / shape.width as f32).collect(),
                    h: targets.iter().map(|t| (t.bbox.y2 - t.bbox.y1) / shape.height as f32).collect(),
                    x: targets.iter().map(|t| (t.bbox.x1 + t.bbox.x2) / 2.0 / shape.width as f32).collect(),
                    y: targets.iter().map(|t| (t.bbox.y1 + t.bbox.y2) / 2.0 / shape.height as f32).collect(),
                    mean,
                    sq,
                };
                serde_json::to_writer(&mut *out, &line)?;
                out.write_all(b"\n")?;
                written += 1;
            }
        }
        epoch += 1;
    }
    Ok((written, loader.skips().skipped))
}
