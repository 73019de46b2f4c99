//! `sluice data`: dataset tools. `check` indexes a split of a `data.yaml` and reports images, boxes, per-class
//! counts and problems; `gen` writes the synthetic shapes dataset. The logic lives in `sluice-dataset`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use sluice_dataset::synth::{SynthConfig, generate};
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
    }
    Ok(())
}
