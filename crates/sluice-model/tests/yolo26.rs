//! YOLO26's model against Ultralytics 8.4 (`tests/fixtures/yolo26`, made by `make_yolo26_fixture.py` beside them):
//! yolo26.yaml at depth 0.5 / width 0.125 with 3 classes and randomised BatchNorms on a (2, 3, 128, 128) input —
//! every top-level layer, the default (one-to-many) eval output, the end-to-end top-300 output of the one-to-one
//! head, and the folded model.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use common::{assert_close, check_stats};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, Family, Mode, Scale, Yolo, YoloConfig};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/yolo26").join(name)
}

fn model() -> Yolo {
    let cfg = YoloConfig::new(Scale::custom(0.5, 0.125, 1024).unwrap(), 3).with_family(Family::V26);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("y26t_fixture.json")).unwrap()).unwrap();
    common::seeded_f16(cfg, &fixture("y26t_c3_overlay.safetensors"), &j["state_dict_f16"])
}

fn npy(name: &str) -> Tensor {
    Tensor::read_npy(fixture(name)).unwrap()
}

#[test]
fn eval_and_end2end_outputs_match_ultralytics() {
    let m = model();
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("y26t_fixture.json")).unwrap()).unwrap();
    let x = npy("y26t_in_128.npy");
    let outs = m.forward_layers(&x, Mode::Eval).unwrap();
    let layers = j["layers"].as_array().unwrap();
    assert_eq!(outs.len(), layers.len());
    for (o, l) in outs.iter().zip(layers) {
        let name = l["layer"].as_str().unwrap();
        let shape: Vec<usize> = l["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(o.dims(), shape.as_slice(), "{name}");
        let o64 = o.to_dtype(DType::F64).unwrap();
        let abs_sum = o64.abs().unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap();
        let want = l["abs_sum"].as_f64().unwrap();
        assert!((abs_sum - want).abs() <= 1e-4 * want, "{name}: sum |x| {abs_sum} vs {want}");
    }
    let y = m.forward(&x).unwrap().y;
    let y_ref = npy("y26t_out_128.npy");
    assert_close("one-to-many y boxes (px)", &y.narrow(1, 0, 4).unwrap(), &y_ref.narrow(1, 0, 4).unwrap(), 2e-3);
    assert_close("one-to-many y probs", &y.narrow(1, 4, 3).unwrap(), &y_ref.narrow(1, 4, 3).unwrap(), 1e-5);

    let e2e = m.forward_end2end(&x, 300).unwrap();
    let e2e_ref = npy("y26t_e2e_128.npy");
    assert_eq!(e2e.dims(), &[2, 300, 6]);
    // The same scores in the same order, and the same rows: each of ours is one of Ultralytics' (same class, score
    // and box within float32 noise). Rows whose scores tie (the padding's anchors see identical inputs) come in
    // either order, as torch's top-k leaves their order unspecified.
    assert_close("end-to-end scores", &e2e.narrow(2, 4, 1).unwrap(), &e2e_ref.narrow(2, 4, 1).unwrap(), 1e-6);
    let ours: Vec<Vec<Vec<f32>>> = e2e.to_vec3().unwrap();
    let want: Vec<Vec<Vec<f32>>> = e2e_ref.to_vec3().unwrap();
    // Rows of the padding's identical anchors tie exactly; where such a tie crosses the 300th place, either
    // anchor may be kept.
    let (mut moved, mut swapped) = (0, 0);
    for (o, w) in ours.iter().zip(&want) {
        let mut used = vec![false; w.len()];
        let last = w[w.len() - 1][4];
        for (i, row) in o.iter().enumerate() {
            let same = |r: &Vec<f32>| {
                r[5] == row[5] && (r[4] - row[4]).abs() <= 1e-7 && (0..4).all(|k| (r[k] - row[k]).abs() <= 2e-3)
            };
            match (0..w.len()).find(|&j| !used[j] && same(&w[j])) {
                Some(j) => {
                    used[j] = true;
                    // A row in another place than Ultralytics' sits among equal scores.
                    assert!(j == i || (w[i][4] - row[4]).abs() <= 1e-7, "row {i} {row:?} is Ultralytics' row {j}");
                    moved += usize::from(j != i);
                }
                None => {
                    assert!((row[4] - last).abs() <= 1e-8, "row {i} {row:?} is not in Ultralytics' output");
                    swapped += 1;
                }
            }
        }
    }
    println!("end-to-end: {moved} of 600 rows in another place among equal scores, {swapped} tied at the cut");
    assert!(swapped <= 4, "{swapped} rows other than Ultralytics' at the cut");

    let fused = m.fuse().unwrap();
    assert_close("fused y", &fused.forward(&x).unwrap().y, &y_ref, 2e-3);
    assert_close("fused end-to-end", &fused.forward_end2end(&x, 300).unwrap(), &e2e, 2e-3);
    // YOLO26 is named as Ultralytics names it, and other families have no end-to-end head.
    let n = YoloConfig::from_model("yolo26n.yaml", 3).unwrap();
    assert_eq!((n.family, n.scale, n.family.reg_max()), (Family::V26, Scale::N, 1));
    let v8 = Yolo::new(YoloConfig::new(Scale::N, 3), DType::F32, &Device::Cpu).unwrap();
    let e = v8.forward_end2end(&Tensor::zeros((1, 3, 64, 64), DType::F32, &Device::Cpu).unwrap(), 300).unwrap_err();
    assert!(e.to_string().contains("yolov8n") && e.to_string().contains("end-to-end"), "{e}");
}

#[test]
fn end_to_end_train_step_matches_ultralytics() {
    let m = model();
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("y26t_fixture.json")).unwrap()).unwrap();
    let targets: Vec<Target> = j["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let r: Vec<f32> = r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
            let s = 128.0;
            Target {
                image: r[0] as u32,
                class: r[1] as u32,
                bbox: BoxXyxy::from_cxcywh(r[2] * s, r[3] * s, r[4] * s, r[5] * s),
            }
        })
        .collect();
    let (raw, _) = m.forward_raw(&npy("y26t_in_128.npy"), Mode::Train).unwrap();
    assert_eq!(raw.boxes.dims(), &[2, 4, 336], "reg_max 1: four distances per anchor");
    let mut loss = DetectionLoss::new(3);
    loss.set_epoch(0, 100);
    assert_eq!(loss.o2m_weight, j["o2m_weight"].as_f64().unwrap());
    let o2m = loss.compute(&sluice_model::RawHead { one2one: None, ..raw.clone() }, &targets).unwrap();
    let out = loss.compute(&raw, &targets).unwrap();
    let want =
        |key: &str| -> Vec<f64> { j["loss"][key].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect() };
    for (what, got, want) in [
        ("one-to-one", out.items, want("one2one_items_box_cls_l1")),
        ("one-to-many", o2m.items, want("one2many_items_box_cls_l1")),
    ] {
        for (k, name) in ["box", "cls", "l1"].iter().enumerate() {
            let rel = (got[k] - want[k]).abs() / want[k];
            println!("{what} {name}: {} vs {} (rel {rel:.2e})", got[k], want[k]);
            assert!(rel <= 1e-4, "{what} {name}");
        }
    }
    let total = out.total.to_scalar::<f32>().unwrap() as f64;
    let total_ref = j["loss"]["total"].as_f64().unwrap();
    assert!((total - total_ref).abs() <= 1e-4 * total_ref, "total {total} vs {total_ref}");
    let grads = out.total.backward().unwrap();
    let want = j["grads"].as_object().unwrap();
    let vars = m.trainable_vars();
    assert_eq!(vars.len(), want.len(), "parameters with a gradient");
    for (name, v) in &vars {
        let g = grads.get(v.as_tensor()).unwrap_or_else(|| panic!("no gradient for {name}"));
        check_stats(&format!("grad {name}"), g, &want[name.as_str()], 2e-3, 1e-6);
    }
    // A batch without objects (AutoBatch's probe, background-only images) has a class loss and nothing else.
    let empty = loss.compute(&raw, &[]).unwrap();
    assert!(empty.items[1] > 0.0 && empty.items[0] == 0.0 && empty.items[2] == 0.0, "{:?}", empty.items);
    // The schedule: 0.8 before the first epoch, 0.1 from the last one on.
    assert_eq!(DetectionLoss::o2m_weight_at(99, 100), 0.1);
    assert!((DetectionLoss::o2m_weight_at(50, 101) - 0.45).abs() < 1e-12);
}
