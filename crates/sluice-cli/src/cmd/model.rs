//! `sluice model convert`: an Ultralytics `.pt` checkpoint to safetensors (`sluice_model::pt`, no Python);
//! `sluice model run`: the eval-mode YOLOv8 forward on an NCHW float32 `.npy` (decoded output, optional raw
//! logits), to check a port of weights against another implementation; `sluice model bench`: eval, fused and
//! training-step timings. The logic is in `sluice_model` (`run_npy`, `bench_model_with`); the training step's update
//! is the trainer's SGD with Nesterov momentum, the update the PyTorch peer script times (lr 0.01, momentum 0.937,
//! weight decay 5e-4 on every parameter).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_model::candle_core::backprop::GradStore;
use sluice_train::optim::optimizer::GroupHyper;
use sluice_train::optim::{Optimizer, ParamGroups, Rule};

/// The update of `../shared/peers/m4_model_cpu.py`: `torch.optim.SGD(lr=0.01, momentum=0.937, nesterov=True,
/// weight_decay=5e-4)` over all parameters.
const PEER_SGD: GroupHyper = GroupHyper { lr: 0.01, momentum: 0.937, weight_decay: 5e-4 };
/// Adam / AdamW as Ultralytics' `optimizer=auto` picks them for short runs (lr 0.002, β1 0.9), decay on every
/// parameter like the SGD figure.
const BENCH_ADAM: GroupHyper = GroupHyper { lr: 0.002, momentum: 0.9, weight_decay: 5e-4 };

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
    /// Time eval forward, fused forward and a training step on the CPU (medians after warm-up).
    Bench(BenchArgs),
    /// Convert an Ultralytics .pt checkpoint to safetensors with Ultralytics key names (float32), without Python.
    Convert(ConvertArgs),
}

#[derive(Debug, clap::Args)]
struct ConvertArgs {
    /// The Ultralytics checkpoint (`YOLO.save` or a trainer's last.pt / best.pt: its EMA when it has one).
    #[arg(long)]
    weights: PathBuf,
    /// The safetensors file to write (default: the checkpoint's path with the .safetensors extension).
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// The model: a scale of YOLOv8 (n, s, m, l, x), a name (yolov8n … yolo11x) or a model YAML.
    #[arg(long = "model", alias = "scale", default_value = "n")]
    scale: String,
    /// Number of classes.
    #[arg(long, default_value_t = 80)]
    nc: usize,
    /// Square input side (multiple of 32).
    #[arg(long, default_value_t = 320)]
    imgsz: usize,
    /// Images per batch.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Untimed runs per path.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Timed runs per path (median reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// The training step's update: sgd (Nesterov, the PyTorch peer script's), adam or adamw (torch's rules).
    #[arg(long, default_value = "sgd", value_parser = ["sgd", "adam", "adamw"])]
    optimizer: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct BenchJson {
    model: String,
    imgsz: usize,
    batch: usize,
    device: &'static str,
    optimizer: String,
    eval_forward_ms: f64,
    fused_forward_ms: f64,
    train_step_ms: f64,
    peak_conv_workspace_bytes: usize,
    peak_rss_bytes: Option<u64>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// yolov8n … yolov8x, yolo11n … yolo11x, yolo26n … yolo26x, or a model YAML.
    #[arg(long)]
    model: String,
    /// Number of classes.
    #[arg(long, default_value_t = 80)]
    nc: usize,
    /// Weights in safetensors with Ultralytics key names, or an Ultralytics .pt checkpoint.
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
    /// Write the end-to-end output (B, 300, 6) of the one-to-one head (YOLO26: x1, y1, x2, y2, score, class),
    /// what Ultralytics returns with `end2end` set, instead of (B, 4 + nc, anchors).
    #[arg(long)]
    end2end: bool,
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
        ModelCommand::Bench(a) => run_bench(a),
        ModelCommand::Convert(a) => run_convert(a),
    }
}

pub(crate) fn run_bench(a: BenchArgs) -> Result<()> {
    let arch = sluice_model::parse_model(&a.scale)?;
    let opts = sluice_model::BenchOptions {
        config: arch.config(a.nc),
        imgsz: a.imgsz,
        batch: a.batch,
        warmup: a.warmup,
        iters: a.iters,
    };
    let (rule, hyper) = match a.optimizer.as_str() {
        "adam" => (Rule::Adam, BENCH_ADAM),
        "adamw" => (Rule::AdamW, BENCH_ADAM),
        _ => (Rule::Sgd, PEER_SGD),
    };
    let r = sluice_model::bench_model_with(&opts, &sluice_model::candle_core::Device::Cpu, |model| {
        let groups = ParamGroups::new(model)?;
        let vars: Vec<_> = groups.params().iter().map(|p| p.var.clone()).collect();
        let mut opt = Optimizer::new(rule, groups);
        anyhow::Ok(move |grads: &GradStore| {
            let g: Vec<_> = vars.iter().map(|v| grads.get(v.as_tensor()).cloned()).collect();
            Ok(opt.step(&g, &[hyper; 3])?)
        })
    })
    .context("sluice model bench")?;
    let report = BenchJson {
        model: arch.name(),
        imgsz: a.imgsz,
        batch: a.batch,
        device: "cpu",
        optimizer: a.optimizer.clone(),
        eval_forward_ms: r.eval_forward_ms,
        fused_forward_ms: r.fused_forward_ms,
        train_step_ms: r.train_step_ms,
        peak_conv_workspace_bytes: r.peak_conv_workspace_bytes,
        peak_rss_bytes: r.peak_rss_bytes,
    };
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        let rss = report.peak_rss_bytes.map_or_else(|| "unknown".to_string(), |b| format!("{:.0} MiB", mib(b)));
        println!(
            "{} @{} batch {} (cpu): eval forward {:.1} ms, fused forward {:.1} ms, train step ({}) {:.1} ms; \
             peak conv workspace {:.1} MiB, peak resident memory {rss}",
            report.model,
            report.imgsz,
            report.batch,
            report.eval_forward_ms,
            report.fused_forward_ms,
            report.optimizer,
            report.train_step_ms,
            mib(report.peak_conv_workspace_bytes as u64),
        );
    }
    Ok(())
}

fn run_convert(a: ConvertArgs) -> Result<()> {
    let (model, ckpt) = sluice_model::Yolo::from_pt(
        &a.weights,
        sluice_model::candle_core::DType::F32,
        &sluice_model::candle_core::Device::Cpu,
    )
    .with_context(|| format!("sluice model convert {}", a.weights.display()))?;
    let out = a.output.unwrap_or_else(|| a.weights.with_extension("safetensors"));
    model.save(&out)?;
    let shown: Vec<&str> = ckpt.names.iter().take(5).map(String::as_str).collect();
    println!(
        "{}: {} ({} classes: {}{}) from `{}` of {} ({:?}, written as float32)",
        out.display(),
        ckpt.scale.name(),
        ckpt.nc,
        shown.join(", "),
        if ckpt.names.len() > 5 { ", …" } else { "" },
        ckpt.entry,
        a.weights.display(),
        ckpt.dtype
    );
    Ok(())
}

fn run_forward(a: RunArgs) -> Result<()> {
    let arch = sluice_model::parse_model(&a.model)?;
    let opts = sluice_model::RunOptions {
        config: arch.config(a.nc),
        weights: a.weights,
        input: a.input,
        output: a.output,
        raw_dir: a.raw_dir,
        fuse: a.fuse,
        end2end: a.end2end,
    };
    let s = sluice_model::run_npy(&opts).with_context(|| format!("sluice model run --model {}", a.model))?;
    let report = Report {
        model: arch.name(),
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
