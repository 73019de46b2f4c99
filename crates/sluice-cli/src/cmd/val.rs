//! `sluice val`: Ultralytics' validation metrics (P, R, mAP50, mAP50-95 overall and per class) of a checkpoint or
//! weights file on a dataset split. A training checkpoint brings its own dataset, image size and validation batch,
//! so with no other flag the pass repeats the trainer's final validation; flags override them.

use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;
use sluice_dataset::Split;
use sluice_infer::ValTelemetry;
use sluice_infer::{ValRequest, validate_weights};

/// Arguments of `sluice val`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A training checkpoint (`runs/*/weights/best.safetensors`) or a weights file.
    #[arg(long)]
    weights: PathBuf,
    /// Dataset YAML (a checkpoint's training data when omitted).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Architecture (yolov8n … yolo26x or a model YAML); read from a checkpoint when omitted.
    #[arg(long)]
    model: Option<String>,
    /// train, val or test.
    #[arg(long, default_value = "val")]
    split: Split,
    /// Image size (a checkpoint's training imgsz when omitted, else 640).
    #[arg(long)]
    imgsz: Option<u32>,
    /// Images per batch (a checkpoint's validation batch, twice its training batch, when omitted, else 32).
    #[arg(long)]
    batch: Option<usize>,
    /// Loader workers (0: about 80% of the cores).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Where the model runs: `cpu`, or `cuda:N` in a build with the `cuda` feature (the trainer's validation
    /// pipeline: pinned copies, the outputs shrunk on the device, NMS and matching on post-process workers).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Stop on the first image that cannot be read or decoded (by default it is skipped, named and counted).
    #[arg(long)]
    strict: bool,
    /// An end-to-end model (YOLO26) is validated on its one-to-one head's top-k output, with no NMS (Ultralytics'
    /// `nms=False`); by default, and for other models, NMS runs on the one-to-many output.
    #[arg(long)]
    end2end: bool,
    /// Device paths not yet verified on a device, turned on for this pass (off by default): `device_nms` (batched
    /// NMS kernels on the device, only the kept rows copied, instead of NMS on the post-process workers after the
    /// device-side shrink), `gpu_timer` (the GPU's busy share from CUDA events), `fused_ciou` and `fused_bce`
    /// (the validation loss's assigner overlaps and class sum in one kernel each) apply to validation.
    #[arg(long, value_name = "LIST", value_parser = sluice_train::train::parse_device_paths)]
    device_paths: Option<sluice_infer::DevicePaths>,
    /// Half-precision inference on a CUDA device (Ultralytics' `half`: the fused model in float16, the metrics
    /// from its outputs in f32); the CPU validates in f32, as Ultralytics.
    #[arg(long)]
    half: bool,
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
    data: PathBuf,
    imgsz: u32,
    batch: usize,
    /// Whether the model ran in float16.
    half: bool,
    images: u64,
    /// Images left out because they could not be read or decoded, and the first messages naming them.
    skipped: u64,
    skipped_files: Vec<String>,
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
    let on_gpu = args.device != "cpu";
    if args.half && !on_gpu {
        eprintln!("warning: --half runs on CUDA devices only (as Ultralytics); validating in f32 on the CPU");
    }
    let (v, names, used) = validate_weights(&ValRequest {
        weights: &args.weights,
        model: args.model.as_deref(),
        data: args.data.as_deref(),
        split: args.split,
        imgsz: args.imgsz,
        batch: args.batch,
        workers: args.workers,
        strict: args.strict,
        end2end: args.end2end,
        device: &args.device,
        paths: args.device_paths.unwrap_or_default(),
        half: args.half && on_gpu,
        store_settings: &super::store_settings_from_env()?,
    })?;
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
        data: used.data.clone(),
        imgsz: used.imgsz,
        batch: used.batch,
        half: used.half,
        images: v.images,
        skipped: v.skipped.skipped,
        skipped_files: v.skipped.first.clone(),
        precision: r.mp,
        recall: r.mr,
        map50: r.map50,
        map50_95: r.map50_95,
        fitness: r.fitness(),
        loss: v.loss,
        seconds: v.seconds,
        telemetry: ValTelemetry {
            nms: v.nms,
            ..ValTelemetry::new(v.images, v.seconds, v.data_wait_s, v.model_s, &v.stats).with_gpu(v.gpu_s)
        },
        classes,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    eprintln!("{} at imgsz {}, batch {}", used.data.display(), used.imgsz, used.batch);
    print!("{}", v.class_table(&names));
    if let Some(line) = v.skipped.line("val") {
        eprintln!("warning: {line}");
    }
    eprintln!("{}", out.telemetry.line().trim_start());
    Ok(())
}
