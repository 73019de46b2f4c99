//! Helpers shared by the integration tests: fixture paths, the reference models and comparisons.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.
#![allow(dead_code)]

pub(crate) mod loss_fixture;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use sluice_model::{LoadMode, Scale, Yolo, YoloConfig};

/// `tests/data/<name>`.
pub(crate) fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A fixture `.npy` as a tensor.
pub(crate) fn npy(name: &str) -> Tensor {
    Tensor::read_npy(data(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The seed-0 yolov8n (nc 80): Ultralytics' `DetectionModel('yolov8n.yaml', nc=80)` after `torch.manual_seed(0)`,
/// drawn here as PyTorch draws it (`tests/weights.rs` holds it to `data/yolov8n_seed0.json`, Ultralytics' state
/// dict hashed key by key, so every reference output of that model applies to this one).
pub(crate) fn seed0() -> Yolo {
    Yolo::new_seeded(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu, 0).unwrap()
}

/// [`seed0`] saved as `yolov8n_seed0.safetensors` in `dir`: the file Ultralytics' state dict would give.
pub(crate) fn seed0_file(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("yolov8n_seed0.safetensors");
    seed0().save(&p).unwrap();
    p
}

/// A fixture model whose state dict Ultralytics' script made from torch's seed-0 draws, changed some tensors (the
/// BatchNorms randomised, ...) and rounded every float to float16: the draws are made here (`Yolo::new_seeded`,
/// seed 0) and rounded as the script rounds them, the changed tensors come from `overlay`, and every tensor is held
/// to `manifest` (key → [dtype, shape, SHA-256 of its float16 bytes]), so a model that is not the fixture's fails
/// here, not as output drift.
pub(crate) fn seeded_f16(cfg: YoloConfig, overlay: &std::path::Path, manifest: &serde_json::Value) -> Yolo {
    use sha2::{Digest, Sha256};
    let mut m = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 0).unwrap();
    let sd: std::collections::HashMap<String, Tensor> = m
        .state_dict()
        .unwrap()
        .into_iter()
        .map(|(k, t)| {
            let t =
                if t.dtype() == DType::F32 { t.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap() } else { t };
            (k, t)
        })
        .collect();
    m.load_state_dict(&sd, LoadMode::Strict, overlay).unwrap();
    m.load_weights(overlay, LoadMode::Overlay).unwrap();
    let manifest = manifest.as_object().unwrap();
    let sd = m.state_dict().unwrap();
    let mut differ = Vec::new();
    for (k, want) in manifest {
        let t = sd.get(k).unwrap_or_else(|| panic!("no tensor {k}"));
        let shape: Vec<usize> = want[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        assert_eq!(t.dims(), shape.as_slice(), "{k} shape");
        let h = t.to_dtype(DType::F16).unwrap().flatten_all().unwrap().to_vec1::<half::f16>().unwrap();
        let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
        if format!("{:x}", Sha256::digest(&bytes)) != want[2].as_str().unwrap() {
            differ.push(k.as_str());
        }
    }
    assert!(differ.is_empty(), "{} of {} tensors differ from the fixture's: {differ:?}", differ.len(), manifest.len());
    m
}

/// The BN-calibrated yolov8n model of the fixture (seed-0 weights + the BN overlay).
pub(crate) fn bncal() -> Yolo {
    let mut m = seed0();
    m.load_weights(data("yolov8n_seed0_bncal_overlay.safetensors"), LoadMode::Overlay).unwrap();
    m
}

/// Largest absolute difference.
pub(crate) fn max_abs(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// Asserts `max |a - b| <= tol`, printing the figure.
pub(crate) fn assert_close(what: &str, a: &Tensor, b: &Tensor, tol: f64) {
    let d = max_abs(a, b);
    println!("{what}: max abs diff {d:.3e} (tolerance {tol:.0e})");
    assert!(d <= tol, "{what}: max abs diff {d:e} > {tol:e}");
}

/// Relative L2 error `||a - b|| / ||b||`.
pub(crate) fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let a = a.to_dtype(DType::F64).unwrap();
    let b = b.to_dtype(DType::F64).unwrap();
    let n = |t: &Tensor| t.sqr().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap().sqrt();
    n(&(a - &b).unwrap()) / n(&b)
}

/// Compares a tensor with the fixture's `{shape, sum, abs_sum, l2, samples}` record: relative to its size, with
/// an absolute floor of `abs` per element (a gradient that cancels to float32 noise has no relative precision).
pub(crate) fn check_stats(what: &str, t: &Tensor, s: &serde_json::Value, rel: f64, abs: f64) {
    let n = t.elem_count() as f64;
    let shape: Vec<usize> = s["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!(t.dims(), shape.as_slice(), "{what} shape");
    let t = t.to_dtype(DType::F64).unwrap();
    let abs_sum = t.abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
    let want_abs = s["abs_sum"].as_f64().unwrap();
    let sum = t.sum_all().unwrap().to_scalar::<f64>().unwrap();
    let want = s["sum"].as_f64().unwrap();
    let scale = want_abs.max(1e-12);
    assert!((abs_sum - want_abs).abs() <= rel * scale + abs * n, "{what}: sum |x| {abs_sum} vs {want_abs}");
    assert!((sum - want).abs() <= rel * scale + abs * n, "{what}: sum {sum} vs {want} (sum |x| {want_abs})");
    let flat: Vec<f64> = t.flatten_all().unwrap().to_vec1().unwrap();
    let max = flat.iter().fold(0f64, |m, v| m.max(v.abs()));
    for p in s["samples"].as_array().unwrap() {
        let (i, v) = (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap());
        assert!((flat[i] - v).abs() <= rel * max + abs, "{what}[{i}] = {} vs {v} (max |x| {max})", flat[i]);
    }
}
