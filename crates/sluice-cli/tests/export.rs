//! `sluice model convert` and `sluice export` end to end on the Ultralytics `.pt` fixtures of sluice-model
//! (`crates/sluice-model/tests/fixtures/pt/`, written by the script beside them): the conversion gives the tensors
//! of `scripts/convert_weights.py`'s conversion bit for bit, the export writes an ONNX file with the checkpoint's
//! class names in its metadata, and what is not built or not supported is an error naming it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use sluice_model::candle_core::{DType, Device, Tensor};
use sluice_model::{Family, LoadMode, Scale, Yolo, YoloConfig};

fn pt(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/fixtures/pt").join(name)
}

/// A fixture model of sluice-model's YOLO11/YOLO26 parity tests written as a file: torch's seed-0 draws (which those
/// tests hold to the fixture's hashes) rounded to float16 as the fixture script rounds them, then the tensors the
/// script changed (`overlay`).
fn fixture_weights(cfg: YoloConfig, overlay: &Path, out: &Path) -> PathBuf {
    let mut m = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 0).expect("seeded model");
    let sd: HashMap<String, Tensor> = m
        .state_dict()
        .expect("state dict")
        .into_iter()
        .map(|(k, t)| {
            let t = if t.dtype() == DType::F32 {
                t.to_dtype(DType::F16).and_then(|h| h.to_dtype(DType::F32))
            } else {
                Ok(t)
            };
            (k, t.expect("round"))
        })
        .collect();
    m.load_state_dict(&sd, LoadMode::Strict, overlay).expect("rounded");
    m.load_weights(overlay, LoadMode::Overlay).expect("overlay");
    m.save(out).expect("save");
    out.to_path_buf()
}

fn sluice(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sluice")).args(args).output().expect("run sluice")
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn bits(path: &Path) -> Vec<(String, Vec<u32>)> {
    let mut v: Vec<(String, Vec<u32>)> = sluice_model::candle_core::safetensors::load(path, &Device::Cpu)
        .expect("load safetensors")
        .into_iter()
        .map(|(k, t)| {
            let f = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1::<f32>());
            (k, f.expect("values").into_iter().map(f32::to_bits).collect())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn convert_gives_the_python_conversion_bit_for_bit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("ema.safetensors");
    let w = pt("v8t_trainer.pt");
    let o = sluice(&[
        "model",
        "convert",
        "--weights",
        w.to_str().expect("utf-8"),
        "--output",
        out.to_str().expect("utf-8"),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("3 classes: cat, dog, bird") && text(&o).contains("`ema`"), "{}", text(&o));
    assert_eq!(bits(&out), bits(&pt("v8t_trainer_ema.safetensors")));
}

#[test]
fn export_writes_onnx_with_the_checkpoint_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("m.onnx");
    let (w, o) = (pt("v8t_save.pt"), out.to_str().expect("utf-8").to_string());
    let r = sluice(&["export", "--weights", w.to_str().expect("utf-8"), "--imgsz", "64,96", "--output", &o]);
    assert!(r.status.success(), "{}", text(&r));
    assert!(text(&r).contains("output output0 (1, 7, 126)"), "{}", text(&r));
    let bytes = std::fs::read(&out).expect("onnx written");
    let find = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
    assert!(find("{0: 'cat', 1: 'dog', 2: 'bird'}") && find("images") && find("output0"));

    let r = sluice(&["export", "--weights", w.to_str().expect("utf-8"), "--nms", "--output", &o]);
    assert!(!r.status.success() && text(&r).contains("--nms is not built"), "{}", text(&r));
    let seg = pt("v8t_seg.pt");
    let r = sluice(&["export", "--weights", seg.to_str().expect("utf-8"), "--output", &o]);
    assert!(!r.status.success() && text(&r).contains("segmentation"), "{}", text(&r));
}

#[test]
fn model_run_writes_what_ultralytics_returns_for_yolo11_and_yolo26() {
    let fx = |family: &str, name: &str| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-model/tests/fixtures").join(family).join(name)
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("yolo26t.yaml");
    std::fs::write(&cfg, "family: yolo26\ndepth_multiple: 0.5\nwidth_multiple: 0.125\n").expect("yaml");
    let y11 = fixture_weights(
        YoloConfig::new(Scale::N, 3).with_family(Family::V11),
        &fx("yolo11", "y11n_c3_bn.safetensors"),
        &dir.path().join("y11n_c3.safetensors"),
    );
    let y26 = fixture_weights(
        YoloConfig::new(Scale::custom(0.5, 0.125, 1024).expect("scale"), 3).with_family(Family::V26),
        &fx("yolo26", "y26t_c3_overlay.safetensors"),
        &dir.path().join("y26t_c3.safetensors"),
    );
    let cases = [
        ("yolo11n".to_string(), y11, fx("yolo11", "y11n_in_128.npy"), None),
        (cfg.to_str().expect("utf-8").to_string(), y26.clone(), fx("yolo26", "y26t_in_128.npy"), None),
        (cfg.to_str().expect("utf-8").to_string(), y26, fx("yolo26", "y26t_in_128.npy"), Some("--end2end")),
    ];
    let wants = [fx("yolo11", "y11n_out_128.npy"), fx("yolo26", "y26t_out_128.npy"), fx("yolo26", "y26t_e2e_128.npy")];
    for ((model, weights, input, extra), want) in cases.iter().zip(&wants) {
        let out = dir.path().join("y.npy");
        let mut args = vec![
            "model",
            "run",
            "--model",
            model,
            "--nc",
            "3",
            "--weights",
            weights.to_str().expect("utf-8"),
            "--input",
            input.to_str().expect("utf-8"),
            "--output",
            out.to_str().expect("utf-8"),
        ];
        args.extend(extra.iter());
        let r = sluice(&args);
        assert!(r.status.success(), "{}", text(&r));
        let got = sluice_model::candle_core::Tensor::read_npy(&out).expect("output");
        let want = sluice_model::candle_core::Tensor::read_npy(want).expect("reference");
        assert_eq!(got.dims(), want.dims(), "{model} {extra:?}");
        // The end-to-end rows are compared by score (tied rows may swap places, see sluice-model's tests/yolo26.rs).
        let (got, want) = if extra.is_some() {
            (got.narrow(2, 4, 1).expect("scores"), want.narrow(2, 4, 1).expect("scores"))
        } else {
            (got, want)
        };
        let d = (got - want)
            .and_then(|t| t.abs())
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.max(0))
            .and_then(|t| t.to_scalar::<f32>())
            .expect("difference");
        assert!(d < 2e-3, "{model} {extra:?}: max abs difference {d}");
    }
}
