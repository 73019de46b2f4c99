//! `sluice data`: dataset tools. `check` indexes a split of a `data.yaml` and reports images, boxes, per-class
//! counts and problems; `gen` writes the synthetic shapes dataset; `preview` draws one augmented training batch of
//! the real training loader (the trainer's `train_batch0.jpg`). The logic lives in `sluice-dataset` and
//! `sluice-loader` (the preview in this crate).

use std::path::PathBuf;

use crate::preview::{PreviewOptions, preview};
use crate::samples::{SampleOptions, dump, dump_draws};
use anyhow::{Context, Result};
use sluice_augment::Hyp;
use sluice_dataset::synth::{SynthConfig, generate, is_generated_with};
use sluice_dataset::{IndexOptions, Split, check};

/// Arguments of `sluice data`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    cmd: DataCmd,
}

#[derive(Debug, clap::Subcommand)]
enum DataCmd {
    /// Index a split and report images, labelled images, boxes, per-class counts and problems.
    Check {
        /// The dataset YAML (Ultralytics format).
        #[arg(long)]
        data: PathBuf,
        /// The split: train, val or test.
        #[arg(long, default_value = "train")]
        split: String,
        /// Neither read nor write the label cache.
        #[arg(long)]
        no_cache: bool,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Generate the synthetic shapes dataset (deterministic from the seed). A preset gives every setting; the
    /// flags override it.
    Gen(GenArgs),
    /// Draw one augmented training batch (mosaic, perspective, HSV, flips; Ultralytics' default settings) with its
    /// boxes and class names, as the trainer's train_batch0.jpg.
    Preview {
        /// The dataset YAML (its train split is drawn from).
        #[arg(long)]
        data: PathBuf,
        /// The image to write (.jpg, .jpeg or .png).
        #[arg(long, default_value = "batch0.jpg")]
        out: PathBuf,
        /// Training size.
        #[arg(long, default_value_t = 640)]
        imgsz: u32,
        /// Images per batch (at most 16 are drawn).
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Run seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The 0-based epoch whose first batch is drawn.
        #[arg(long, default_value_t = 0)]
        epoch: u32,
        /// The run's epochs (mosaic is off in the last 10, Ultralytics' close_mosaic).
        #[arg(long, default_value_t = 100)]
        epochs: u32,
        /// Loader workers per stage.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write what the training loader delivers, one JSON line per sample (epoch, mosaic on or off, box classes,
    /// widths and heights as fractions of the side, per-channel pixel mean and mean square), for comparing its
    /// distribution with another loader's (`scripts/augment_distribution.py`).
    Samples {
        /// The dataset YAML (its train split is read).
        #[arg(long)]
        data: PathBuf,
        /// The JSON-lines file to write.
        #[arg(long)]
        out: PathBuf,
        /// Samples to write (whole epochs are read from `--epoch` on).
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// Training size.
        #[arg(long, default_value_t = 640)]
        imgsz: u32,
        /// Images per batch.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Run seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The 0-based epoch to start from (from `epochs - close_mosaic` on, mosaic is off).
        #[arg(long, default_value_t = 0)]
        epoch: u32,
        /// The run's epochs.
        #[arg(long, default_value_t = 100)]
        epochs: u32,
        /// The final epochs without mosaic (Ultralytics' `close_mosaic`).
        #[arg(long, default_value_t = 10)]
        close_mosaic: u32,
        /// The perspective's scale gain (Ultralytics' `scale`, 0.5).
        #[arg(long, default_value_t = 0.5)]
        scale: f64,
        /// The perspective's translation (Ultralytics' `translate`, 0.1).
        #[arg(long, default_value_t = 0.1)]
        translate: f64,
        /// Loader workers per stage.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Also write every batch whole into this folder, as the trainer receives it: `eEEE_bBBBB.u8` (the NCHW
        /// RGB pixels), `eEEE_bBBBB.f32` (one row per box: image in the batch, class, centre x, centre y, width,
        /// height, as fractions of the side, little-endian f32) and `batches.jsonl` (each batch's epoch, index,
        /// images, height and width), for training another trainer on exactly these batches
        /// (`benches/ul_on_sluice_batches.py`).
        #[arg(long)]
        batches: Option<PathBuf>,
    },
    /// Write the training loader's draws without reading an image, one JSON line per sample and epoch (epoch,
    /// position, sample, the images of its mosaic and the mosaic's centre, mixup's images, the horizontal flip),
    /// for comparing which images meet over a run with another loader's (`benches/mosaic_diversity.py`).
    Draws {
        /// The dataset YAML (its train split is read).
        #[arg(long)]
        data: PathBuf,
        /// The JSON-lines file to write.
        #[arg(long)]
        out: PathBuf,
        /// Training size.
        #[arg(long, default_value_t = 640)]
        imgsz: u32,
        /// Images per batch.
        #[arg(long, default_value_t = 16)]
        batch: usize,
        /// Run seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The run's epochs (all are written).
        #[arg(long, default_value_t = 100)]
        epochs: u32,
        /// The final epochs without mosaic (Ultralytics' `close_mosaic`).
        #[arg(long, default_value_t = 10)]
        close_mosaic: u32,
    },
}

/// Arguments of `sluice data gen`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenArgs {
    /// `quick`: the embedded default of `cargo xtask train` (400/100 images at 256 px, 1–6 objects of 8–50% of
    /// the side); `default`: 256/64 images at 320 px, 1–8 objects of 4–60%; `signs`: another task for
    /// fine-tuning (four other classes on textured backgrounds, 200/100 images at 256 px, 1–8 objects of 6–40%).
    #[arg(long, default_value = "quick")]
    preset: Preset,
    /// Output folder.
    #[arg(long, default_value = "datasets/synthetic")]
    out: PathBuf,
    /// Seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Train images.
    #[arg(long)]
    train: Option<usize>,
    /// Val images.
    #[arg(long)]
    val: Option<usize>,
    /// Image side in pixels.
    #[arg(long)]
    imgsz: Option<u32>,
    /// Smallest object side, as a fraction of the image side.
    #[arg(long)]
    min_size: Option<f32>,
    /// Largest object side, as a fraction of the image side.
    #[arg(long)]
    max_size: Option<f32>,
    /// Most objects per image.
    #[arg(long)]
    max_objects: Option<usize>,
    /// Leave the folder as it is when it already holds a dataset generated with exactly these settings.
    #[arg(long)]
    unless_current: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// A synthetic dataset preset.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Preset {
    /// The embedded default of `cargo xtask train`.
    Quick,
    /// The generator's defaults.
    Default,
    /// A second task for fine-tuning a model trained on `quick`: four other classes (hexagon, diamond, arrow,
    /// half-disc) on striped and checked backgrounds, 200/100 images at 256 px, 1–8 objects of 6–40% of the side.
    Signs,
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.cmd {
        DataCmd::Check { data, split, no_cache, json } => {
            let split: Split = split.parse()?;
            let opts = IndexOptions { cache: !no_cache, ..IndexOptions::default() };
            let (report, _) =
                check::check(&data, split, &opts).with_context(|| format!("checking {}", data.display()))?;
            if json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                print!("{}", report.to_text());
            }
        }
        DataCmd::Gen(g) => generate_synthetic(g)?,
        DataCmd::Preview { data, out, imgsz, batch, seed, epoch, epochs, workers, json } => {
            let opts = PreviewOptions { data, out, imgsz, batch, seed, epoch, epochs, hyp: Hyp::default(), workers };
            let s = preview(&opts).with_context(|| format!("previewing a batch of {}", opts.data.display()))?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "wrote {} (epoch {}, {} images, {} boxes, mosaic {})",
                    s.out.display(),
                    s.epoch,
                    s.images,
                    s.boxes,
                    if s.mosaic { "on" } else { "off" }
                );
            }
        }
        DataCmd::Samples {
            data,
            out,
            samples,
            imgsz,
            batch,
            seed,
            epoch,
            epochs,
            close_mosaic,
            scale,
            translate,
            workers,
            batches,
        } => {
            let hyp = Hyp { close_mosaic, scale, translate, ..Hyp::default() };
            let opts = SampleOptions { data, imgsz, batch, seed, epoch, epochs, samples, hyp, workers, batches };
            let file = std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
            let mut w = std::io::BufWriter::new(file);
            let (n, skipped) =
                dump(&opts, &mut w).with_context(|| format!("reading the train split of {}", opts.data.display()))?;
            std::io::Write::flush(&mut w).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("wrote {n} samples to {} ({skipped} skipped for bad input)", out.display());
        }
        DataCmd::Draws { data, out, imgsz, batch, seed, epochs, close_mosaic } => {
            let hyp = Hyp { close_mosaic, ..Hyp::default() };
            let opts = SampleOptions {
                data,
                imgsz,
                batch,
                seed,
                epoch: 0,
                epochs,
                samples: 0,
                hyp,
                workers: 1,
                batches: None,
            };
            let file = std::fs::File::create(&out).with_context(|| format!("creating {}", out.display()))?;
            let mut w = std::io::BufWriter::new(file);
            let n = dump_draws(&opts, &mut w).with_context(|| format!("drawing from {}", opts.data.display()))?;
            std::io::Write::flush(&mut w).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("wrote the draws of {n} samples to {}", out.display());
        }
    }
    Ok(())
}

/// `sluice data gen`: a preset's settings with the flags given over them, written unless `--unless-current` finds
/// the folder generated with exactly these settings.
fn generate_synthetic(g: GenArgs) -> Result<()> {
    let mut cfg = match g.preset {
        Preset::Quick => SynthConfig::quick(g.out),
        Preset::Default => SynthConfig { out: g.out, ..SynthConfig::default() },
        Preset::Signs => SynthConfig::signs(g.out),
    };
    cfg.seed = g.seed.unwrap_or(cfg.seed);
    cfg.train = g.train.unwrap_or(cfg.train);
    cfg.val = g.val.unwrap_or(cfg.val);
    cfg.imgsz = g.imgsz.unwrap_or(cfg.imgsz);
    cfg.objects.min_size = g.min_size.unwrap_or(cfg.objects.min_size);
    cfg.objects.max_size = g.max_size.unwrap_or(cfg.objects.max_size);
    cfg.objects.max_count = g.max_objects.unwrap_or(cfg.objects.max_count);
    if g.unless_current && is_generated_with(&cfg) {
        eprintln!("{} is current: generated with these settings", cfg.out.join("data.yaml").display());
        return Ok(());
    }
    eprintln!("generating the synthetic dataset ({}) in {} ...", cfg.kit.classes().join(", "), cfg.out.display());
    let t = std::time::Instant::now();
    let s = generate(&cfg).with_context(|| format!("generating into {}", cfg.out.display()))?;
    if g.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "wrote {} ({} train + {} val images, {} boxes, {:.1} s)",
            s.data_yaml.display(),
            s.train_images,
            s.val_images,
            s.boxes,
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
