//! Forward parity with Ultralytics 8.4 (fixtures from `model/` of the reference fixtures, `$SLUICE_FIXTURES`,
//! copied to `tests/data`): the BN-calibrated and the seed-0 yolov8n at 320×320, the fused model and the folded
//! conv weights, each within the tolerance the fixture README gives.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

use candle_core::{DType, Device};
use common::{assert_close, bncal, data, npy, seed0};
use sluice_model::Mode;

#[test]
fn bncal_forward_matches_ultralytics() {
    let model = bncal();
    let out = model.forward(&npy("parity_in_seed1_320.npy")).unwrap();
    let y_ref = npy("parity_out_bncal_320.npy");
    assert_eq!(out.y.dims(), &[1, 84, 2100]);
    assert_close("bncal y boxes (px)", &out.y.narrow(1, 0, 4).unwrap(), &y_ref.narrow(1, 0, 4).unwrap(), 0.05);
    assert_close("bncal y probs", &out.y.narrow(1, 4, 80).unwrap(), &y_ref.narrow(1, 4, 80).unwrap(), 1e-4);
    assert_close("bncal raw boxes", &out.raw.boxes, &npy("parity_raw_boxes_bncal_320.npy"), 1e-3);
    assert_close("bncal raw scores", &out.raw.scores, &npy("parity_raw_scores_bncal_320.npy"), 1e-3);
    for (i, f) in out.feats.iter().enumerate() {
        assert_close(&format!("bncal P{}", i + 3), f, &npy(&format!("parity_feats_bncal_320_p{}.npy", i + 3)), 1e-3);
    }
}

#[test]
fn bncal_per_layer_statistics_match_ultralytics() {
    let model = bncal();
    let outs = model.forward_layers(&npy("parity_in_seed1_320.npy"), Mode::Eval).unwrap();
    let text = std::fs::read_to_string(data("parity_layer_stats_bncal.json")).unwrap();
    let stats: serde_json::Value = serde_json::from_str(&text).unwrap();
    let layers = stats["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 22);
    for (l, out) in layers.iter().zip(&outs) {
        let name = l["layer"].as_str().unwrap();
        let shape: Vec<usize> = l["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(out.dims(), shape.as_slice(), "{name} shape");
        let o = out.to_dtype(DType::F64).unwrap();
        let sum = o.sum_all().unwrap().to_scalar::<f64>().unwrap();
        let abs_sum = o.abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
        let want = l["sum"].as_f64().unwrap();
        let want_abs = l["abs_sum"].as_f64().unwrap();
        // Sums near zero are compared relative to the absolute sum (a rel test of a cancelling sum is noise).
        let rel = (sum - want).abs() / want.abs().max(1e-3 * want_abs);
        let rel_abs = (abs_sum - want_abs).abs() / want_abs;
        assert!(rel <= 1e-4 && rel_abs <= 1e-4, "{name}: sum {sum} vs {want} (rel {rel:e}), abs {rel_abs:e}");
        let flat: Vec<f32> = out.flatten_all().unwrap().to_vec1().unwrap();
        for s in l["samples_flat_index_value"].as_array().unwrap() {
            let idx = s[0].as_u64().unwrap() as usize;
            let v = s[1].as_f64().unwrap();
            assert!((flat[idx] as f64 - v).abs() <= 1e-3, "{name}[{idx}] = {} vs {v}", flat[idx]);
        }
    }
}

#[test]
fn seed0_forward_matches_ultralytics() {
    let model = seed0();
    let out = model.forward(&npy("parity_in_seed1_320.npy")).unwrap();
    let y_ref = npy("parity_out_seed0_320.npy");
    assert_close("seed0 y boxes (px)", &out.y.narrow(1, 0, 4).unwrap(), &y_ref.narrow(1, 0, 4).unwrap(), 1e-3);
    // Probabilities are sigmoid(logit) with logits within 1e-5: sigmoid' <= 1/4.
    assert_close("seed0 y probs", &out.y.narrow(1, 4, 80).unwrap(), &y_ref.narrow(1, 4, 80).unwrap(), 2.5e-6);
    assert_close("seed0 P5", &out.feats[2], &npy("parity_feats_seed0_320_p5.npy"), 1e-9);
}

#[test]
fn fused_model_matches_ultralytics_fuse() {
    let model = bncal();
    let x = npy("parity_in_seed1_320.npy");
    let fused = model.fuse().unwrap();
    assert!(fused.is_fused());
    let yf = fused.forward(&x).unwrap().y;
    let y_ref = npy("parity_out_bncal_fused_320.npy");
    assert_close("fused y boxes (px)", &yf.narrow(1, 0, 4).unwrap(), &y_ref.narrow(1, 0, 4).unwrap(), 0.05);
    assert_close("fused y probs", &yf.narrow(1, 4, 80).unwrap(), &y_ref.narrow(1, 4, 80).unwrap(), 1e-4);
    // The eval forward folds each BatchNorm on the fly with the same arithmetic, so the two agree bit for bit (the
    // trainer's validation relies on it when it folds once per pass).
    let (out_f, out_u) = (fused.forward(&x).unwrap(), model.forward(&x).unwrap());
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
    };
    assert!(bits(&out_f.y) == bits(&out_u.y), "fused and unfused decoded outputs differ");
    assert!(bits(&out_f.raw.boxes) == bits(&out_u.raw.boxes), "fused and unfused raw boxes differ");
    assert!(bits(&out_f.raw.scores) == bits(&out_u.raw.scores), "fused and unfused raw scores differ");
    assert!(fused.forward_raw(&x, Mode::Train).is_err(), "a fused model cannot train");
}

#[test]
fn folded_conv_weights_match_ultralytics() {
    let fused = bncal().fuse().unwrap();
    let samples = candle_core::safetensors::load(data("parity_fused_conv_samples.safetensors"), &Device::Cpu).unwrap();
    assert_eq!(samples.len(), 12);
    for module in ["model.0", "model.2.m.0.cv1", "model.9.cv2", "model.15.cv2", "model.22.cv2.0.0", "model.22.cv3.2.1"]
    {
        let (w, b) = fused.conv_params(module).unwrap_or_else(|| panic!("{module} not found"));
        let b = b.unwrap_or_else(|| panic!("{module} has no folded bias"));
        for (name, got) in [("weight", &w), ("bias", &b)] {
            let want = &samples[&format!("{module}.conv.{name}")];
            let g: Vec<f32> = got.flatten_all().unwrap().to_vec1().unwrap();
            let r: Vec<f32> = want.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(g.len(), r.len(), "{module}.{name} size");
            let worst = g
                .iter()
                .zip(&r)
                .map(|(a, b)| (a - b).abs() as f64 / (b.abs() as f64).max(1e-30))
                .fold(0.0f64, f64::max);
            assert!(worst <= 1e-5, "{module}.{name}: worst relative error {worst:e}");
        }
    }
}
