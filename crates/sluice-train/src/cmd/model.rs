//! `sluice model run`: the eval-mode YOLOv8 forward on an NCHW float32 `.npy` (decoded output, optional raw
//! logits), to check a port of weights against another implementation. The logic is `sluice_model::run_npy`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;

/// Arguments of `sluice model`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: ModelCommand,
}

#[derive(Debug, clap::Subcommand)]
enum ModelCommand {
    /// Run the eval-mode forward on an NCHW float32 .npy and write the decoded (B, 4+nc, A) output.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// yolov8n, yolov8s, yolov8m, yolov8l or yolov8x.
    #[arg(long)]
    model: String,
    /// Number of classes.
    #[arg(long, default_value_t = 80)]
    nc: usize,
    /// Weights in safetensors with Ultralytics key names.
    #[arg(long)]
    weights: PathBuf,
    /// Input (B, 3, H, W) float32 .npy; H and W multiples of 32.
    #[arg(long)]
    input: PathBuf,
    /// Output .npy for the decoded (B, 4+nc, A) tensor.
    #[arg(long)]
    output: PathBuf,
    /// Folder for raw_boxes.npy (B, 64, A) and raw_scores.npy (B, nc, A).
    #[arg(long)]
    raw_dir: Option<PathBuf>,
    /// Fold Conv+BN first.
    #[arg(long)]
    fuse: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    model: String,
    nc: usize,
    input_shape: Vec<usize>,
    output_shape: Vec<usize>,
    fused: bool,
    forward_ms: f64,
    written: Vec<PathBuf>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.command {
        ModelCommand::Run(a) => run_forward(a),
    }
}

fn run_forward(a: RunArgs) -> Result<()> {
    let scale = sluice_model::Scale::parse(&a.model)?;
    let opts = sluice_model::RunOptions {
        config: sluice_model::YoloConfig::new(scale, a.nc),
        weights: a.weights,
        input: a.input,
        output: a.output,
        raw_dir: a.raw_dir,
        fuse: a.fuse,
    };
    let s = sluice_model::run_npy(&opts).with_context(|| format!("sluice model run --model {}", a.model))?;
    let report = Report {
        model: format!("yolov8{}", scale.letter()),
        nc: a.nc,
        input_shape: s.input_shape,
        output_shape: s.output_shape,
        fused: s.fused,
        forward_ms: s.forward_ms,
        written: s.written,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} (nc {}{}): input {:?} -> output {:?} in {:.1} ms; wrote {}",
            report.model,
            report.nc,
            if report.fused { ", fused" } else { "" },
            report.input_shape,
            report.output_shape,
            report.forward_ms,
            report.written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(())
}
