//! `sluice data`: dataset tools. `check` indexes a split of a `data.yaml` and reports images, boxes, per-class
//! counts and problems; `gen` writes the synthetic shapes dataset; `preview` draws one augmented training batch of
//! the real training loader (the trainer's `train_batch0.jpg`). The logic lives in `sluice-dataset` and
//! `sluice_train::data`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_augment::Hyp;
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_dataset::{IndexOptions, Split, check};
use sluice_train::data::{PreviewOptions, preview};

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
    /// Generate the synthetic shapes dataset (deterministic from the seed).
    Gen {
        /// Output folder.
        #[arg(long, default_value = "datasets/synthetic")]
        out: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Train images.
        #[arg(long, default_value_t = 256)]
        train: usize,
        /// Val images.
        #[arg(long, default_value_t = 64)]
        val: usize,
        /// Image side in pixels.
        #[arg(long, default_value_t = 320)]
        imgsz: u32,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
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
        DataCmd::Gen { out, seed, train, val, imgsz, json } => {
            let cfg = SynthConfig { out, seed, train, val, imgsz, ..SynthConfig::default() };
            let s = generate(&cfg).with_context(|| format!("generating into {}", cfg.out.display()))?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "wrote {} ({} train + {} val images, {} boxes)",
                    s.data_yaml.display(),
                    s.train_images,
                    s.val_images,
                    s.boxes
                );
            }
        }
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
    }
    Ok(())
}
