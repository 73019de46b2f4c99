//! `sluice val`: Ultralytics' validation metrics (P, R, mAP50, mAP50-95 overall and per class) of a checkpoint or
//! weights file on a dataset split.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;
use sluice_dataset::Split;
use sluice_train::train::telemetry::ValTelemetry;
use sluice_train::train::validate_weights;

/// Arguments of `sluice val`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A training checkpoint (`runs/*/weights/best.safetensors`) or a weights file.
    #[arg(long)]
    weights: PathBuf,
    /// Dataset YAML.
    #[arg(long)]
    data: PathBuf,
    /// Architecture (yolov8n|s|m|l|x); read from a checkpoint when omitted.
    #[arg(long)]
    model: Option<String>,
    /// train, val or test.
    #[arg(long, default_value = "val")]
    split: Split,
    #[arg(long, default_value_t = 640)]
    imgsz: u32,
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Loader workers (0: about 80% of the cores).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct ClassRow {
    class: u32,
    name: String,
    instances: u64,
    precision: f64,
    recall: f64,
    map50: f64,
    map50_95: f64,
}

#[derive(Serialize)]
struct ValJson {
    images: u64,
    precision: f64,
    recall: f64,
    map50: f64,
    map50_95: f64,
    fitness: f64,
    loss: [f64; 3],
    seconds: f64,
    /// Images/s, the loader wait, inference and post-process shares, the bound.
    telemetry: ValTelemetry,
    classes: Vec<ClassRow>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let (v, names) = validate_weights(
        &args.weights,
        args.model.as_deref(),
        &args.data,
        args.split,
        args.imgsz,
        args.batch,
        args.workers,
    )?;
    let r = &v.report;
    let classes: Vec<ClassRow> = r
        .classes
        .iter()
        .map(|c| ClassRow {
            class: c.class,
            name: names.get(c.class as usize).cloned().unwrap_or_else(|| c.class.to_string()),
            instances: c.num_gt,
            precision: c.p,
            recall: c.r,
            map50: c.ap50(),
            map50_95: c.ap50_95(),
        })
        .collect();
    let out = ValJson {
        images: v.images,
        precision: r.mp,
        recall: r.mr,
        map50: r.map50,
        map50_95: r.map50_95,
        fitness: r.fitness(),
        loss: v.loss,
        seconds: v.seconds,
        telemetry: ValTelemetry::new(v.images, v.seconds, v.data_wait_s, v.model_s, &v.stats),
        classes,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    print!("{}", v.class_table(&names));
    eprintln!("{}", out.telemetry.line().trim_start());
    Ok(())
}
