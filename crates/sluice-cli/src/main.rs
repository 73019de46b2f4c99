//! The `sluice` command-line tool. Each subcommand lives in its own module under `cmd/`; every subcommand
//! that reports figures accepts `--json` and then prints exactly one JSON object on stdout.

mod cmd;
mod epoch_table;
mod plots;
mod preview;
mod samples;

/// mimalloc, with freed memory kept: the policy and its measured effect are in `sluice_kernels::memory`.
#[global_allocator]
static GLOBAL: sluice_kernels::memory::MiMalloc = sluice_kernels::memory::MiMalloc;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Sluice: a YOLO object-detection trainer that never lets the accelerator wait.
#[derive(Parser)]
#[command(name = "sluice", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a YOLOv8 detector (`--data D.yaml --model yolov8n --epochs N`, or `--config F.yaml`, or `--resume`).
    Train(cmd::train::Args),
    /// Validate a checkpoint or weights file on a dataset split (P, R, mAP50, mAP50-95 per class).
    Val(cmd::val::Args),
    /// Show the build: version, compiled-in backends, threads.
    Info(cmd::info::Args),
    /// Dataset tools: `data check` (counts and problems of a split), `data gen` (synthetic dataset), `data preview`
    /// (one augmented training batch drawn with its boxes).
    Data(cmd::data::Args),
    /// YOLOv8 model tools: `model run` runs the eval forward on an .npy input, `model convert` turns an Ultralytics
    /// .pt into safetensors.
    Model(cmd::model::Args),
    /// Stage benchmarks: `bench model` (eval, fused and training-step times), `bench loader` (training/validation
    /// loader images/s, cold and warm), `bench decode` (decode images/s and MP/s), `bench read` (reader MB/s).
    Bench(cmd::bench::Args),
    /// COCO bbox mAP of a results file against a ground-truth file (pycocotools-exact).
    EvalCoco(cmd::eval_coco::Args),
    /// Pack a split of a dataset into one shard file (`--data D.yaml --split train --out train.sluice`).
    Pack(cmd::pack::Args),
    /// Detect objects in images (`--weights W --source img|dir [--save] [--coco-json out.json]`).
    Predict(cmd::predict::Args),
    /// Export a model (.pt, checkpoint or safetensors) as ONNX in Ultralytics' layout (`--format onnx --imgsz 640
    /// [--batch B] [--dynamic] [--half] [--opset N]`).
    Export(cmd::export::Args),
}

fn main() -> Result<()> {
    // SAFETY: at the start of `main`: no other thread exists yet and candle has not run.
    unsafe { sluice_kernels::memory::setup_process(&|k| std::env::var(k).ok()) };
    let cli = Cli::parse();
    match cli.command {
        Command::Train(args) => cmd::train::run(args),
        Command::Val(args) => cmd::val::run(args),
        Command::Info(args) => cmd::info::run(args),
        Command::Data(args) => cmd::data::run(args),
        Command::Model(args) => cmd::model::run(args),
        Command::Bench(args) => cmd::bench::run(args),
        Command::EvalCoco(args) => cmd::eval_coco::run(args),
        Command::Pack(args) => cmd::pack::run(args),
        Command::Predict(args) => cmd::predict::run(args),
        Command::Export(args) => cmd::export::run(args),
    }
}
