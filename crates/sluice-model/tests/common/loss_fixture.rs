//! The one-step loss fixture of `tests/loss.rs` (Ultralytics 8.4, two letterboxed coco128 images at 320) and the
//! dense loss's check against it, shared by the host-path and CUDA-path test binaries.

use candle_core::{DType, Tensor};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, Mode};

use super::{bncal, data, npy, rel_l2};

pub(crate) fn fixture_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(data("loss_fixture.json")).unwrap()).unwrap()
}

/// The fixture input: uint8 image / 255 in float32, as Ultralytics feeds it.
pub(crate) fn input() -> Tensor {
    (npy("loss_in_320_u8.npy").to_dtype(DType::F32).unwrap() / 255.0).unwrap()
}

/// `loss_targets.npy` rows (batch_idx, class, cx, cy, w, h normalised) as pixel boxes on the 320 canvas.
pub(crate) fn targets() -> Vec<Target> {
    let rows: Vec<Vec<f32>> = npy("loss_targets.npy").to_vec2().unwrap();
    rows.iter()
        .map(|r| Target {
            image: r[0] as u32,
            class: r[1] as u32,
            bbox: BoxXyxy::from_cxcywh(r[2] * 320.0, r[3] * 320.0, r[4] * 320.0, r[5] * 320.0),
        })
        .collect()
}

/// The tensor-op assigner and loss (the GPU path) against the Ultralytics fixture and the host path: the fg mask,
/// assigned boxes and scores, the loss items (within 1e-4 of Ultralytics' and `host_tol` of the host path's), and
/// four parameters' gradients.
pub(crate) fn dense_loss_matches_ultralytics_and_the_host_path(host_tol: f64) {
    let j = fixture_json();
    let model = bncal();
    let (raw, _) = model.forward_raw(&input(), Mode::Train).unwrap();
    let loss = DetectionLoss::new(80);
    let host = loss.compute(&raw, &targets()).unwrap();
    let (classes, boxes, mask) = sluice_model::padded_targets(&targets(), 2, &candle_core::Device::Cpu).unwrap();
    let out =
        loss.compute_dense(&raw, sluice_model::DenseTargets { classes: &classes, boxes: &boxes, mask: &mask }).unwrap();
    let asg = &out.assignment;
    let fg: Vec<f32> = asg.fg.flatten_all().unwrap().to_vec1().unwrap();
    let gt_idx: Vec<u32> = asg.gt_idx.flatten_all().unwrap().to_vec1().unwrap();
    let label: Vec<u32> = asg.label.flatten_all().unwrap().to_vec1().unwrap();
    let score: Vec<f32> = asg.score.flatten_all().unwrap().to_vec1().unwrap();
    let fg_ref: Vec<u8> = npy("loss_assign_fg_mask.npy").flatten_all().unwrap().to_vec1().unwrap();
    let idx_ref: Vec<i64> = npy("loss_assign_target_gt_idx.npy").flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(fg.iter().filter(|&&f| f == 1.0).count(), 95);
    for i in 0..fg_ref.len() {
        assert_eq!(fg[i] == 1.0, fg_ref[i] == 1, "fg mask at {i}");
        if fg_ref[i] == 1 {
            assert_eq!(gt_idx[i] as i64, idx_ref[i], "gt index at {i}");
            assert_eq!(label[i] as usize, host.assignment.label[i], "label at {i}");
            assert!((score[i] - host.assignment.score[i]).abs() <= 1e-5, "score at {i}");
        } else {
            assert_eq!(score[i], 0.0, "score off the foreground at {i}");
        }
    }
    let items: Vec<f32> = out.items.to_vec1().unwrap();
    let items_ref: Vec<f64> =
        j["loss"]["items_box_cls_dfl"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    for (k, name) in ["box", "cls", "dfl"].iter().enumerate() {
        let rel = (items[k] as f64 - items_ref[k]).abs() / items_ref[k];
        let rel_host = (items[k] as f64 - host.items[k]).abs() / host.items[k];
        println!("dense {name}: {} vs Ultralytics {} (rel {rel:.2e}), host rel {rel_host:.2e}", items[k], items_ref[k]);
        assert!(rel <= 1e-4, "{name} loss vs Ultralytics");
        assert!(rel_host <= host_tol, "{name} loss vs the host path");
    }
    let grads = out.total.backward().unwrap();
    for name in ["model.0.conv.weight", "model.9.cv2.conv.weight", "model.22.cv2.0.2.weight", "model.22.cv3.2.2.bias"] {
        let v = model.var(name).unwrap();
        let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
        let e = rel_l2(g, &npy(&format!("loss_grad_{name}.npy")));
        println!("dense grad {name}: rel L2 err {e:.2e}");
        assert!(e < 1e-3, "{name}: rel L2 err {e}");
    }
}
