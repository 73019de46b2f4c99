//! `sluice bench step-cost`: the op ledger of one training step and one validation batch
//! ([`sluice_ledger`]): per phase the ops, kernel launches, bytes read and written, allocations and host
//! reads, and the 20 largest op groups by bytes and by count. Recorded on the CPU as a model of the CUDA step; no
//! timing, so it runs anywhere and repeats exactly.

use anyhow::Result;
use sluice_ledger::{OpGroup, StepCost, StepCostOptions, budget, record_step, summarize};
use sluice_model::candle_core::DType;
use sluice_train::optim::OptimizerKind;
use sluice_train::train::{DevicePaths, parse_device_paths};

/// Arguments of `sluice bench step-cost`.
#[derive(Debug, clap::Args)]
pub(crate) struct StepCostArgs {
    /// yolov8n … yolo26x, or a model YAML.
    #[arg(long, default_value = "yolov8n")]
    model: String,
    /// Number of classes.
    #[arg(long, default_value_t = 80)]
    nc: usize,
    /// Square input side (multiple of 32).
    #[arg(long, default_value_t = 640)]
    imgsz: usize,
    /// Images per batch.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Mixed precision: f32 (off), fp16 (with loss scaling) or bf16.
    #[arg(long, default_value = "f32", value_parser = ["f32", "fp16", "bf16"])]
    amp: String,
    /// sgd, adam, adamw or musgd.
    #[arg(long, default_value = "sgd")]
    optimizer: OptimizerKind,
    /// Labelled boxes per image of the synthetic batch.
    #[arg(long, default_value_t = 8)]
    boxes: usize,
    /// Opt-in device paths to record instead of the verified defaults (`fused_step`, `device_nms`, `fused_ciou`, `fused_bce`, `fused_pool`).
    #[arg(long, value_name = "LIST", value_parser = parse_device_paths)]
    device_paths: Option<DevicePaths>,
    /// Compose the training BatchNorm+SiLU from candle's ops instead of its CUDA kernels (the step of the first
    /// device run, for calibration).
    #[arg(long)]
    composed_batch_norm: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Print the ledger as a budget file (JSON: per phase and per op), the form the budget test compares with.
    #[arg(long, conflicts_with = "json")]
    budget: bool,
}

pub(crate) fn run(a: StepCostArgs) -> Result<()> {
    anyhow::ensure!(a.optimizer != OptimizerKind::Auto, "--optimizer: name the optimizer to record (not auto)");
    let amp = match a.amp.as_str() {
        "fp16" => Some(DType::F16),
        "bf16" => Some(DType::BF16),
        _ => None,
    };
    let opts = StepCostOptions {
        nc: a.nc,
        imgsz: a.imgsz,
        batch: a.batch,
        amp,
        optimizer: a.optimizer,
        boxes_per_image: a.boxes,
        device_paths: a.device_paths.unwrap_or_default(),
        composed_batch_norm: a.composed_batch_norm,
        ..StepCostOptions::new(&a.model)
    };
    let records = record_step(&opts)?;
    if a.budget {
        println!("{}", serde_json::to_string_pretty(&budget(&opts, &records))?);
        return Ok(());
    }
    let cost = summarize(&opts, &records);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&cost)?);
    } else {
        print!("{}", text(&cost));
    }
    Ok(())
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

/// The ledger as a text table.
pub(crate) fn text(c: &StepCost) -> String {
    let mut s = format!(
        "step cost of {} at {}, batch {}, {}, {} ({})\n{:<10} {:>7} {:>9} {:>11} {:>11} {:>7} {:>11} {:>6}\n",
        c.model,
        c.imgsz,
        c.batch,
        c.amp,
        c.optimizer,
        c.device_model,
        "phase",
        "ops",
        "launches",
        "read MB",
        "written MB",
        "allocs",
        "alloc MB",
        "reads"
    );
    for p in c.phases.iter().chain(std::iter::once(&c.train_total)) {
        s.push_str(&format!(
            "{:<10} {:>7} {:>9} {:>11.1} {:>11.1} {:>7} {:>11.1} {:>6}\n",
            p.phase,
            p.ops,
            p.launches,
            mb(p.bytes_read),
            mb(p.bytes_written),
            p.allocs,
            mb(p.alloc_bytes),
            p.host_reads
        ));
    }
    let table = |title: &str, rows: &[OpGroup]| {
        let mut t = format!(
            "\n{title}\n{:<10} {:<28} {:<5} {:>6} {:>9} {:>10}  shapes\n",
            "phase", "op", "dtype", "count", "launches", "MB"
        );
        for g in rows {
            t.push_str(&format!(
                "{:<10} {:<28} {:<5} {:>6} {:>9} {:>10.1}  {}\n",
                g.phase,
                g.op,
                g.dtype,
                g.count,
                g.launches,
                mb(g.bytes),
                g.shapes
            ));
        }
        t
    };
    s.push_str(&table("largest by bytes", &c.top_by_bytes));
    s.push_str(&table("largest by count", &c.top_by_count));
    s
}
