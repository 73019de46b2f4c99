//! `sluice bench <stage>`: one entry point for the stage benchmarks that run from the binary. Each prints a short
//! summary, or one JSON object with `--json`. `model` (the same as `sluice model bench`), `loader`, `decode` and
//! `read`; the logic of the last three lives in `sluice_loader::bench`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_dataset::Split;
use sluice_decode::Backend;
use sluice_loader::CacheMode;
use sluice_loader::bench::decode::DecodeBenchOptions;
use sluice_loader::bench::loader::{LoaderBenchOptions, LoaderMode};
use sluice_loader::bench::read::ReadBenchOptions;

/// Arguments of `sluice bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BenchCommand {
    /// YOLOv8 eval forward, fused forward and training step (JSON keys `eval_forward_ms`, `fused_forward_ms`,
    /// `train_step_ms`).
    Model(super::model::BenchArgs),
    /// The training loader (default augmentation, mosaic on) or the validation loader (rect batches) over a
    /// split: cold (first epoch) and warm (later epochs) images/s and per-stage telemetry.
    Loader(LoaderArgs),
    /// Decoding alone: the split's images read into RAM, then decoded by N threads (images/s, source MP/s).
    Decode(DecodeArgs),
    /// Byte readers on the same records: files, a packed shard (checked and unchecked), a warm RAM cache (MB/s).
    Read(ReadArgs),
    /// The op ledger of one training step and one validation batch, recorded on the CPU as a model of the CUDA
    /// step: per phase the kernel launches, bytes moved, allocations and host reads, and the largest ops.
    StepCost(super::step_cost::StepCostArgs),
}

#[derive(Debug, clap::Args)]
struct LoaderArgs {
    /// The dataset YAML.
    #[arg(long)]
    data: PathBuf,
    /// Training size.
    #[arg(long, default_value_t = 640)]
    imgsz: u32,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Worker threads per loader stage.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Epochs (at least 2; the first is cold).
    #[arg(long, default_value_t = 3)]
    epochs: u32,
    /// ram, disk or none (disk: the split's cache file is opened, or built first, before the first epoch).
    #[arg(long, default_value = "none")]
    cache: CacheMode,
    /// The folder of `--cache disk`'s file (default: beside the split's label cache).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// train (TrainLoader on the train split) or val (ValLoader on the val split).
    #[arg(long, default_value = "train")]
    mode: LoaderMode,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct DecodeArgs {
    /// The dataset YAML.
    #[arg(long)]
    data: PathBuf,
    /// train, val or test.
    #[arg(long, default_value = "train")]
    split: Split,
    /// image, turbojpeg or nvjpeg (a backend not compiled in says which feature it needs; nvjpeg needs a GPU).
    #[arg(long, default_value = "image")]
    backend: Backend,
    /// Decoding threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Decode to this training size (DCT scaling + Ultralytics' resize).
    #[arg(long, default_value_t = 640, conflicts_with = "full")]
    imgsz: u32,
    /// Decode at full size instead.
    #[arg(long)]
    full: bool,
    /// Timed passes over every image.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Untimed passes first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ReadArgs {
    /// The dataset YAML.
    #[arg(long)]
    data: PathBuf,
    /// train, val or test.
    #[arg(long, default_value = "train")]
    split: Split,
    /// Timed passes per reader.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Untimed passes per reader first (at least 1).
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints `report` as one JSON object, or its text.
fn print<T: Serialize>(report: &T, json: bool, text: impl FnOnce(&T) -> String) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        print!("{}", text(report));
    }
    Ok(())
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.command {
        BenchCommand::Model(a) => super::model::run_bench(a),
        BenchCommand::StepCost(a) => super::step_cost::run(a),
        BenchCommand::Loader(a) => {
            let opts = LoaderBenchOptions {
                data: a.data,
                mode: a.mode,
                imgsz: a.imgsz,
                batch: a.batch,
                workers: a.workers,
                epochs: a.epochs,
                cache: a.cache,
                cache_dir: a.cache_dir,
                seed: a.seed,
            };
            let report = sluice_loader::bench::loader::run(&opts)
                .with_context(|| format!("benchmarking the {} loader on {}", a.mode.as_str(), opts.data.display()))?;
            print(&report, a.json, |r| r.to_text())
        }
        BenchCommand::Decode(a) => {
            let opts = DecodeBenchOptions {
                data: a.data,
                split: a.split,
                backend: a.backend,
                threads: a.threads,
                imgsz: (!a.full).then_some(a.imgsz),
                repeats: a.repeats,
                warmup: a.warmup,
            };
            let report = sluice_loader::bench::decode::run(&opts)
                .with_context(|| format!("benchmarking {} decoding on {}", a.backend, opts.data.display()))?;
            print(&report, a.json, |r| r.to_text())
        }
        BenchCommand::Read(a) => {
            let opts = ReadBenchOptions { data: a.data, split: a.split, repeats: a.repeats, warmup: a.warmup };
            let report = sluice_loader::bench::read::run(&opts)
                .with_context(|| format!("benchmarking the readers on {}", opts.data.display()))?;
            print(&report, a.json, |r| r.to_text())
        }
    }
}
