//! `sluice export`: a model (an Ultralytics `.pt`, a Sluice training checkpoint or a safetensors weights file)
//! written as ONNX in Ultralytics' layout, BatchNorm folded (`sluice_export`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sluice_export::{ExportArgs, Metadata, OnnxOptions};
use sluice_model::candle_core::{DType, Device};
use sluice_model::{Yolo, is_pt};

/// Arguments of `sluice export`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// An Ultralytics .pt checkpoint, a Sluice training checkpoint or a safetensors weights file.
    #[arg(long)]
    weights: PathBuf,
    /// The architecture of a safetensors file (yolov8n … yolov8x or a model YAML); a .pt or a training checkpoint
    /// says its own.
    #[arg(long)]
    model: Option<String>,
    /// Number of classes of a safetensors file (default: read from the weights).
    #[arg(long)]
    nc: Option<usize>,
    /// A dataset YAML whose `names` label the classes (default: the .pt's names, else class numbers).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Output format (onnx).
    #[arg(long, default_value = "onnx", value_parser = ["onnx"])]
    format: String,
    /// Input size: one side for a square, or HEIGHT,WIDTH; multiples of 32.
    #[arg(long, default_value = "640", value_delimiter = ',', num_args = 1..=2)]
    imgsz: Vec<usize>,
    /// Batch size of the input.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Symbolic batch, height and width.
    #[arg(long)]
    dynamic: bool,
    /// float16 weights, input, output and arithmetic.
    #[arg(long)]
    half: bool,
    /// ONNX opset (17 to 22).
    #[arg(long, default_value_t = 17)]
    opset: i64,
    /// NMS inside the graph (not built).
    #[arg(long)]
    nms: bool,
    /// Output file (default: the weights' path with the .onnx extension).
    #[arg(long)]
    output: Option<PathBuf>,
}

pub(crate) fn run(a: Args) -> Result<()> {
    if a.nms {
        bail!(
            "--nms is not built: Sluice's ONNX export writes the raw (B, 4 + nc, anchors) output; run NMS on it after \
             the model (Ultralytics' ONNX backend does)"
        );
    }
    let device = Device::Cpu;
    let (model, mut names) = if is_pt(&a.weights) {
        let (m, ckpt) = Yolo::from_pt(&a.weights, DType::F32, &device)
            .with_context(|| format!("reading {}", a.weights.display()))?;
        if let Some(nc) = a.nc.filter(|&n| n != ckpt.nc) {
            bail!("{}: a model for {} classes, --nc says {nc}", a.weights.display(), ckpt.nc);
        }
        (m, ckpt.names)
    } else {
        let nc = match a.nc {
            Some(n) => n,
            None => sluice_infer::predict::weights_num_classes(&a.weights)?,
        };
        let m = sluice_infer::load_model(&a.weights, a.model.as_deref(), nc, &device)?;
        (m, (0..nc).map(|i| i.to_string()).collect())
    };
    let nc = model.config().nc;
    if let Some(data) = &a.data {
        let cfg = sluice_dataset::DataConfig::load(data).with_context(|| format!("dataset {}", data.display()))?;
        if cfg.names.len() != nc {
            bail!("{}: {} names for a model of {nc} classes", data.display(), cfg.names.len());
        }
        names = cfg.names;
    }
    let imgsz = match a.imgsz[..] {
        [s] => (s, s),
        [h, w] => (h, w),
        _ => bail!("--imgsz takes one or two sides"),
    };
    let opts = OnnxOptions { imgsz, batch: a.batch, dynamic: a.dynamic, half: a.half, opset: a.opset };
    let name = a.weights.file_stem().and_then(|s| s.to_str()).unwrap_or("model").to_string();
    let meta = Metadata {
        description: format!("Sluice {} model ({name})", model.config().name()),
        author: "Sluice".into(),
        date: sluice_export::metadata::utc_now_iso(),
        version: env!("CARGO_PKG_VERSION").into(),
        license: "the weights' licence (see their source)".into(),
        docs: "https://example.invalid/sluice".into(),
        stride: 32,
        task: "detect".into(),
        head: "Detect".into(),
        batch: a.batch,
        imgsz,
        names,
        args: ExportArgs { batch: a.batch, half: a.half, nms: false, dynamic: a.dynamic, opset: a.opset },
        channels: 3,
        end2end: false,
    };
    let start = Instant::now();
    let graph = model.graph().context("the model's graph")?;
    let bytes = sluice_export::to_onnx_bytes(&graph, &opts, &meta).context("writing ONNX")?;
    let out = a.output.unwrap_or_else(|| a.weights.with_extension("onnx"));
    std::fs::write(&out, &bytes).with_context(|| format!("writing {}", out.display()))?;
    let (h, w) = imgsz;
    println!(
        "{}: ONNX opset {}, input images ({}, 3, {}, {}), output output0 ({}, {}, {}), {:.1} MB in {:.2} s",
        out.display(),
        a.opset,
        if a.dynamic { "batch".to_string() } else { a.batch.to_string() },
        if a.dynamic { "height".to_string() } else { h.to_string() },
        if a.dynamic { "width".to_string() } else { w.to_string() },
        if a.dynamic { "batch".to_string() } else { a.batch.to_string() },
        4 + nc,
        if a.dynamic {
            "anchors".to_string()
        } else {
            ((h / 8) * (w / 8) + (h / 16) * (w / 16) + (h / 32) * (w / 32)).to_string()
        },
        bytes.len() as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
