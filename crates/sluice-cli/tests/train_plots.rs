//! `sluice train` end to end on a tiny generated dataset: the run folder holds Ultralytics' plots, drawn by the
//! binary from the trainer's events (`train_batch0.jpg`, `PR_curve.png`, `results.png`, and the final validation's
//! first batch with its labels and with its predictions, a 2 x 2 grid of 96 px rect canvases), `--source packed`
//! trains from shards it packs beside the label caches, and `--amp` on the CPU trains in f32 and says so.

use std::path::Path;
use std::process::Command;

use sluice_dataset::synth::{SynthConfig, generate};

fn train(data: &Path, project: &Path, name: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "train",
        "--data",
        data.to_str().expect("utf-8"),
        "--model",
        "yolov8n",
        "--epochs",
        "1",
        "--imgsz",
        "64",
        "--batch",
        "4",
        "--workers",
        "1",
        "--project",
        project.to_str().expect("utf-8"),
        "--name",
        name,
    ];
    args.extend(extra);
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(&args).output().expect("run sluice")
}

#[test]
fn train_writes_ultralytics_plots_and_trains_from_packed_shards() {
    let dir = tempfile::tempdir().expect("tempdir");
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 5, train: 8, val: 4, imgsz: 96, ..Default::default() };
    let data = generate(&synth).expect("generate").data_yaml;
    let project = dir.path().join("runs");
    let out = train(&data, &project, "plots", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = project.join("plots");
    for plot in ["train_batch0.jpg", "PR_curve.png", "results.png"] {
        assert!(run.join(plot).is_file(), "{plot} missing");
    }
    for plot in ["val_batch0_labels.jpg", "val_batch0_pred.jpg"] {
        let bytes = std::fs::read(run.join(plot)).unwrap_or_else(|e| panic!("{plot}: {e}"));
        assert_eq!(image::guess_format(&bytes).expect("format"), image::ImageFormat::Jpeg, "{plot}");
        let img = image::load_from_memory(&bytes).expect("decode");
        assert_eq!((img.width(), img.height()), (192, 192), "{plot}");
    }
    // `--amp` (Ultralytics' float16 AMP) is for CUDA devices: on the CPU the run says so and trains in f32.
    let out = train(&data, &project, "packed", &["--source", "packed", "--amp"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("amp=true: mixed precision is for CUDA devices"), "{stderr}");
    let args = std::fs::read_to_string(project.join("packed/args.yaml")).expect("args.yaml");
    assert!(args.contains("amp: true\n"), "{args}");
    assert!(dir.path().join("data/labels/train.sluice").is_file());
    assert!(dir.path().join("data/labels/val.sluice").is_file());
    let bad = train(&data, &project, "bad", &["--source", "tape"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected files or packed"));
    let bad = train(&data, &project, "bad", &["--amp", "fp8"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected true, false, fp16, bf16 or fp32"));
}
