//! YOLO11 against Ultralytics 8.4 (`tests/fixtures/yolo11`, made by `make_yolo11_fixture.py` beside them): yolo11n
//! with 3 classes and randomised BatchNorms on a (2, 3, 128, 128) input — the eval output and every top-level
//! layer, the folded model, and one train-mode step (loss items, the gradient of every parameter, BatchNorm
//! running statistics).
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, check_stats};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, Family, Mode, Scale, Yolo, YoloConfig};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/yolo11").join(name)
}

fn json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture("y11n_fixture.json")).unwrap()).unwrap()
}

fn model() -> Yolo {
    let cfg = YoloConfig::from_model("yolo11n", 3).unwrap();
    assert_eq!(cfg, YoloConfig::new(Scale::N, 3).with_family(Family::V11));
    common::seeded_f16(cfg, &fixture("y11n_c3_bn.safetensors"), &json()["state_dict_f16"])
}

fn input() -> Tensor {
    Tensor::read_npy(fixture("y11n_in_128.npy")).unwrap()
}

#[test]
fn eval_forward_matches_ultralytics() {
    let m = model();
    let j = json();
    let x = input();
    let outs = m.forward_layers(&x, Mode::Eval).unwrap();
    let layers = j["layers"].as_array().unwrap();
    assert_eq!(outs.len(), layers.len());
    for (o, l) in outs.iter().zip(layers) {
        check_stats(l["layer"].as_str().unwrap(), o, l, 1e-4, 1e-4);
    }
    let y = m.forward(&x).unwrap().y;
    let y_ref = Tensor::read_npy(fixture("y11n_out_128.npy")).unwrap();
    assert_eq!(y.dims(), &[2, 7, 336]);
    assert_close("y boxes (px)", &y.narrow(1, 0, 4).unwrap(), &y_ref.narrow(1, 0, 4).unwrap(), 2e-3);
    assert_close("y probs", &y.narrow(1, 4, 3).unwrap(), &y_ref.narrow(1, 4, 3).unwrap(), 1e-5);
    // The folded model gives the same output.
    let fused = m.fuse().unwrap().forward(&x).unwrap().y;
    assert_close("fused y", &fused, &y_ref, 2e-3);
    // A round trip through Ultralytics' key names keeps every value.
    let dir = tempfile::tempdir().unwrap();
    m.save(dir.path().join("y11.safetensors")).unwrap();
    let again = Yolo::load(m.config(), dir.path().join("y11.safetensors"), DType::F32, &Device::Cpu).unwrap();
    assert_close("reloaded y", &again.forward(&x).unwrap().y, &y, 0.0);
}

#[test]
fn train_step_matches_ultralytics() {
    let m = model();
    let j = json();
    let targets: Vec<Target> = j["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let r: Vec<f32> = r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            Target {
                image: r[0] as u32,
                class: r[1] as u32,
                bbox: BoxXyxy::from_cxcywh(r[2] * 128.0, r[3] * 128.0, r[4] * 128.0, r[5] * 128.0),
            }
        })
        .collect();
    let (raw, _) = m.forward_raw(&input(), Mode::Train).unwrap();
    let out = DetectionLoss::new(3).compute(&raw, &targets).unwrap();
    let items: Vec<f64> =
        j["loss"]["items_box_cls_dfl"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    for (k, name) in ["box", "cls", "dfl"].iter().enumerate() {
        let rel = (out.items[k] - items[k]).abs() / items[k];
        println!("{name}: {} vs {} (rel {rel:.2e})", out.items[k], items[k]);
        assert!(rel <= 1e-4, "{name} loss");
    }
    let grads = out.total.backward().unwrap();
    let want = j["grads"].as_object().unwrap();
    let vars = m.trainable_vars();
    assert_eq!(vars.len(), want.len(), "parameters with a gradient");
    let mut worst = (0f64, String::new());
    for (name, v) in &vars {
        let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
        let s = &want[name.as_str()];
        let g64 = g.to_dtype(DType::F64).unwrap();
        let l2 = g64.sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap().sqrt();
        let want_l2 = s["l2"].as_f64().unwrap();
        let rel = (l2 - want_l2).abs() / want_l2.max(1e-12);
        if want_l2 > 1e-5 && rel > worst.0 {
            worst = (rel, name.clone());
        }
        check_stats(&format!("grad {name}"), g, s, 2e-3, 1e-6);
    }
    println!("gradient L2 norms above 1e-5: worst relative difference {:.2e} ({})", worst.0, worst.1);
    assert!(worst.0 < 1e-3, "gradient norm of {}", worst.1);
    for (bn, s) in j["bn_after_train_forward"].as_object().unwrap() {
        for stat in ["running_mean", "running_var"] {
            let v = m.var(&format!("{bn}.{stat}")).unwrap();
            check_stats(&format!("{bn}.{stat}"), v.as_tensor(), &s[stat], 1e-5, 1e-6);
        }
    }
}
