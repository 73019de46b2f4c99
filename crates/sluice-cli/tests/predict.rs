//! `sluice predict` end to end on a tiny generated dataset with a freshly initialised yolov8n: one drawn image
//! per input in a fresh run folder, the JSON report and the COCO results agreeing box for box, every box inside
//! its (non-square, letterboxed) image, and a corrupt image named in the error; and a YOLO26's end-to-end rows
//! (`--end2end`) against Ultralytics' own prediction.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_model::candle_core::{DType, Device};
use sluice_model::{Scale, Yolo, YoloConfig};

const NC: usize = 6;

/// Three generated 96 px JPEGs plus a 96x60 PNG crop with a non-numeric name, and fresh weights.
fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let cfg =
        SynthConfig { out: dir.join("data"), seed: 5, train: 3, val: 0, imgsz: 96, quality: 90, ..Default::default() };
    generate(&cfg).expect("generate");
    let images = dir.join("data/images/train");
    let first = image::open(images.join("000000.jpg")).expect("decode").to_rgb8();
    image::imageops::crop_imm(&first, 0, 10, 96, 60).to_image().save(images.join("extra.png")).expect("png");
    let weights = dir.join("fresh.safetensors");
    Yolo::new(YoloConfig::new(Scale::N, NC), DType::F32, &Device::Cpu)
        .and_then(|m| m.save(&weights))
        .expect("save weights");
    (images, weights)
}

fn sluice(args: &[&str], cwd: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).current_dir(cwd).output().expect("run sluice")
}

fn num(v: &Value) -> f64 {
    v.as_f64().expect("number")
}

#[test]
fn predict_folder_saves_drawn_images_and_coco_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (images, weights) = setup(d);
    let (w, s) = (weights.to_str().expect("utf-8"), images.to_str().expect("utf-8"));
    // conf 0.001 keeps plenty of the untrained model's low-score boxes, so there is something to check.
    let args =
        ["predict", "--weights", w, "--model", "yolov8n", "--source", s, "--imgsz", "96", "--conf", "0.001", "--save"];
    let mut with_json = args.to_vec();
    with_json.extend(["--coco-json", "out/coco.json", "--json"]);
    let out = sluice(&with_json, d);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    assert_eq!(report["nc"], NC);
    let run_dir = d.join("runs/predict");
    assert_eq!(report["save_dir"].as_str().map(PathBuf::from), Some(PathBuf::from("runs/predict")));

    // One drawn image per input, of the input's size, with boxes drawn over the input's pixels.
    let mut saved: Vec<String> = std::fs::read_dir(&run_dir)
        .expect("run dir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    saved.sort();
    assert_eq!(saved, ["000000.jpg", "000001.jpg", "000002.jpg", "extra.png"]);
    let extra_in = image::open(images.join("extra.png")).expect("decode").to_rgb8();
    let extra_out = image::open(run_dir.join("extra.png")).expect("decode").to_rgb8();
    assert_eq!(extra_out.dimensions(), (96, 60));
    let imgs = report["images"].as_array().expect("images");
    assert_eq!(imgs.len(), 4);
    assert!(!imgs[3]["detections"].as_array().expect("detections").is_empty(), "extra.png has boxes above 0.001");
    assert_ne!(extra_in, extra_out, "boxes were drawn");

    // Every box lies inside its original image (mapped back through the letterbox and clipped).
    let mut coco_want = Vec::new();
    for (i, img) in imgs.iter().enumerate() {
        let (iw, ih) = (num(&img["width"]), num(&img["height"]));
        assert_eq!((iw, ih), if i == 3 { (96.0, 60.0) } else { (96.0, 96.0) });
        for det in img["detections"].as_array().expect("detections") {
            let b: Vec<f64> = det["bbox"].as_array().expect("bbox").iter().map(num).collect();
            assert!(0.0 <= b[0] && b[0] <= b[2] && b[2] <= iw, "{b:?} in {iw}x{ih}");
            assert!(0.0 <= b[1] && b[1] <= b[3] && b[3] <= ih, "{b:?} in {iw}x{ih}");
            let score = num(&det["score"]);
            assert!(score > 0.001 && score <= 1.0);
            let class = det["class"].as_u64().expect("class");
            assert!(class < NC as u64);
            // image_id: numeric stems give 0, 1, 2; extra.png falls back to its position, 3.
            coco_want.push((i as u64, class + 1, [b[0], b[1], b[2] - b[0], b[3] - b[1]], score));
        }
    }
    assert!(!coco_want.is_empty(), "the untrained model produced no box above 0.001");
    assert_eq!(report["detections"].as_u64(), Some(coco_want.len() as u64));

    // The COCO results hold exactly the same boxes.
    let coco: Value =
        serde_json::from_slice(&std::fs::read(d.join("out/coco.json")).expect("coco json")).expect("json");
    let coco = coco.as_array().expect("a list of results");
    assert_eq!(coco.len(), coco_want.len());
    for (c, (iid, cat, bbox, score)) in coco.iter().zip(&coco_want) {
        assert_eq!(c["image_id"].as_u64(), Some(*iid));
        assert_eq!(c["category_id"].as_u64(), Some(*cat));
        let got: Vec<f64> = c["bbox"].as_array().expect("bbox").iter().map(num).collect();
        for (g, w) in got.iter().zip(bbox) {
            assert!((g - w).abs() < 1e-3, "{got:?} vs {bbox:?}");
        }
        assert!((num(&c["score"]) - score).abs() < 1e-6);
    }

    // A second run gets a fresh folder; the text output names it. `--half` is for CUDA devices (as Ultralytics):
    // the CPU predicts in f32 and says so.
    let mut half = args.to_vec();
    half.push("--half");
    let out = sluice(&half, d);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("--half runs on CUDA devices only"), "{stderr}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("image 4/4") && text.contains("runs/predict2"), "{text}");
    assert_eq!(std::fs::read_dir(d.join("runs/predict2")).expect("run 2").count(), 4);
}

#[test]
fn a_corrupt_image_is_an_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (images, weights) = setup(d);
    std::fs::write(images.join("broken.jpg"), b"\xff\xd8\xff\xe0 definitely not a whole jpeg").expect("write");
    let args = [
        "predict",
        "--weights",
        weights.to_str().expect("utf-8"),
        "--source",
        images.to_str().expect("utf-8"),
        "--imgsz",
        "64",
    ];
    let out = sluice(&args, d);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("broken.jpg"), "{err}");
}

#[test]
fn a_cuda_device_in_a_cpu_build_is_a_clear_error() {
    // This test binary's `sluice` is built without the `cuda` feature unless CI builds it with one.
    if cfg!(feature = "cuda") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (images, weights) = setup(d);
    let (w, s) = (weights.to_str().expect("utf-8"), images.to_str().expect("utf-8"));
    let out = sluice(&["predict", "--weights", w, "--model", "yolov8n", "--source", s, "--device", "cuda:0"], d);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device cuda:0") && err.contains("--features cuda"), "{err}");
    let out =
        sluice(&["val", "--weights", w, "--model", "yolov8n", "--data", "data/data.yaml", "--device", "cuda:0"], d);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("device cuda:0") && err.contains("--features cuda"), "{err}");
}

/// `sluice predict --end2end` on a YOLO26 checkpoint: the one-to-one head's top-k rows with no NMS, mapped back to
/// the image's pixels and cut at `--conf`, against Ultralytics 8.4.190's `predict(nms=False)` of the same
/// checkpoint and images (`tests/data/predict_e2e/make_predict_e2e.py`; the checkpoint is the one `sluice-model`'s
/// `.pt` tests load): a square image, and a wide one whose letterbox pads it and whose boxes go back by
/// `scale_boxes`' per-axis gains. Rows pair in order (descending score); each agrees in class, in score to 1e-5 of
/// itself and in box to 1e-3 px (float32 rounding of an 80 px image; the measured errors are about 1e-7 and 5e-6 px).
#[test]
fn predict_end2end_rows_match_ultralytics() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = here.join("tests/data/predict_e2e");
    let weights = here.join("../sluice-model/tests/fixtures/pt/y26t.pt");
    let fixture: Value =
        serde_json::from_slice(&std::fs::read(data.join("predict_e2e.json")).expect("fixture")).expect("json");
    let dir = tempfile::tempdir().expect("tempdir");
    let w = weights.to_str().expect("utf-8");
    for image in fixture["images"].as_array().expect("images") {
        let file = image["file"].as_str().expect("file");
        let want = image["rows"].as_array().expect("rows");
        let s = data.join(file);
        let s = s.to_str().expect("utf-8");
        let args =
            ["predict", "--weights", w, "--source", s, "--imgsz", "64", "--conf", "0.001", "--end2end", "--json"];
        let out = sluice(&args, dir.path());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
        let got = report["images"][0]["detections"].as_array().expect("detections");
        assert!(want.len() > 10, "{file}: the fixture has rows to compare");
        assert_eq!(got.len(), want.len(), "{file}: rows above conf 0.001");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g["class"].as_u64(), w["class"].as_u64(), "{file} row {i} class");
            let (gs, ws) = (num(&g["score"]), num(&w["score"]));
            assert!((gs - ws).abs() <= 1e-5 * ws, "{file} row {i} score {gs} vs {ws}");
            let gb: Vec<f64> = g["bbox"].as_array().expect("bbox").iter().map(num).collect();
            let wb: Vec<f64> = w["bbox"].as_array().expect("bbox").iter().map(num).collect();
            for (a, b) in gb.iter().zip(&wb) {
                assert!((a - b).abs() <= 1e-3, "{file} row {i} box {gb:?} vs {wb:?}");
            }
        }
    }
}
