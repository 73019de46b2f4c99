//! End to end on a tiny generated dataset: two epochs with validation, checkpoints, the batches handed out for
//! the plots (the first training batch, the first val batch with its predictions) and telemetry; the same run interrupted in the middle of epoch 2 and
//! resumed from `last.safetensors` gives the same loss sequence, bit for bit. The run trains with multi-scale on
//! (`multi_scale: 0.5` at imgsz 64: batches of 32, 64 or 96 px), so the model, the loss and the assigner also take
//! batches at other sizes than `imgsz`, and the resume repeats the sizes too.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_dataset::Split;
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_infer::load_model;
use sluice_infer::predict::{PredictOptions, Predictor};
use sluice_infer::{DevicePaths, ValRequest, ValSettings, parse_device_paths, validate_weights};
use sluice_model::candle_core::Device;
use sluice_model::{Arch, Family, Scale};
use sluice_train::dist::Dist;
use sluice_train::train::results::ResultsCsv;
use sluice_train::train::{
    BatchEvent, CacheMode, FinalEvalEvent, FirstBatchEvent, Observer, ReadFrom, SetupEvent, SetupTask, TrainConfig,
    TrainSummary, Trainer,
};

#[derive(Default)]
struct Record {
    /// (epoch, batch, side, loss items).
    losses: Vec<(u32, usize, usize, [f64; 3])>,
    stop_at: Option<(u32, usize)>,
    stop: Option<Arc<AtomicBool>>,
    /// (epoch, mAP50, mAP50-95) of each final validation of `best`.
    final_evals: Vec<(u32, f64, f64)>,
    /// (images, canvas side) of each first training batch handed out.
    first_batches: Vec<(usize, usize)>,
    /// (images, canvas side, images with detections listed) of each final validation's first batch.
    first_val_batches: Vec<(usize, usize, usize)>,
    /// The summaries the run finished with.
    finished: Vec<TrainSummary>,
    /// The set-up lines the run reported.
    infos: Vec<String>,
    /// (split, done, total) of each `cache: disk` build step the set-up reported.
    disk_builds: Vec<(String, u64, u64)>,
}

impl Observer for Record {
    fn setup(&mut self, e: &SetupEvent<'_>) {
        match e.task {
            SetupTask::DiskCache { split, path } => {
                assert!(path.to_string_lossy().contains(".imgcache"), "{}", path.display());
                self.disk_builds.push((split.to_string(), e.done, e.total));
            }
            SetupTask::Fetch { url } => panic!("nothing is fetched: {url}"),
        }
    }

    fn batch(&mut self, e: &BatchEvent) {
        self.losses.push((e.epoch, e.batch, e.side, e.loss));
        if self.stop_at == Some((e.epoch, e.batch))
            && let Some(s) = &self.stop
        {
            s.store(true, Ordering::SeqCst);
        }
    }

    fn first_batch(&mut self, e: &FirstBatchEvent<'_>) {
        self.first_batches.push((e.batch.len(), e.batch.shape().width));
    }

    fn final_eval(&mut self, e: &FinalEvalEvent<'_>) {
        let r = &e.result.report;
        self.final_evals.push((e.epoch, r.map50, r.map50_95));
        if let Some(first) = &e.result.first_batch {
            self.first_val_batches.push((first.batch.len(), first.batch.shape().width, first.detections.len()));
        }
    }

    fn finished(&mut self, summary: &TrainSummary) {
        self.finished.push(summary.clone());
    }

    fn info(&mut self, message: &str) {
        self.infos.push(message.to_string());
    }
}

fn config(data: &Path, project: &Path, name: &str) -> TrainConfig {
    let mut c = TrainConfig {
        data: data.to_path_buf(),
        model: "yolov8n".into(),
        epochs: 2,
        imgsz: 64,
        multi_scale: 0.5,
        batch: 4,
        workers: 2,
        project: project.to_path_buf(),
        name: name.into(),
        plots: false,
        ..Default::default()
    };
    c.hyp.close_mosaic = 1;
    c
}

/// `sluice val` of `weights` on the CPU with every other setting from the checkpoint (its data, imgsz and
/// validation batch).
fn cpu_val(weights: &Path) -> ValRequest<'_> {
    ValRequest {
        weights,
        model: None,
        data: None,
        split: Split::Val,
        imgsz: None,
        batch: None,
        workers: 2,
        strict: false,
        end2end: false,
        device: "cpu",
        paths: DevicePaths::default(),
        half: false,
        store_settings: &[],
    }
}

#[test]
fn two_epochs_checkpoint_and_an_exact_resume() {
    let dir = tempfile::tempdir().unwrap();
    let synth = SynthConfig {
        out: dir.path().join("data"),
        seed: 5,
        train: 12,
        val: 4,
        imgsz: 96,
        quality: 90,
        ..Default::default()
    };
    let data = generate(&synth).unwrap().data_yaml;
    let project = dir.path().join("runs");

    // Uninterrupted.
    let mut full = Record::default();
    let mut t = Trainer::new(TrainConfig { plots: true, ..config(&data, &project, "full") }).unwrap();
    let summary = t.run(&mut full).unwrap();
    assert_eq!(summary.epochs, 2);
    assert!(!summary.interrupted);
    assert_eq!(full.losses.len(), 6, "3 batches x 2 epochs");
    assert!(full.losses.iter().all(|(_, _, _, l)| l.iter().all(|v| v.is_finite())));
    let sides: Vec<usize> = full.losses.iter().map(|&(_, _, side, _)| side).collect();
    assert!(sides.iter().all(|s| [32, 64, 96].contains(s)), "{sides:?}");
    assert!(sides.iter().any(|&s| s != 64), "multi-scale drew only imgsz: {sides:?}");
    let rows = ResultsCsv::read(&t.paths().results).unwrap();
    assert_eq!(rows.iter().map(|r| r.epoch).collect::<Vec<_>>(), vec![1, 2]);
    assert!(rows.iter().all(|r| r.val_loss.iter().all(|v| v.is_finite() && *v > 0.0)));
    for f in [&summary.last, &summary.best, &t.paths().summary, &t.paths().telemetry] {
        assert!(f.exists(), "{} missing", f.display());
    }
    // Ultralytics' final_eval: `best` validated once more after the last epoch gives the best epoch's metrics
    // again (the same EMA weights, saved and loaded back exactly).
    assert_eq!(full.final_evals.len(), 1, "one final validation");
    let (epoch, map50, map50_95) = full.final_evals[0];
    assert_eq!(epoch, summary.best_epoch);
    assert_eq!((map50, map50_95), (summary.best_metrics.map50, summary.best_metrics.map50_95));
    // With plots on, the first training batch (4 images) is handed out once, and the final validation's first
    // batch: the 4 square val images in one rect batch, whose canvas is ceil(64 / 32 + 0.5) * 32 = 96 px a side
    // (Ultralytics' rect shapes pad half a stride), with a detection list per image.
    assert_eq!(full.first_batches.len(), 1);
    assert_eq!(full.first_batches[0].0, 4);
    assert_eq!(full.first_val_batches, vec![(4, 96, 4)]);
    assert_eq!(full.finished, vec![summary.clone()]);
    // The checkpoint serves `sluice val` and `sluice predict` (its EMA weights).
    let m = load_model(&summary.best, None, 6, &Device::Cpu).unwrap();
    assert_eq!(m.config().nc, 6);
    let opts = PredictOptions { imgsz: 64, ..Default::default() };
    let p = Predictor::load(&summary.best, Arch::v8(Scale::N), None, opts).unwrap();
    assert_eq!(p.num_classes(), 6);
    let telemetry = std::fs::read_to_string(&t.paths().telemetry).unwrap();
    assert_eq!(telemetry.lines().count(), 2);
    for line in telemetry.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["bottleneck"].is_string(), "{line}");
        assert_eq!(v["collate"], "in augment");
        // Both epochs validated (the last always is; val_interval defaults to 1).
        let val = &v["val"];
        assert_eq!(val["images"], 4, "{line}");
        assert!(val["images_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(val["post_process_busy_fraction"].as_f64().unwrap() > 0.0, "{line}");
        assert!(["post-process", "data", "inference"].contains(&val["bound"].as_str().unwrap()), "{line}");
    }

    // Interrupted after batch 0 of epoch 2, then resumed from `last`.
    let mut part = Record { stop_at: Some((1, 0)), ..Default::default() };
    let mut t = Trainer::new(config(&data, &project, "part")).unwrap();
    part.stop = Some(t.stop_flag());
    let s = t.run(&mut part).unwrap();
    assert!(s.interrupted);
    assert_eq!(part.losses.len(), 4);
    let mut rest = Record::default();
    let mut t = Trainer::resume(&s.last).unwrap();
    let s = t.run(&mut rest).unwrap();
    assert!(!s.interrupted);
    assert_eq!(s.epochs, 2);
    let resumed: Vec<_> = part.losses.iter().chain(&rest.losses).cloned().collect();
    assert_eq!(resumed, full.losses, "the resumed run must repeat the uninterrupted loss sequence exactly");
    let rows = ResultsCsv::read(&t.paths().results).unwrap();
    assert_eq!(rows.iter().map(|r| r.epoch).collect::<Vec<_>>(), vec![1, 2]);

    // `sluice val` of `best` with no other setting takes the checkpoint's data, imgsz and validation batch, and
    // repeats the trainer's final validation.
    let req = cpu_val(&summary.best);
    let (v, _, used) = validate_weights(&req).unwrap();
    assert_eq!(used, ValSettings { data: data.clone(), imgsz: 64, batch: 8, half: false });
    assert_eq!((v.report.map50, v.report.map50_95), (map50, map50_95));
    assert_eq!((v.images, v.skipped.skipped), (4, 0));

    // Val images that no longer decode are left out, counted and named: one whose header is gone (indexing leaves
    // it out) and one cut before its scan (its header reads, the pass fails to decode it); with `strict` they stop the pass.
    let mut val_images: Vec<_> = walk(&dir.path().join("data"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "jpg") && p.to_string_lossy().contains("val"))
        .collect();
    val_images.sort();
    let (garbage, cut) = (&val_images[0], &val_images[1]);
    std::fs::write(garbage, b"not a jpeg").unwrap();
    // Cut at the start of the scan: the frame header (size) reads, the pixels cannot be decoded.
    let bytes = std::fs::read(cut).unwrap();
    let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
    std::fs::write(cut, &bytes[..sos]).unwrap();
    let (v, _, _) = validate_weights(&req).unwrap();
    assert_eq!((v.images, v.skipped.skipped), (2, 2), "{:?}", v.skipped);
    for f in [garbage, cut] {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(v.skipped.first.iter().any(|m| m.contains(&name)), "{name} not in {:?}", v.skipped.first);
    }
    // A CUDA device in a build without the `cuda` feature is refused with the way to get one.
    if !cfg!(feature = "cuda") {
        let e = validate_weights(&ValRequest { device: "cuda:0", ..req }).unwrap_err().to_string();
        assert!(e.contains("cuda:0") && e.contains("--features cuda"), "{e}");
    }
    let e = validate_weights(&ValRequest { strict: true, ..req }).unwrap_err();
    assert!(format!("{e:#}").contains("not a jpeg") || format!("{e:#}").contains(".jpg"), "{e:#}");
}

/// The EMA of the embedded default's YOLOv8-tiny (trained on the shapes generator at 192, stored in float16), which
/// finds the generator's shapes: the start of the tests whose metrics must not be zero to mean anything.
fn trained_tiny() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../sluice-cli/tests/data/tiny_synthetic_f16.safetensors")
}

/// From a trained checkpoint, one epoch on fresh shapes: the trainer's final validation finds them (mAP50 above
/// 0.3, as the distributed test of the same fixture), `sluice val` of `best` repeats it to the last digit, NMS
/// where the predictions are keeps the same detections, and Ultralytics' `half` stays within half precision of it.
#[test]
fn a_trained_checkpoint_validates_the_same_in_the_trainer_in_val_on_device_nms_and_in_half() {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 11, train: 32, val: 24, ..SynthConfig::quick(dir.path()) };
    let data = generate(&synth).unwrap().data_yaml;
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/models/yolov8-tiny.yaml");
    let c = TrainConfig {
        model: model.to_string_lossy().into_owned(),
        weights: Some(trained_tiny()),
        epochs: 1,
        imgsz: 192,
        multi_scale: 0.0,
        batch: 8,
        ..config(&data, &dir.path().join("runs"), "tuned")
    };
    let mut rec = Record::default();
    let summary = Trainer::new(c).unwrap().run(&mut rec).unwrap();
    let (_, map50, map50_95) = rec.final_evals[0];
    assert!(map50 > 0.3 && map50_95 > 0.1, "the trained model finds the shapes: {map50} / {map50_95}");
    let req = cpu_val(&summary.best);
    let (v, _, used) = validate_weights(&req).unwrap();
    assert_eq!((used.imgsz, used.batch), (192, 16));
    assert_eq!((v.report.map50, v.report.map50_95), (map50, map50_95));
    assert_eq!((v.images, v.skipped.skipped), (24, 0));
    // NMS where the predictions are (the device kernels' host twin here), only the kept rows handed to the
    // workers: the same detections, so the same report to the last bit.
    let (d, _, _) = validate_weights(&ValRequest { paths: parse_device_paths("device_nms").unwrap(), ..req }).unwrap();
    assert!(v.stats.detections > 0, "the pass must have detections to compare");
    assert_eq!(d.stats.detections, v.stats.detections);
    assert_eq!((d.report, d.loss, d.images), (v.report.clone(), v.loss, v.images));
    // Ultralytics' `half` (which `sluice val` asks for on a GPU; the library honours it anywhere): the folded model
    // in float16, its outputs back in f32: the same pass within half precision.
    let (h, _, used) = validate_weights(&ValRequest { half: true, ..req }).unwrap();
    assert!(used.half);
    assert_eq!(h.images, v.images);
    assert_ne!(h.loss, v.loss, "the half pass must have run in f16");
    for (a, b) in h.loss.iter().zip(&v.loss) {
        assert!((a - b).abs() <= 2e-3 * b.abs().max(1.0), "loss {:?} vs {:?}", h.loss, v.loss);
    }
    for (a, b) in [(h.report.map50, v.report.map50), (h.report.map50_95, v.report.map50_95)] {
        assert!((a - b).abs() < 0.02, "half {a} vs f32 {b}");
    }
}

#[test]
fn a_yolo11_trains_and_its_checkpoint_serves_val_and_predict() {
    new_family_trains("yolo11n", Family::V11);
}

#[test]
fn a_yolo26_trains_end_to_end_and_its_checkpoint_serves_val_and_predict() {
    new_family_trains("yolo26n", Family::V26);
}

#[allow(clippy::unwrap_used)] // A test helper: a failure is the test failing.
fn new_family_trains(model: &str, family: Family) {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 6, train: 8, val: 4, imgsz: 96, ..Default::default() };
    let data = generate(&synth).unwrap().data_yaml;
    let project = dir.path().join("runs");
    let mut rec = Record::default();
    let cfg = TrainConfig { model: model.into(), multi_scale: 0.0, ..config(&data, &project, "run") };
    let mut t = Trainer::new(cfg).unwrap();
    let summary = t.run(&mut rec).unwrap();
    assert_eq!(rec.losses.len(), 4, "2 batches x 2 epochs");
    // A one-bin head's third loss term is Ultralytics' `l1_loss`.
    let header = std::fs::read_to_string(&t.paths().results).unwrap().lines().next().unwrap().to_string();
    assert_eq!(header.contains("train/l1_loss"), family == Family::V26, "{header}");
    assert!(rec.losses.iter().all(|(_, _, _, l)| l.iter().all(|v| v.is_finite() && *v > 0.0)), "{:?}", rec.losses);
    // The checkpoint names its architecture: loading, validating and predicting need no --model.
    let m = load_model(&summary.best, None, 6, &Device::Cpu).unwrap();
    assert_eq!((m.config().family, m.config().scale, m.config().nc), (family, Scale::N, 6));
    let p =
        Predictor::load(&summary.best, Arch::v8(Scale::N), None, PredictOptions { imgsz: 64, ..Default::default() })
            .unwrap();
    assert_eq!(p.num_classes(), 6);
    let req = cpu_val(&summary.best);
    let (r, _, settings) = validate_weights(&req).unwrap();
    assert_eq!(settings.imgsz, 64);
    assert_eq!((r.report.map50, r.report.map50_95), (summary.best_metrics.map50, summary.best_metrics.map50_95));
    assert!(r.nms);
    // Ultralytics' `nms=False`: a YOLO26 is validated on its end-to-end top-k output with no NMS; other models
    // fall back to NMS.
    let (e2e, _, _) = validate_weights(&ValRequest { end2end: true, ..req }).unwrap();
    assert_eq!(e2e.nms, family != Family::V26);
    assert_eq!(e2e.images, r.images);
    assert!(e2e.report.map50.is_finite() && e2e.report.map50_95.is_finite());
}

#[test]
fn weights_for_another_class_count_fine_tune_with_a_fresh_class_branch() {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 2, train: 8, val: 4, imgsz: 96, ..Default::default() };
    let data = generate(&synth).unwrap().data_yaml;
    // Weights of an 80-class yolov8n; the data has 6 classes.
    let start = dir.path().join("eighty.safetensors");
    let cfg80 = sluice_model::YoloConfig::new(Scale::N, 80);
    sluice_model::Yolo::new_seeded(cfg80, sluice_model::candle_core::DType::F32, &Device::Cpu, 9)
        .unwrap()
        .save(&start)
        .unwrap();
    let cfg = TrainConfig { epochs: 1, weights: Some(start), ..config(&data, &dir.path().join("runs"), "ft") };
    let mut rec = Record::default();
    let summary = Trainer::new(cfg).unwrap().run(&mut rec).unwrap();
    assert_eq!(summary.epochs, 1);
    // Ultralytics 8.4.190's count for yolov8n from 80 to 6 classes: the class branch keeps the source's width
    // (80, not a fresh model's 64), so only its three output convolutions (weight and bias) start fresh.
    assert!(rec.infos.iter().any(|l| l.starts_with("Transferred 349/355 items")), "{:?}", rec.infos);
    // The run's checkpoints have that width: the final validation loaded `best` (above), and `last` resumes into a
    // model of the same shape (the run is over, which is all resume has to say).
    let e = format!("{:#}", Trainer::resume(&summary.last).err().unwrap());
    assert!(e.contains("already finished"), "{e}");
    // A file with nothing of this model is refused, naming it.
    let bad = dir.path().join("bad.safetensors");
    let t = sluice_model::candle_core::Tensor::zeros(3, sluice_model::candle_core::DType::F32, &Device::Cpu).unwrap();
    sluice_model::candle_core::safetensors::save(&std::collections::HashMap::from([("x".to_string(), t)]), &bad)
        .unwrap();
    let cfg = TrainConfig { weights: Some(bad), ..config(&data, &dir.path().join("runs"), "bad") };
    let e = format!("{:#}", Trainer::new(cfg).err().unwrap());
    assert!(e.contains("bad.safetensors"), "{e}");
}

#[test]
fn a_missing_dataset_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(&dir.path().join("nope.yaml"), &dir.path().join("runs"), "x");
    let e = Trainer::new(c).unwrap_err();
    assert!(format!("{e:#}").contains("nope.yaml"), "{e:#}");
}

#[test]
fn a_final_batch_of_one_at_a_tiny_size_is_refused_like_ultralytics() {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 1, train: 9, val: 2, imgsz: 64, ..Default::default() };
    let data = generate(&synth).unwrap().data_yaml;
    // 9 images in batches of 4 leave a final batch of 1, and multi-scale 0.5 at 64 reaches 32 px.
    let e = Trainer::new(config(&data, &dir.path().join("runs"), "bn")).unwrap_err();
    assert!(format!("{e:#}").contains("BatchNorm"), "{e:#}");
    let c = TrainConfig { multi_scale: 0.0, ..config(&data, &dir.path().join("runs"), "bn") };
    assert!(Trainer::new(c).is_ok(), "at imgsz 64 without multi-scale the final batch of 1 is allowed");
}

/// The same run read from a packed shard (`source: packed`: each split packed beside its label cache, then read
/// from the shard's mmap) equals the run from the image files, epoch for epoch: the same loss sequence bit for
/// bit and the same validation metrics.
#[test]
fn a_run_from_a_packed_shard_equals_the_run_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 9, train: 8, val: 4, imgsz: 64, ..Default::default() };
    let data = generate(&synth).unwrap().data_yaml;
    let project = dir.path().join("runs");
    let run = |name: &str, source: ReadFrom| {
        let mut rec = Record::default();
        let c = TrainConfig { source, multi_scale: 0.0, ..config(&data, &project, name) };
        let mut t = Trainer::new(c).unwrap();
        let s = t.run(&mut rec).unwrap();
        (rec.losses, ResultsCsv::read(&t.paths().results).unwrap(), s)
    };
    let (files_losses, files_rows, _) = run("files", ReadFrom::Files);
    let (packed_losses, packed_rows, _) = run("packed", ReadFrom::Packed);
    let shards: Vec<_> =
        walk(dir.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "sluice")).collect();
    assert_eq!(shards.len(), 2, "one shard per split: {shards:?}");
    assert_eq!(files_losses.len(), 4);
    assert_eq!(files_losses, packed_losses);
    let metrics = |rows: &[sluice_train::train::results::EpochRow]| {
        rows.iter().map(|r| (r.epoch, r.train_loss, r.metrics, r.val_loss)).collect::<Vec<_>>()
    };
    assert_eq!(metrics(&files_rows), metrics(&packed_rows));
}

/// `cache: disk` trains exactly as `cache: ram`: the same loss sequence bit for bit and the same validation
/// metrics, from one file per split beside its label cache, its build reported image by image for a progress bar;
/// a second run reuses both files and builds nothing.
#[test]
fn a_run_with_cache_disk_equals_the_run_with_cache_ram() {
    let dir = tempfile::tempdir().unwrap();
    let synth =
        // Larger than `imgsz`, so every image is resized (with the training or the validation interpolation).
        SynthConfig { out: dir.path().join("data"), seed: 4, train: 8, val: 4, imgsz: 96, ..Default::default() };
    let data = generate(&synth).unwrap().data_yaml;
    let project = dir.path().join("runs");
    let run = |name: &str, cache: CacheMode| {
        let mut rec = Record::default();
        let c = TrainConfig { cache, multi_scale: 0.0, ..config(&data, &project, name) };
        let mut t = Trainer::new_with(c, Dist::single(), &mut rec).unwrap();
        t.run(&mut rec).unwrap();
        (rec.losses, ResultsCsv::read(&t.paths().results).unwrap(), (rec.infos, rec.disk_builds))
    };
    let (ram_losses, ram_rows, (_, ram_builds)) = run("ram", CacheMode::Ram);
    assert!(ram_builds.is_empty(), "{ram_builds:?}");
    let (disk_losses, disk_rows, (infos, builds)) = run("disk", CacheMode::Disk);
    for (split, images) in [("train", 8), ("val", 4)] {
        let steps: Vec<_> = builds.iter().filter(|b| b.0 == split).map(|b| (b.1, b.2)).collect();
        assert!(steps.iter().all(|&(_, total)| total == images), "{split}: {steps:?}");
        assert!(steps.windows(2).all(|w| w[0].0 <= w[1].0), "{split}: done never goes back: {steps:?}");
        assert_eq!(steps.last(), Some(&(images, images)), "{split}: the build is reported to its end");
    }
    let files: Vec<_> =
        walk(dir.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "imgcache")).collect();
    assert_eq!(files.len(), 2, "one file per split: {files:?}");
    assert_eq!(infos.iter().filter(|l| l.starts_with("cache=disk: decoded")).count(), 2, "{infos:?}");
    assert_eq!(ram_losses.len(), 4);
    assert_eq!(ram_losses, disk_losses);
    let metrics = |rows: &[sluice_train::train::results::EpochRow]| {
        rows.iter().map(|r| (r.epoch, r.train_loss, r.metrics, r.val_loss)).collect::<Vec<_>>()
    };
    assert_eq!(metrics(&ram_rows), metrics(&disk_rows));
    let (again, _, (infos, builds)) = run("again", CacheMode::Disk);
    assert!(builds.is_empty(), "a reused file is not built: {builds:?}");
    assert_eq!(again, ram_losses);
    assert_eq!(infos.iter().filter(|l| l.starts_with("cache=disk:") && l.contains(" from ")).count(), 2, "{infos:?}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
