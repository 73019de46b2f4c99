//! `sluice predict`: detections on an image, a folder of images or a `.txt` list, with Ultralytics' predict
//! defaults (`--imgsz 640 --conf 0.25 --iou 0.7 --max-det 300`). Prints one line per image (or one JSON object
//! with `--json`); `--save` writes each image with its boxes and labels into a fresh run folder
//! (`runs/predict`, `runs/predict2`, …), `--coco-json` writes the detections in COCO's results format. The work
//! is in `sluice_infer::predict` and `crate::plots::annotate` (plots).

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::plots::{Annotation, annotate, save_rgb};
use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use sluice_infer::predict::{PredictOptions, Prediction, Predictor, coco_results, list_sources, next_run_dir};

/// Arguments of `sluice predict`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Weights: an Ultralytics .pt checkpoint (its own scale, classes and names), or safetensors with Ultralytics
    /// key names.
    #[arg(long)]
    weights: PathBuf,
    /// yolov8n … yolov8x or yolo11n … yolo11x (`.yaml` accepted), or a model YAML; a training checkpoint says its own.
    #[arg(long, default_value = "yolov8n")]
    model: String,
    /// An image, a folder of images (searched recursively) or a .txt list of image paths.
    #[arg(long)]
    source: PathBuf,
    /// Inference size (long side), rounded up to a multiple of 32.
    #[arg(long, default_value_t = 640)]
    imgsz: u32,
    /// Confidence threshold.
    #[arg(long, default_value_t = 0.25)]
    conf: f32,
    /// NMS IoU threshold.
    #[arg(long, default_value_t = 0.7)]
    iou: f32,
    /// Most detections per image.
    #[arg(long, default_value_t = 300)]
    max_det: usize,
    /// Class-agnostic NMS.
    #[arg(long)]
    agnostic_nms: bool,
    /// An end-to-end model (YOLO26) predicts with its one-to-one head's top-k rows and no NMS (Ultralytics'
    /// `nms=False`); other models run NMS.
    #[arg(long)]
    end2end: bool,
    /// Where the model runs: `cpu`, or `cuda:N` in a build with the `cuda` feature.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Device paths not yet verified on a device, turned on for this run (off by default): `device_nms` (batched
    /// NMS kernels where the predictions are, one read of the kept rows) applies to prediction.
    #[arg(long, value_name = "LIST", value_parser = sluice_train::train::parse_device_paths)]
    device_paths: Option<sluice_infer::DevicePaths>,
    /// Half-precision inference on a CUDA device (Ultralytics' `half`: the fused model in float16); the CPU predicts
    /// in f32, as Ultralytics.
    #[arg(long)]
    half: bool,
    /// Number of classes (default: read from the weights).
    #[arg(long)]
    nc: Option<usize>,
    /// A dataset YAML whose `names` label the classes (default: a .pt's names, else class numbers).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Write the images with their boxes drawn into PROJECT/NAME (incremented when it exists).
    #[arg(long)]
    save: bool,
    /// Folder of the run folders.
    #[arg(long, default_value = "runs")]
    project: PathBuf,
    /// Run folder name.
    #[arg(long, default_value = "predict")]
    name: String,
    /// Write the detections as COCO results JSON (`image_id` from a numeric file stem, else the image's
    /// position; `category_id` = class + 1; `bbox` = [x, y, w, h]).
    #[arg(long)]
    coco_json: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Threads that read and decode the images ahead of the model (0: one on the CPU, up to 8 beside a GPU).
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Images per forward, as Ultralytics' `batch`: a batch of one size shares its minimal canvas, a batch of
    /// mixed sizes is letterboxed to the square `--imgsz`.
    #[arg(long, default_value_t = 1)]
    batch: usize,
}

#[derive(Serialize)]
struct DetJson<'a> {
    class: u32,
    name: &'a str,
    score: f32,
    /// `[x1, y1, x2, y2]` in original pixels.
    bbox: [f32; 4],
}

#[derive(Serialize)]
struct ImageJson<'a> {
    file: &'a Path,
    width: u32,
    height: u32,
    /// Milliseconds since the previous image came out of the stream (the first: since the stream started).
    ms: f64,
    detections: Vec<DetJson<'a>>,
}

#[derive(Serialize)]
struct Report<'a> {
    model: String,
    weights: &'a Path,
    nc: usize,
    imgsz: u32,
    conf: f32,
    iou: f32,
    images: Vec<ImageJson<'a>>,
    detections: usize,
    save_dir: Option<&'a Path>,
    coco_json: Option<&'a Path>,
    load_s: f64,
    predict_s: f64,
    images_per_s: f64,
}

/// Ultralytics' per-image summary: `2 circles, 1 square` (or `(no detections)`).
fn summary(p: &Prediction, names: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::<u32, usize>::new();
    for d in &p.detections {
        *counts.entry(d.class).or_insert(0) += 1;
    }
    if counts.is_empty() {
        return "(no detections)".into();
    }
    let name = |c: u32| names.get(c as usize).cloned().unwrap_or_else(|| c.to_string());
    counts
        .iter()
        .map(|(&c, &n)| format!("{n} {}{}", name(c), if n > 1 { "s" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where `--save` writes the drawing of `image`: the same file name, PNG kept, everything else as JPEG.
fn saved_name(dir: &Path, image: &Path, used: &mut std::collections::HashSet<PathBuf>) -> PathBuf {
    let stem = image.file_stem().map_or_else(|| "image".into(), |s| s.to_string_lossy().into_owned());
    let ext = match image.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("png") => "png",
        _ => "jpg",
    };
    let mut out = dir.join(format!("{stem}.{ext}"));
    // Two sources with one name (from different sub-folders) must not overwrite each other.
    let mut k = 2;
    while !used.insert(out.clone()) {
        out = dir.join(format!("{stem}_{k}.{ext}"));
        k += 1;
    }
    out
}

pub(crate) fn run(a: Args) -> Result<()> {
    let t0 = Instant::now();
    let arch = sluice_model::parse_model(&a.model)?;
    let sources = list_sources(&a.source)?;
    let (mut predictor, names, threads) = load(&a, arch)?;
    let opts = predictor.options();
    if opts.imgsz != a.imgsz && !a.json {
        eprintln!("warning: --imgsz {} is not a multiple of 32, using {}", a.imgsz, opts.imgsz);
    }
    let save_dir = if a.save {
        let dir = next_run_dir(&a.project, &a.name);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Some(dir)
    } else {
        None
    };
    let load_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let (preds, times) = predict_all(&a, &mut predictor, &sources, threads, &names, save_dir.as_deref())?;
    let predict_s = t1.elapsed().as_secs_f64();
    if let Some(out) = &a.coco_json {
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        sluice_dataset::coco::write_json(out, &coco_results(&preds, &names))?;
    }
    let detections: usize = preds.iter().map(|p| p.detections.len()).sum();
    let images_per_s = if predict_s > 0.0 { preds.len() as f64 / predict_s } else { 0.0 };
    if a.json {
        let report = Report {
            model: arch.name(),
            weights: &a.weights,
            nc: predictor.num_classes(),
            imgsz: opts.imgsz,
            conf: opts.conf,
            iou: opts.iou,
            images: images_json(&preds, &times, &names),
            detections,
            save_dir: save_dir.as_deref(),
            coco_json: a.coco_json.as_deref(),
            load_s,
            predict_s,
            images_per_s,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{} images, {detections} detections in {predict_s:.2}s ({images_per_s:.1} images/s, model load {load_s:.2}s)",
            preds.len()
        );
        if let Some(dir) = &save_dir {
            println!("Results saved to {}", dir.display());
        }
        if let Some(out) = &a.coco_json {
            println!("COCO detections written to {}", out.display());
        }
    }
    Ok(())
}

/// The predictor on its device, the class names (from `--data`, else from a `.pt`'s own) and how many threads
/// read and decode ahead.
fn load(a: &Args, arch: sluice_model::Arch) -> Result<(Predictor, Vec<String>, usize)> {
    let names = match &a.data {
        Some(yaml) => sluice_dataset::DataConfig::load(yaml)?.names,
        None if sluice_model::is_pt(&a.weights) => sluice_model::read_pt(&a.weights)?.names,
        None => Vec::new(),
    };
    let opts = PredictOptions {
        imgsz: a.imgsz,
        conf: a.conf,
        iou: a.iou,
        max_det: a.max_det,
        agnostic: a.agnostic_nms,
        end2end: a.end2end,
        device_nms: a.device_paths.unwrap_or_default().device_nms,
        half: a.half && a.device != "cpu",
    };
    if a.half && a.device == "cpu" {
        eprintln!("warning: --half runs on CUDA devices only (as Ultralytics); predicting in f32 on the CPU");
    }
    let device = sluice_infer::device_of(&a.device)?;
    let predictor = Predictor::load_on(&a.weights, arch, a.nc, opts, &device).context("loading the model")?;
    if !names.is_empty() && names.len() != predictor.num_classes() {
        bail!(
            "{} names {} classes, the weights {} have {}",
            a.data.as_deref().unwrap_or(Path::new("")).display(),
            names.len(),
            a.weights.display(),
            predictor.num_classes()
        );
    }
    // Files are read and decoded ahead on other threads while the model runs: one on the CPU (whose cores the
    // model uses), several beside a GPU.
    let threads = match a.workers {
        0 if device.is_cuda() => std::thread::available_parallelism().map_or(4, |n| n.get()).min(8),
        0 => 1,
        n => n,
    };
    Ok((predictor, names, threads))
}

/// Every source through the model, in order: each image's line (or nothing with `--json`) and, with `--save`,
/// its drawing; returns the predictions and each one's milliseconds.
fn predict_all(
    a: &Args,
    predictor: &mut Predictor,
    sources: &[PathBuf],
    threads: usize,
    names: &[String],
    save_dir: Option<&Path>,
) -> Result<(Vec<Prediction>, Vec<f64>)> {
    let mut preds = Vec::with_capacity(sources.len());
    let mut times = Vec::with_capacity(sources.len());
    let mut used = std::collections::HashSet::new();
    // A progress bar with images/s on a terminal (hidden otherwise, and with --json).
    let bar = if a.json { ProgressBar::hidden() } else { ProgressBar::new(sources.len() as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:25} {pos}/{len} images, {per_sec} [{elapsed}<{eta}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut last = Instant::now();
    predictor.predict_stream(sources, threads, a.batch, |i, r| -> Result<()> {
        let path = &sources[i];
        let (pred, mut image) = r?;
        let ms = last.elapsed().as_secs_f64() * 1e3;
        if let Some(dir) = save_dir {
            let boxes: Vec<Annotation> = pred.detections.iter().map(Annotation::from).collect();
            annotate(&mut image, &boxes, names).with_context(|| format!("drawing {}", path.display()))?;
            let out = saved_name(dir, path, &mut used);
            let packed: Vec<u8> = (0..image.height()).flat_map(|y| image.row(y).iter().copied()).collect();
            save_rgb(&packed, image.width(), image.height(), &out)?;
        }
        if !a.json {
            bar.suspend(|| {
                println!(
                    "image {}/{} {}: {}x{} {}, {ms:.1}ms",
                    i + 1,
                    sources.len(),
                    path.display(),
                    pred.letterbox.canvas.1,
                    pred.letterbox.canvas.0,
                    summary(&pred, names)
                )
            });
        }
        bar.inc(1);
        preds.push(pred);
        times.push(ms);
        last = Instant::now();
        Ok(())
    })?;
    bar.finish_and_clear();
    Ok((preds, times))
}

/// `--json`'s per-image records.
fn images_json<'a>(preds: &'a [Prediction], times: &[f64], names: &'a [String]) -> Vec<ImageJson<'a>> {
    const NO_NAME: &str = "";
    preds
        .iter()
        .zip(times)
        .map(|(p, &ms)| ImageJson {
            file: &p.path,
            width: p.width,
            height: p.height,
            ms,
            detections: p
                .detections
                .iter()
                .map(|d| DetJson {
                    class: d.class,
                    name: names.get(d.class as usize).map_or(NO_NAME, String::as_str),
                    score: d.score,
                    bbox: [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2],
                })
                .collect(),
        })
        .collect()
}
