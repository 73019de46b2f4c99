//! `sluice bench loader|decode|read` and `sluice data preview` end to end on a tiny generated dataset: one JSON
//! object on stdout with the documented keys, positive finite figures, and counts that add up (every image of the
//! split once per epoch or pass); a backend that is not compiled in names its feature; the preview has the grid
//! size of its batch and follows the mosaic switch-off.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use sluice_dataset::synth::{SynthConfig, generate};

const TRAIN: usize = 10;
const VAL: usize = 5;
const SIDE: u32 = 96;

/// A generated dataset of 10 train and 5 val images of 96 px; returns its data.yaml.
fn dataset(dir: &Path) -> PathBuf {
    let cfg = SynthConfig {
        out: dir.join("data"),
        seed: 7,
        train: TRAIN,
        val: VAL,
        imgsz: SIDE,
        quality: 90,
        ..Default::default()
    };
    generate(&cfg).expect("generate").data_yaml
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("run sluice")
}

/// Runs `sluice args... --json`, expects success and exactly one JSON object on stdout.
fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = sluice(&all);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert!(v.is_object());
    v
}

/// A positive, finite number under `key`.
fn positive(v: &Value, key: &str) -> f64 {
    let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} is not a number in {v}"));
    assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    x
}

fn count(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not a count in {v}"))
}

fn stages(telemetry: &Value) -> Vec<String> {
    let stages = telemetry["stages"].as_array().expect("stages");
    stages.iter().map(|s| s["stage"].as_str().expect("stage name").to_string()).collect()
}

#[test]
fn bench_loader_reports_cold_and_warm_rates_and_counts_every_image_per_epoch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dataset(dir.path());
    let d = data.to_str().expect("utf-8");
    let base = ["bench", "loader", "--data", d, "--imgsz", "64", "--batch", "4", "--workers", "2"];

    let mut args = base.to_vec();
    args.extend(["--epochs", "3", "--cache", "ram"]);
    let r = json(&args);
    for key in ["cold_images_per_s", "cold_two_epochs_images_per_s", "warm_images_per_s", "warm_min", "warm_max"] {
        positive(&r, key);
    }
    assert!(positive(&r, "warm_min") <= positive(&r, "warm_images_per_s"));
    assert!(positive(&r, "warm_images_per_s") <= positive(&r, "warm_max"));
    assert_eq!((r["mode"].as_str(), r["cache"].as_str()), (Some("train"), Some("ram")));
    assert_eq!((count(&r, "epochs"), count(&r, "imgsz"), count(&r, "batch"), count(&r, "workers")), (3, 64, 4, 2));
    assert_eq!(count(&r, "split_images"), TRAIN as u64);
    assert_eq!(count(&r, "images"), 3 * TRAIN as u64);
    assert_eq!(count(&r, "batches"), 3 * TRAIN.div_ceil(4) as u64);
    assert_eq!(count(&r, "skipped"), 0);
    let epochs = r["per_epoch"].as_array().expect("per_epoch");
    assert_eq!(epochs.len(), 3);
    assert!(epochs.iter().all(|e| count(e, "images") == TRAIN as u64 && positive(e, "seconds") > 0.0));
    // The RAM cache holds every image after the cold epoch and serves the warm ones.
    assert_eq!(count(&r["cache_stats"], "cached_images"), TRAIN as u64);
    assert!(count(&r["cache_stats"], "hits") > 0);
    for t in ["cold_telemetry", "warm_telemetry"] {
        assert_eq!(stages(&r[t]), ["read", "decode", "augment"]);
        assert!(!r[t]["bottleneck"].as_str().expect("bottleneck").is_empty());
    }
    assert_eq!(r["bottleneck"], r["warm_telemetry"]["bottleneck"]);

    // The validation loader without a cache: every val image once per pass, read and decoded every time.
    let mut args = base.to_vec();
    args.extend(["--epochs", "2", "--mode", "val", "--cache", "none"]);
    let v = json(&args);
    positive(&v, "cold_images_per_s");
    positive(&v, "warm_images_per_s");
    assert_eq!((v["mode"].as_str(), v["cache"].as_str()), (Some("val"), Some("none")));
    assert_eq!(count(&v, "split_images"), VAL as u64);
    assert_eq!(count(&v, "images"), 2 * VAL as u64);
    assert_eq!(count(&v, "batches"), 2 * VAL.div_ceil(4) as u64);
    assert_eq!(count(&v["cache_stats"], "misses"), 2 * VAL as u64);
    assert_eq!(count(&v["cache_stats"], "cached_images"), 0);

    // One epoch has no warm figure: refused with a reason.
    let mut args = base.to_vec();
    args.extend(["--epochs", "1"]);
    let out = sluice(&args);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 2"));
}

#[test]
fn bench_decode_reports_images_and_source_megapixels_per_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dataset(dir.path());
    let d = data.to_str().expect("utf-8");
    let source_mp = (TRAIN as u64 * u64::from(SIDE * SIDE)) as f64 / 1e6;
    for (extra, mode) in [(["--full"].as_slice(), "full"), (["--imgsz", "64"].as_slice(), "target")] {
        let mut args = vec!["bench", "decode", "--data", d, "--backend", "image", "--threads", "2", "--repeats", "3"];
        args.extend(extra);
        let r = json(&args);
        assert_eq!(r["mode"].as_str(), Some(mode));
        assert_eq!(r["backend"].as_str(), Some("image"));
        assert_eq!((count(&r, "images"), count(&r, "threads"), count(&r, "repeats")), (TRAIN as u64, 2, 3));
        assert!((positive(&r, "source_mp") - source_mp).abs() < 1e-9, "{}", r["source_mp"]);
        for key in ["images_per_s", "images_per_s_min", "images_per_s_max", "mp_per_s", "mp_per_s_min", "mp_per_s_max"]
        {
            positive(&r, key);
        }
        assert!(positive(&r, "images_per_s_min") <= positive(&r, "images_per_s_max"));
        assert_eq!(r["pass_seconds"].as_array().map(Vec::len), Some(3));
        // Source MP/s over images/s is the mean source size, whatever the pass.
        let ratio = positive(&r, "mp_per_s") / positive(&r, "images_per_s");
        assert!((ratio - source_mp / TRAIN as f64).abs() < 1e-9);
    }
    // The val split, one thread.
    let r = json(&["bench", "decode", "--data", d, "--split", "val", "--threads", "1", "--repeats", "1"]);
    assert_eq!(count(&r, "images"), VAL as u64);

    let out = sluice(&["bench", "decode", "--data", d, "--backend", "turbojpeg", "--repeats", "1", "--json"]);
    if cfg!(feature = "turbojpeg") {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("built without feature `turbojpeg`"), "{err}");
    }
}

#[test]
fn bench_read_times_every_reader_on_the_same_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dataset(dir.path());
    let d = data.to_str().expect("utf-8");
    let r = json(&["bench", "read", "--data", d, "--repeats", "2"]);
    assert_eq!(count(&r, "records"), TRAIN as u64);
    let images = dir.path().join("data/images/train");
    let on_disk: u64 =
        std::fs::read_dir(&images).expect("images").map(|e| e.expect("entry").metadata().expect("size").len()).sum();
    assert_eq!(count(&r, "bytes"), on_disk);
    assert!(count(&r, "shard_bytes") > on_disk, "the shard holds the images, labels and an index");
    for reader in ["file", "packed", "packed_unverified", "cached"] {
        let f = &r[reader];
        assert_eq!(f["reader"].as_str(), Some(reader));
        positive(f, "mb_per_s");
        positive(f, "records_per_s");
        assert!(positive(f, "mb_per_s_min") <= positive(f, "mb_per_s_max"));
        assert_eq!(f["pass_seconds"].as_array().map(Vec::len), Some(2));
    }
}

#[test]
fn data_preview_draws_one_training_batch_as_a_grid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dataset(dir.path());
    let d = data.to_str().expect("utf-8");
    let out = dir.path().join("batch0.png");
    let o = out.to_str().expect("utf-8");
    let args = ["data", "preview", "--data", d, "--out", o, "--imgsz", "64", "--batch", "4", "--seed", "3"];
    let r = json(&args);
    assert_eq!((count(&r, "images"), count(&r, "epoch")), (4, 0));
    assert_eq!(r["mosaic"].as_bool(), Some(true));
    assert!(count(&r, "boxes") > 0, "a mosaic of four shapes images carries boxes");
    assert_eq!(r["sample_ids"].as_array().map(Vec::len), Some(4));
    // Four 64 px images in a 2 x 2 grid.
    let img = image::open(&out).expect("decode the preview").to_rgb8();
    assert_eq!(img.dimensions(), (128, 128));
    let first = std::fs::read(&out).expect("preview");

    // The same seed and epoch draw the same batch; the last epochs of a run have mosaic off.
    json(&args);
    assert_eq!(std::fs::read(&out).expect("preview"), first);
    let mut late = args.to_vec();
    late.extend(["--epoch", "95", "--epochs", "100"]);
    let r = json(&late);
    assert_eq!(r["mosaic"].as_bool(), Some(false));
    assert_eq!(count(&r, "epoch"), 95);
}
