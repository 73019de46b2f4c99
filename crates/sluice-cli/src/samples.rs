//! `sluice data samples`: what the training loader hands the model, one JSON line per sample, for comparing its
//! distribution with another loader's (`scripts/augment_distribution.py` compares it with Ultralytics'). Each
//! line holds the sample's epoch, its boxes (class, centre, width and height as fractions of the canvas side) and its
//! pixels' per-channel mean and mean square (in [0, 1]); the statistics are computed by the comparing script, for
//! both loaders with the same code. `sluice data draws` writes the loader's draws instead, without reading an
//! image: which images meet in each mosaic over the epochs (`benches/mosaic_diversity.py` compares them with
//! Ultralytics').

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_augment::Hyp;
use sluice_augment::recipe::Layout;
use sluice_core::Batch;
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
    /// A folder to write each whole batch into (pixels, boxes and an index line), beside the sample lines.
    pub(crate) batches: Option<PathBuf>,
}

/// One line of `batches.jsonl`: where a written batch sits in the run and its shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct BatchLine {
    epoch: u32,
    batch: u64,
    images: usize,
    height: usize,
    width: usize,
    /// Whether mosaic was on in this epoch.
    mosaic: bool,
}

/// Writes one batch's pixels and boxes under `dir` and its index line to `index`.
fn write_batch(dir: &Path, index: &mut dyn Write, epoch: u32, mosaic: bool, batch: &Batch) -> Result<()> {
    let shape = batch.shape();
    let stem = format!("e{epoch:04}_b{:05}", batch.index);
    let pixels = dir.join(format!("{stem}.u8"));
    std::fs::write(&pixels, batch.pixels()).with_context(|| format!("writing {}", pixels.display()))?;
    let (w, h) = (shape.width as f32, shape.height as f32);
    let mut rows = Vec::with_capacity(batch.targets.len() * 6 * 4);
    for t in batch.targets.iter() {
        let b = t.bbox;
        let row = [
            t.image as f32,
            t.class as f32,
            (b.x1 + b.x2) / 2.0 / w,
            (b.y1 + b.y2) / 2.0 / h,
            (b.x2 - b.x1) / w,
            (b.y2 - b.y1) / h,
        ];
        rows.extend(row.iter().flat_map(|v| v.to_le_bytes()));
    }
    let boxes = dir.join(format!("{stem}.f32"));
    std::fs::write(&boxes, rows).with_context(|| format!("writing {}", boxes.display()))?;
    let line =
        BatchLine { epoch, batch: batch.index, images: batch.len(), height: shape.height, width: shape.width, mosaic };
    serde_json::to_writer(&mut *index, &line)?;
    index.write_all(b"\n")?;
    Ok(())
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
    let loader = train_loader(opts)?;
    let mut index = match &opts.batches {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join("batches.jsonl");
            let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            Some((dir.as_path(), std::io::BufWriter::new(file)))
        }
        None => None,
    };
    let mut written = 0;
    let mut epoch = opts.epoch;
    while written < opts.samples {
        anyhow::ensure!(epoch < opts.epochs, "the run's {} epochs ended after {written} samples", opts.epochs);
        let mosaic = opts.hyp.mosaic > 0.0 && opts.hyp.mosaic_active(epoch, opts.epochs);
        for batch in loader.epoch(epoch, opts.epochs) {
            let batch = batch.with_context(|| format!("epoch {epoch}"))?;
            if let Some((dir, index)) = index.as_mut() {
                write_batch(dir, index, epoch, mosaic, &batch)?;
            }
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
    if let Some((dir, mut index)) = index {
        index.flush().with_context(|| format!("writing {}", dir.join("batches.jsonl").display()))?;
    }
    Ok((written, loader.skips().skipped))
}

/// One sample's draws in one epoch.
#[derive(Debug, Serialize)]
struct DrawLine {
    epoch: u32,
    /// Its position in the epoch's order.
    pos: usize,
    /// The sample.
    id: u64,
    /// The images of its mosaic, its own first (none when mosaic is off or not drawn).
    mosaic: Option<[u64; 4]>,
    /// The mosaic's centre on the `2 imgsz` canvas.
    centre: Option<(i32, i32)>,
    /// The images of the mixup partner's layout, if mixup was drawn.
    mixup: Option<Vec<u64>>,
    flip_lr: bool,
}

/// Writes the draws of every sample of epochs `opts.epoch .. opts.epochs`; returns the lines written.
pub(crate) fn dump_draws(opts: &SampleOptions, out: &mut dyn Write) -> Result<usize> {
    let loader = train_loader(opts)?;
    let mut written = 0;
    for epoch in opts.epoch..opts.epochs {
        for (pos, (id, r)) in loader.recipes(epoch, opts.epochs).into_iter().enumerate() {
            let (mosaic, centre) = match r.geometry.layout {
                Layout::Mosaic4 { ids, centre } => (Some(ids), Some(centre)),
                Layout::Single { .. } => (None, None),
            };
            let mixup = r.mixup.map(|m| m.geometry.layout.ids().to_vec());
            let line = DrawLine { epoch, pos, id, mosaic, centre, mixup, flip_lr: r.flip_lr };
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
            written += 1;
        }
    }
    Ok(written)
}

/// The training loader of `opts` over the dataset's train split.
fn train_loader(opts: &SampleOptions) -> Result<TrainLoader> {
    let cfg = LoaderConfig { workers: opts.workers.max(1), ..LoaderConfig::new(opts.imgsz, opts.batch, opts.seed) };
    Ok(train_loader_of(&opts.data, cfg, opts.hyp, RAM_CACHE_BYTES)?.0)
}

/// The training loader the trainer builds for `data`'s train split (its files, or the shard its data YAML names),
/// with up to `cache_bytes` of decoded images kept, and the split's class names.
pub(crate) fn train_loader_of(
    data: &Path,
    cfg: LoaderConfig,
    hyp: Hyp,
    cache_bytes: usize,
) -> Result<(TrainLoader, Vec<String>)> {
    let split = load_split_with(
        data,
        Split::Train,
        &IndexOptions { cache: true, find_orphans: false },
        true,
        &crate::cmd::remote_from_env()?,
    )?;
    let names = split.config.names.clone();
    let source = Arc::new(DecodedSource::open(&split.source, split.indexed.index, cfg.imgsz, true, cache_bytes)?);
    Ok((TrainLoader::new(source, cfg, hyp)?, names))
}
