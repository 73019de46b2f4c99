//! Weights I/O: the safetensors side of the conversion round trip (`scripts/convert_weights.py` holds the
//! PyTorch side), the key set against Ultralytics' state_dict, parameter counts of every scale against
//! Ultralytics' `yolov8.yaml`, and clear errors for wrong files. The reference state dict is
//! `data/yolov8n_seed0.json` (`make_yolov8n_seed0.py` beside it): Ultralytics' seed-0 yolov8n, each tensor's
//! dtype, shape and the SHA-256 of its bytes.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, data, npy, seed0, seed0_file};
use sha2::{Digest, Sha256};
use sluice_model::{LoadMode, ModelError, Scale, Yolo, YoloConfig};

fn load_st(path: &std::path::Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(path, &Device::Cpu).unwrap()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    match t.dtype() {
        DType::F32 => t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::I64 => t.flatten_all().unwrap().to_vec1::<i64>().unwrap().iter().flat_map(|v| v.to_le_bytes()).collect(),
        d => panic!("unexpected dtype {d:?}"),
    }
}

/// Ultralytics' seed-0 yolov8n state dict: key → (dtype, shape, SHA-256 of the little-endian bytes).
fn reference() -> HashMap<String, (String, Vec<usize>, String)> {
    let v: serde_json::Value = serde_json::from_str(include_str!("data/yolov8n_seed0.json")).unwrap();
    let keys = v["keys"].as_object().unwrap();
    keys.iter()
        .map(|(k, e)| {
            let dims = e[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (k.clone(), (e[0].as_str().unwrap().to_string(), dims, e[2].as_str().unwrap().to_string()))
        })
        .collect()
}

#[test]
fn save_gives_back_the_ultralytics_state_dict_bit_for_bit() {
    let original = reference();
    assert_eq!(original.len(), 355);
    let model = seed0();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("roundtrip.safetensors");
    model.save(&out).unwrap();
    let saved = load_st(&out);
    let mut a: Vec<&String> = original.keys().collect();
    let mut b: Vec<&String> = saved.keys().collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "key sets differ");
    let mut differ = Vec::new();
    for (k, (dtype, dims, hash)) in &original {
        let s = &saved[k];
        assert_eq!(&format!("{:?}", s.dtype()).to_uppercase(), dtype, "{k} dtype");
        assert_eq!(s.dims(), dims.as_slice(), "{k} shape");
        if &format!("{:x}", Sha256::digest(bytes(s))) != hash {
            differ.push(k.as_str());
        }
    }
    assert!(differ.is_empty(), "{} of 355 tensors differ from Ultralytics': {differ:?}", differ.len());
    // And the saved file loads back to the same outputs.
    let again = Yolo::load(YoloConfig::new(Scale::N, 80), &out, DType::F32, &Device::Cpu).unwrap();
    let x = npy("parity_in_seed1_320.npy");
    assert_close("reloaded y", &again.forward(&x).unwrap().y, &model.forward(&x).unwrap().y, 0.0);
}

#[test]
fn a_fresh_model_has_ultralytics_keys_shapes_and_parameter_counts() {
    let original = reference();
    let fresh = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu).unwrap().state_dict().unwrap();
    assert_eq!(fresh.len(), original.len());
    for (k, (_, dims, _)) in &original {
        assert_eq!(fresh.get(k).map(|f| f.dims().to_vec()), Some(dims.clone()), "{k}");
    }
    // Ultralytics' head bias init.
    let b: Vec<f32> = fresh["model.22.cv3.0.2.bias"].to_vec1().unwrap();
    assert!((b[0] as f64 - (5.0f64 / 80.0 / 80.0f64.powi(2)).ln()).abs() < 1e-6);
    // Parameter counts from the comments of Ultralytics' yolov8.yaml (nc 80; includes the 16 DFL weights).
    for (scale, want) in [(Scale::N, 3_157_200usize), (Scale::S, 11_166_560), (Scale::M, 25_902_640)] {
        let m = Yolo::new(YoloConfig::new(scale, 80), DType::F32, &Device::Cpu).unwrap();
        let n: usize = m.trainable_vars().iter().map(|(_, v)| v.elem_count()).sum::<usize>() + 16;
        assert_eq!(n, want, "{}", scale.name());
    }
}

#[test]
fn large_scales_have_ultralytics_parameter_counts() {
    // Counted from the shapes alone (no allocation of 68M parameters).
    for (scale, want) in [(Scale::L, 43_691_520usize), (Scale::X, 68_229_648)] {
        let m = Yolo::new(YoloConfig::new(scale, 80), DType::F32, &Device::Cpu).unwrap();
        let n: usize = m.trainable_vars().iter().map(|(_, v)| v.elem_count()).sum::<usize>() + 16;
        assert_eq!(n, want, "{}", scale.name());
    }
}

#[test]
fn wrong_files_give_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let seed0_st = seed0_file(dir.path());
    let mut sd = load_st(&seed0_st);
    sd.remove("model.4.m.1.cv2.bn.running_var");
    let p = dir.path().join("missing.safetensors");
    candle_core::safetensors::save(&sd, &p).unwrap();
    let e = Yolo::load(YoloConfig::new(Scale::N, 80), &p, DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, ModelError::MissingKey { key, .. } if key == "model.4.m.1.cv2.bn.running_var"), "{e}");
    // An overlay may leave keys out.
    let mut m = seed0();
    m.load_weights(&p, LoadMode::Overlay).unwrap();
    // Another class count: the class branch's last conv has another shape.
    let e = Yolo::load(YoloConfig::new(Scale::N, 3), &seed0_st, DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, ModelError::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("yolov8n_seed0.safetensors"), "{e}");
    // Another scale: extra or missing keys.
    let e = Yolo::load(YoloConfig::new(Scale::M, 80), &seed0_st, DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, ModelError::ShapeMismatch { .. } | ModelError::UnexpectedKey { .. }), "{e}");
    // Not a safetensors file.
    let e = Yolo::load(YoloConfig::new(Scale::N, 80), data("parity_in_seed1_320.npy"), DType::F32, &Device::Cpu)
        .unwrap_err();
    assert!(matches!(&e, ModelError::WeightsIo { .. }), "{e}");
    // A wrong DFL projection.
    let mut sd = load_st(&seed0_st);
    sd.insert("model.22.dfl.conv.weight".into(), Tensor::ones((1, 16, 1, 1), DType::F32, &Device::Cpu).unwrap());
    let p = dir.path().join("dfl.safetensors");
    candle_core::safetensors::save(&sd, &p).unwrap();
    let e = Yolo::load(YoloConfig::new(Scale::N, 80), &p, DType::F32, &Device::Cpu).unwrap_err();
    assert!(matches!(&e, ModelError::BadWeight { .. }), "{e}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let m = seed0();
    for shape in [(1usize, 3usize, 100usize, 320usize), (1, 1, 320, 320)] {
        let x = Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(m.forward(&x), Err(ModelError::BadInput(_))), "{shape:?}");
    }
    let x = Tensor::zeros((1, 3, 64, 64), DType::F64, &Device::Cpu).unwrap();
    assert!(matches!(m.forward(&x), Err(ModelError::BadInput(_))));
}

#[test]
fn transfer_takes_what_fits_as_ultralytics_does() {
    // Into a model of the formula's width (a fresh 6-class yolov8n: 64), Ultralytics' `intersect_dicts` of these
    // nc-80 weights keeps 319 of 355 tensors (the class branch's 36 have other shapes).
    let dir = tempfile::tempdir().unwrap();
    let file = seed0_file(dir.path());
    let sd = load_st(&file);
    let mut m = Yolo::new(YoloConfig::new(Scale::N, 6), DType::F32, &Device::Cpu).unwrap();
    let before = m.state_dict().unwrap();
    let t = m.transfer_weights(&file).unwrap();
    assert_eq!((t.loaded, t.total, t.skipped.len()), (319, 355, 36));
    assert!(t.skipped.iter().all(|k| k.starts_with("model.22.cv3.")), "{:?}", t.skipped);
    let after = m.state_dict().unwrap();
    for (k, v) in &after {
        let want = if t.skipped.contains(k) { &before[k] } else { &sd[k] };
        assert!(bytes(v) == bytes(want), "{k}");
    }

    // As a fine-tuning run builds it (Ultralytics 8.4.190's `DetectionModel.load`): the head's inputs match, so the
    // class branch keeps the source's width (80, where a fresh 6-class yolov8n has 64), its hidden layers transfer
    // and only the last convolutions are new, with Ultralytics' bias init for 6 classes: "Transferred 349/355".
    let cfg = YoloConfig::new(Scale::N, 6).for_transfer(&file).unwrap();
    assert_eq!((cfg.cls_width, cfg.cls_hidden()), (Some(80), 80));
    let mut m = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
    let t = m.transfer_weights(&file).unwrap();
    assert_eq!((t.loaded, t.total), (349, 355));
    assert_eq!(t.skipped.iter().filter(|k| k.ends_with(".2.weight") || k.ends_with(".2.bias")).count(), 6);
    let got = m.state_dict().unwrap();
    assert!(bytes(&got["model.22.cv3.0.0.conv.weight"]) == bytes(&sd["model.22.cv3.0.0.conv.weight"]));
    let bias: Vec<f32> = got["model.22.cv3.0.2.bias"].to_vec1().unwrap();
    assert!((f64::from(bias[0]) - (5.0f64 / 6.0 / 80.0f64.powi(2)).ln()).abs() < 1e-5, "{bias:?}");
    // Saved, it loads back with the width its weights have.
    let saved = dir.path().join("wide.safetensors");
    m.save(&saved).unwrap();
    let back = Yolo::load(YoloConfig::new(Scale::N, 6), &saved, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(back.config().cls_hidden(), 80);

    // A Sluice training checkpoint: its `ema.` weights, not the raw model's.
    let mut ckpt = HashMap::new();
    for (k, v) in &sd {
        ckpt.insert(format!("ema.{k}"), v.clone());
        let raw = if v.dtype() == DType::F32 { (v + 1.0).unwrap() } else { v.clone() };
        ckpt.insert(format!("model.{k}"), raw);
    }
    let p = dir.path().join("last.safetensors");
    candle_core::safetensors::save(&ckpt, &p).unwrap();
    let mut m = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu).unwrap();
    let t = m.transfer_weights(&p).unwrap();
    assert_eq!((t.loaded, t.total), (355, 355));
    let got = m.state_dict().unwrap();
    assert!(sd.iter().all(|(k, v)| bytes(v) == bytes(&got[k])));

    // Nothing in common is an error naming the file.
    let p = dir.path().join("other.safetensors");
    candle_core::safetensors::save(&HashMap::from([("x".to_string(), sd["model.0.conv.weight"].clone())]), &p).unwrap();
    let e = m.transfer_weights(&p).unwrap_err();
    assert!(e.to_string().contains("other.safetensors"), "{e}");
}
