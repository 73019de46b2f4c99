//! Mixed precision ([`Yolo::set_autocast`]): the half-precision train-mode step against the f32 one on the same
//! weights and batch, on the CPU; and the half-precision inference copy ([`Yolo::fuse_to`], `--half`) against the
//! f32 fused model. The trainer uses f16 (`amp: true`) or bf16 on a GPU (cuDNN); candle 0.11's CPU conv2d has no bf16
//! matmul (it calls its f16/f32/f64-only gemm directly), so the CPU test runs the same graph with f16, which
//! exercises the same casts, gradients and master weights. the device check `gpu smoke` checks bf16 on the device.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

use candle_core::{DType, Device, Tensor};
use sluice_model::{Mode, Scale, Yolo, YoloConfig};

fn model() -> Yolo {
    Yolo::new_seeded(YoloConfig::new(Scale::N, 3), DType::F32, &Device::Cpu, 7).unwrap()
}

fn batch() -> Tensor {
    let n = 2 * 3 * 128 * 128;
    let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.618_034).fract() * 0.9 + 0.05).collect();
    Tensor::from_vec(v, (2, 3, 128, 128), &Device::Cpu).unwrap()
}

/// A train-mode forward and a scalar of every head output (so every weight gets a gradient), with the gradients
/// of the named weights.
fn step(m: &Yolo, x: &Tensor, names: &[&str]) -> (Vec<f32>, Vec<Vec<f32>>, Vec<DType>) {
    let (raw, _) = m.forward_raw(x, Mode::Train).unwrap();
    let out = Tensor::cat(&[&raw.boxes, &raw.scores], 1).unwrap();
    // Summed, not averaged: the gradients stay well inside f16's range without a loss scale.
    let loss = (out.sqr().unwrap().sum_all().unwrap() + out.sum_all().unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    let mut gs = Vec::new();
    let mut dtypes = Vec::new();
    for n in names {
        let v = m.var(n).unwrap();
        let g = grads.get(v.as_tensor()).unwrap();
        dtypes.push(g.dtype());
        gs.push(g.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap());
    }
    (out.flatten_all().unwrap().to_vec1().unwrap(), gs, dtypes)
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

const NAMES: &[&str] = &[
    "model.0.conv.weight",
    "model.0.bn.weight",
    "model.4.m.0.cv1.conv.weight",
    "model.9.cv2.conv.weight",
    "model.21.cv2.conv.weight",
    "model.22.cv2.0.0.conv.weight",
    "model.22.cv3.2.2.weight",
];

#[test]
fn half_precision_convolutions_track_the_f32_step_and_keep_f32_gradients() {
    let x = batch();
    let f32_model = model();
    let (out32, g32, d32) = step(&f32_model, &x, NAMES);
    assert!(d32.iter().all(|d| *d == DType::F32));

    let amp_model = model();
    amp_model.set_autocast(Some(DType::F16)).unwrap();
    assert_eq!(amp_model.autocast(), Some(DType::F16));
    let (out16, g16, d16) = step(&amp_model, &x, NAMES);
    // Master weights and their gradients stay f32.
    assert!(d16.iter().all(|d| *d == DType::F32), "{d16:?}");
    assert_eq!(amp_model.var(NAMES[0]).unwrap().dtype(), DType::F32);
    // f16 keeps 11 significant bits (bf16 8): the outputs agree to under a per cent and the gradients, through
    // BatchNorm's batch statistics, to a few per cent; not to f32 rounding.
    let e = rel_err(&out16, &out32);
    assert!(e < 0.02, "head outputs: relative error {e}");
    assert!(e > 1e-6, "the half path must actually round (relative error {e})");
    for (n, (a, b)) in NAMES.iter().zip(g16.iter().zip(&g32)) {
        let e = rel_err(a, b);
        // Measured 0.002–0.09 (the deeper and the fewer the BatchNorm samples, the larger); a broken cast or a
        // lost gradient path gives 1 or more.
        assert!(e < 0.15, "{n}: gradient relative error {e}");
    }

    // The activations stay in f16 from layer to layer; the head's outputs come back in f32.
    let layers = amp_model.forward_layers(&x, Mode::Train).unwrap();
    assert!(
        layers.iter().all(|t| t.dtype() == DType::F16),
        "{:?}",
        layers.iter().map(|t| t.dtype()).collect::<Vec<_>>()
    );

    // Switched off again: the same numbers as the f32 model (same seed, same batch, running stats untouched
    // by the comparison because the f32 model is a separate copy).
    let again = model();
    again.set_autocast(Some(DType::BF16)).unwrap();
    again.set_autocast(None).unwrap();
    let (out_off, g_off, _) = step(&again, &x, NAMES);
    assert_eq!(out_off, out32);
    assert_eq!(g_off, g32);
}

#[test]
fn autocast_takes_half_dtypes_on_f32_unfused_models_only() {
    let m = model();
    assert!(m.set_autocast(Some(DType::F32)).is_err());
    assert!(m.set_autocast(Some(DType::F16)).is_ok());
    assert_eq!(m.try_clone().unwrap().autocast(), None, "a copy starts with mixed precision off");
    let fused = m.fuse().unwrap();
    assert_eq!(fused.autocast(), None);
    assert!(fused.set_autocast(Some(DType::BF16)).is_err());
    let f64_model = Yolo::new(YoloConfig::new(Scale::N, 3), DType::F64, &Device::Cpu).unwrap();
    assert!(f64_model.set_autocast(Some(DType::BF16)).is_err());
    assert!(f64_model.set_autocast(None).is_ok());
}

/// `fuse_to(F16)` (Ultralytics' `fuse()` then `half()`): every family's eval output in f16, within half precision
/// of the f32 fused model's; `fuse_to` the model's own dtype is `fuse` exactly.
#[test]
fn the_half_inference_copy_tracks_the_f32_fused_model() {
    let x = batch();
    for name in ["yolov8n", "yolo11n", "yolo26n"] {
        let cfg = sluice_model::parse_model(name).unwrap().config(3);
        let m = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 11).unwrap();
        let f32_fused = m.fuse().unwrap();
        let same = m.fuse_to(DType::F32).unwrap();
        let half = m.fuse_to(DType::F16).unwrap();
        assert_eq!((half.dtype(), half.is_fused()), (DType::F16, true));
        let y32 = f32_fused.forward(&x).unwrap().y;
        let y_same = same.forward(&x).unwrap().y;
        let y16 = half.forward(&x.to_dtype(DType::F16).unwrap()).unwrap().y;
        assert_eq!(y16.dtype(), DType::F16, "{name}");
        let flat =
            |t: &Tensor| -> Vec<f32> { t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap() };
        assert_eq!(flat(&y_same), flat(&y32), "{name}: fuse_to(F32) is fuse");
        let err = rel_err(&flat(&y16), &flat(&y32));
        // Boxes in pixels up to 128 and class scores in (0, 1): f16's 11-bit mantissa through some 60 layers.
        assert!(err < 5e-3, "{name}: f16 relative error {err:e}");
        assert!(err > 0.0, "{name}: the half copy computed in f32");
    }
}

/// YOLO11 and YOLO26 (attention, depthwise and `act=False` convolutions, YOLO26's one-bin head) under f16
/// activations: the train step runs, its outputs are f32 and track the f32 step, every weight gradient is f32.
#[test]
fn every_family_trains_with_half_activations() {
    let x = batch();
    for name in ["yolo11n", "yolo26n"] {
        let cfg = sluice_model::parse_model(name).unwrap().config(3);
        let step_of = |half: Option<DType>| {
            let m = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 5).unwrap();
            m.set_autocast(half).unwrap();
            let (raw, feats) = m.forward_raw(&x, Mode::Train).unwrap();
            let mut parts = vec![raw.boxes.clone(), raw.scores.clone()];
            // YOLO26's one-to-one branches, so that every weight gets a gradient.
            if let Some(o) = m.forward_one2one(&feats, Mode::Train).unwrap() {
                parts.extend([o.boxes, o.scores]);
            }
            let out = Tensor::cat(&parts, 1).unwrap();
            assert_eq!(out.dtype(), DType::F32, "{name}");
            let loss = (out.sqr().unwrap().sum_all().unwrap() + out.sum_all().unwrap()).unwrap();
            let grads = loss.backward().unwrap();
            for (k, v) in m.trainable_vars() {
                let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("{name}: no gradient for {k}"));
                assert_eq!(g.dtype(), DType::F32, "{name}: {k}");
            }
            out.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        let e = rel_err(&step_of(Some(DType::F16)), &step_of(None));
        assert!(e < 0.02 && e > 1e-6, "{name}: head outputs relative error {e}");
    }
}
