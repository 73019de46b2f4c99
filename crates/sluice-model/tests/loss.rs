//! The v8 detection loss against Ultralytics 8.4 (`tests/data/loss_*`, from `loss/` of the reference fixtures,
//! `$SLUICE_FIXTURES`): one train-mode step of the BN-calibrated yolov8n on two letterboxed coco128 images at 320 —
//! loss items, assigner outputs, gradients of nine parameters and BatchNorm running statistics — and an overfit run.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

use common::loss_fixture::{self, fixture_json, input, targets};
use common::{bncal, npy, rel_l2};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, Mode};

#[test]
fn loss_assigner_gradients_and_bn_stats_match_ultralytics() {
    let j = fixture_json();
    let model = bncal();
    let (raw, _) = model.forward_raw(&input(), Mode::Train).unwrap();
    let loss = DetectionLoss::new(80);
    let out = loss.compute(&raw, &targets()).unwrap();

    // Assigner: exact fg mask and GT indices, target scores within 1e-4.
    let asg = &out.assignment;
    let fg_ref: Vec<u8> = npy("loss_assign_fg_mask.npy").flatten_all().unwrap().to_vec1().unwrap();
    let idx_ref: Vec<i64> = npy("loss_assign_target_gt_idx.npy").flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(asg.fg_count(), 95);
    for i in 0..fg_ref.len() {
        assert_eq!(asg.fg[i], fg_ref[i] == 1, "fg mask at {i}");
        if asg.fg[i] {
            assert_eq!(asg.gt_idx[i] as i64, idx_ref[i], "gt index at {i}");
        }
    }
    let table: Vec<Vec<f64>> = npy("loss_assign_fg_table.npy").to_vec2().unwrap();
    let mut worst = 0.0f64;
    for row in &table {
        let o = row[0] as usize * 2100 + row[1] as usize;
        assert_eq!(asg.label[o], row[3] as usize, "label of anchor {o}");
        worst = worst.max((asg.score[o] as f64 - row[4]).abs());
        for k in 0..4 {
            assert!((asg.bbox[o][k] as f64 - row[5 + k]).abs() < 1e-3, "box of anchor {o}");
        }
    }
    println!("target scores: max abs diff {worst:.3e}");
    assert!(worst <= 1e-4);
    let tss_ref = j["assigner_outputs"]["target_scores_sum"].as_f64().unwrap();
    // A sum of ~30 float32 scores, each within 1e-4 above: relative 1e-5 (the forward's gemm accumulation order
    // differs from PyTorch's, which moves the sum by a few 1e-6 relative).
    assert!((asg.score_sum() - tss_ref).abs() <= 1e-5 * tss_ref, "target_scores_sum {} vs {tss_ref}", asg.score_sum());

    // Loss items and total, rel 1e-4.
    let items_ref: Vec<f64> =
        j["loss"]["items_box_cls_dfl"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    for (k, name) in ["box", "cls", "dfl"].iter().enumerate() {
        let rel = (out.items[k] - items_ref[k]).abs() / items_ref[k];
        println!("{name}: {} vs {} (rel {rel:.2e})", out.items[k], items_ref[k]);
        assert!(rel <= 1e-4, "{name} loss");
    }
    let total = out.total.to_scalar::<f32>().unwrap() as f64;
    let total_ref = j["loss"]["total"].as_f64().unwrap();
    assert!((total - total_ref).abs() / total_ref <= 1e-4, "total {total} vs {total_ref}");

    // Gradients, relative L2 error < 1e-3.
    let grads = out.total.backward().unwrap();
    for name in [
        "model.0.conv.weight",
        "model.0.bn.weight",
        "model.2.m.0.cv1.conv.weight",
        "model.9.cv2.conv.weight",
        "model.15.cv2.conv.weight",
        "model.22.cv2.0.2.weight",
        "model.22.cv2.0.2.bias",
        "model.22.cv3.2.2.weight",
        "model.22.cv3.2.2.bias",
    ] {
        let v = model.var(name).unwrap();
        let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
        let e = rel_l2(g, &npy(&format!("loss_grad_{name}.npy")));
        println!("grad {name}: rel L2 err {e:.2e}");
        assert!(e < 1e-3, "{name}: rel L2 err {e}");
    }

    // BatchNorm running statistics after the one train-mode forward.
    let rm = model.var("model.0.bn.running_mean").unwrap();
    let rv = model.var("model.0.bn.running_var").unwrap();
    common::assert_close("bn0 running_mean", rm.as_tensor(), &npy("loss_bn0_running_mean_after.npy"), 1e-5);
    common::assert_close("bn0 running_var", rv.as_tensor(), &npy("loss_bn0_running_var_after.npy"), 1e-5);
}

#[test]
fn the_dense_loss_matches_ultralytics_and_the_host_path() {
    // The tensor-op assigner and loss (the GPU path) on the host kernels; `loss_cuda_paths.rs` runs it on CUDA's.
    loss_fixture::dense_loss_matches_ultralytics_and_the_host_path(1e-5);
}

#[test]
fn target_rows_outside_the_batch_are_errors() {
    let loss = DetectionLoss::new(80);
    let t = Target { image: 3, class: 1, bbox: BoxXyxy::new(0.0, 0.0, 10.0, 10.0) };
    assert!(loss.group_targets(&[t], 2).is_err());
    let t = Target { image: 0, class: 80, bbox: BoxXyxy::new(0.0, 0.0, 10.0, 10.0) };
    assert!(loss.group_targets(&[t], 2).is_err());
}

#[test]
fn a_few_dozen_steps_overfit_two_images() {
    // The fixture's two letterboxed images downscaled 5x to 64x64 (and their boxes), yolov8n from the bncal
    // weights, AdamW: the total loss must fall by more than half.
    use candle_nn::Optimizer;
    let model = bncal();
    let x = input().avg_pool2d(5).unwrap();
    let targets: Vec<Target> = targets()
        .into_iter()
        .map(|t| Target { bbox: BoxXyxy::new(t.bbox.x1 / 5.0, t.bbox.y1 / 5.0, t.bbox.x2 / 5.0, t.bbox.y2 / 5.0), ..t })
        .collect();
    let vars: Vec<candle_core::Var> = model.trainable_vars().into_iter().map(|(_, v)| v).collect();
    let params = candle_nn::ParamsAdamW { lr: 2e-3, weight_decay: 0.0, ..Default::default() };
    let mut opt = candle_nn::AdamW::new(vars, params).unwrap();
    let loss = DetectionLoss::new(80);
    let mut history = Vec::new();
    for _ in 0..STEPS {
        let (raw, _) = model.forward_raw(&x, Mode::Train).unwrap();
        let out = loss.compute(&raw, &targets).unwrap();
        history.push(out.total.to_scalar::<f32>().unwrap());
        opt.backward_step(&out.total).unwrap();
    }
    println!("overfit losses: {history:?}");
    let (first, last) = (history[0], history[history.len() - 1]);
    assert!(last < 0.5 * first, "loss {first} -> {last}");
}

/// Steps of the overfit run (the loss halves after about 8; 16 keeps a margin and the test short).
const STEPS: usize = 16;
