//! Ultralytics `.pt` checkpoints read without Python (`sluice_model::pt`): the fixtures of `tests/fixtures/pt/`
//! (written by `make_pt_fixtures.py` beside them with Ultralytics 8.4.190) against their safetensors conversion by
//! `scripts/convert_weights.py` and against Ultralytics' own forward, and the errors for what Sluice cannot use.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use sluice_model::{Family, LoadMode, Scale, Yolo, YoloConfig, read_pt, read_pt_bytes};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pt").join(name)
}

fn input() -> Tensor {
    Tensor::read_npy(fixture("v8t_in_64.npy")).unwrap()
}

/// The fixtures' scale: depth 0.33, width 0.125, max channels 128.
fn tiny() -> Scale {
    Scale::custom(0.33, 0.125, 128).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn err(path: &Path) -> String {
    read_pt(path).map(|c| format!("read {} tensors", c.tensors.len())).expect_err("must be refused").to_string()
}

/// The largest relative differences of the boxes (rows 0..4, in input pixels, relative to max(|ref|, 1)) and of the
/// class scores (rows 4.., relative to the reference score itself) of a `(1, 4 + nc, A)` eval output.
fn box_and_score_errors(y: &Tensor, want: &Tensor) -> (f32, f32) {
    assert_eq!(y.dims(), want.dims());
    let rows = |t: &Tensor| t.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
    let (y, want) = (rows(y), rows(want));
    let (mut boxes, mut scores) = (0f32, 0f32);
    for (r, (a, b)) in y.iter().zip(&want).enumerate() {
        for (p, q) in a.iter().zip(b) {
            if r < 4 {
                boxes = boxes.max((p - q).abs() / q.abs().max(1.0));
            } else {
                assert!(*q > 0.0, "a sigmoid score is positive");
                scores = scores.max((p - q).abs() / q);
            }
        }
    }
    (boxes, scores)
}

#[test]
fn yolo11_and_yolo26_checkpoints_load_and_run_as_ultralytics() {
    // The weights are float16 and both sides widen them to float32 before the forward, so the outputs differ by
    // float32 rounding alone, as the float32 YOLOv8's do (`float32_checkpoint_matches_the_ultralytics_forward`):
    // the boxes and the scores (about 1e-3 here) are each held to 1e-4 of their own size.
    let (m, ckpt) = Yolo::from_pt(fixture("y11t.pt"), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(ckpt.family, Family::V11);
    assert_eq!((ckpt.scale, ckpt.nc, ckpt.dtype), (tiny(), 3, DType::F16));
    let y = m.forward(&input()).unwrap().y;
    let (boxes, scores) = box_and_score_errors(&y, &Tensor::read_npy(fixture("y11t_out_64.npy")).unwrap());
    println!("y11t: boxes {boxes:e}, scores {scores:e} (relative)");
    assert!(boxes < 1e-4 && scores < 1e-4, "boxes {boxes}, scores {scores}");
    // YOLO26: an end-to-end head with reg_max 1 on YOLO11's blocks.
    let (m26, ckpt) = Yolo::from_pt(fixture("y26t.pt"), DType::F32, &Device::Cpu).unwrap();
    assert_eq!((ckpt.family, ckpt.scale, ckpt.nc), (Family::V26, tiny(), 3));
    let y = m26.forward(&input()).unwrap().y;
    let (boxes, scores) = box_and_score_errors(&y, &Tensor::read_npy(fixture("y26t_out_64.npy")).unwrap());
    println!("y26t: boxes {boxes:e}, scores {scores:e} (relative)");
    assert!(boxes < 1e-4 && scores < 1e-4, "boxes {boxes}, scores {scores}");
    // A YOLOv8 of the same scale refuses a YOLO11 by family, naming both.
    let mut v8 = Yolo::new(YoloConfig::new(tiny(), 3), DType::F32, &Device::Cpu).unwrap();
    let e = v8.load_weights(fixture("y11t.pt"), LoadMode::Strict).expect_err("family").to_string();
    assert!(e.contains("y11t.pt") && e.contains("yolo11") && e.contains("yolov8"), "{e}");
}

/// YOLO26's end-to-end output (the one-to-one head's top-k, no NMS) against Ultralytics' forward with
/// `end2end = True` (`make_e2e_fixture.py`): the same (anchor, class) rows, their boxes and scores each within 1e-4
/// of their own size. Equal scores (a box's score repeats across anchors here) may come in either order, so each
/// reference row is matched to an unused row of the same class and nearest box; the rows whose score ties the
/// smallest kept score (to float rounding) are any of the tied candidates in either implementation, so there only
/// the class and the score must agree.
#[test]
fn yolo26_end_to_end_rows_match_ultralytics() {
    let (m26, _) = Yolo::from_pt(fixture("y26t.pt"), DType::F32, &Device::Cpu).unwrap();
    let got = m26.forward_end2end(&input(), 300).unwrap();
    let want = Tensor::read_npy(fixture("y26t_e2e_64.npy")).unwrap();
    assert_eq!(got.dims(), want.dims());
    let rows = |t: Tensor| t.squeeze(0).unwrap().to_vec2::<f32>().unwrap();
    let (got, want) = (rows(got), rows(want));
    assert!(got.windows(2).all(|w| w[0][4] >= w[1][4]), "rows in descending score");
    let box_err = |a: &[f32], b: &[f32]| (0..4).map(|j| (a[j] - b[j]).abs() / b[j].abs().max(1.0)).fold(0f32, f32::max);
    let score_err = |a: &[f32], b: &[f32]| (a[4] - b[4]).abs() / b[4];
    let cut = want.last().map_or(0.0, |w| w[4]);
    let mut used = vec![false; got.len()];
    let (mut boxes, mut scores, mut at_cut) = (0f32, 0f32, 0);
    for (r, w) in want.iter().enumerate() {
        let tied = w[4] <= cut * (1.0 + 1e-4);
        at_cut += usize::from(tied);
        let err = |i: usize| if tied { score_err(&got[i], w) } else { box_err(&got[i], w) };
        let best = (0..got.len())
            .filter(|&i| !used[i] && got[i][5] == w[5])
            .min_by(|&i, &j| err(i).total_cmp(&err(j)))
            .unwrap_or_else(|| panic!("reference row {r} (class {}) has no row of its class left", w[5]));
        used[best] = true;
        if !tied {
            boxes = boxes.max(box_err(&got[best], w));
        }
        scores = scores.max(score_err(&got[best], w));
    }
    println!("y26t end-to-end: boxes {boxes:e}, scores {scores:e} (relative), {at_cut} rows at the cut");
    assert!(at_cut < want.len() / 4, "the tie at the cut must leave most rows compared by their boxes");
    assert!(boxes < 1e-4 && scores < 1e-4, "boxes {boxes}, scores {scores}");
}

#[test]
fn trainer_checkpoint_gives_its_ema_bit_for_bit_as_the_safetensors_conversion() {
    let ckpt = read_pt(fixture("v8t_trainer.pt")).unwrap();
    assert_eq!(ckpt.entry, "ema");
    assert_eq!(ckpt.dtype, DType::F16);
    assert_eq!(ckpt.nc, 3);
    assert_eq!(ckpt.names, ["cat", "dog", "bird"]);
    assert_eq!(ckpt.scale, tiny());
    // 355 keys: the model's parameters and running statistics, `num_batches_tracked` and the DFL projection; none
    // of the optimizer's float16 momenta in the same pickle.
    assert_eq!(ckpt.tensors.len(), 355);

    let (from_pt, _) = Yolo::from_pt(fixture("v8t_trainer.pt"), DType::F32, &Device::Cpu).unwrap();
    let from_st =
        Yolo::load(YoloConfig::new(tiny(), 3), fixture("v8t_trainer_ema.safetensors"), DType::F32, &Device::Cpu)
            .unwrap();
    let (a, b) = (from_pt.state_dict().unwrap(), from_st.state_dict().unwrap());
    assert_eq!(a.len(), b.len());
    for (k, t) in &a {
        assert_eq!(bits(t), bits(&b[k]), "{k}");
    }
    let x = input();
    let (ya, yb) = (from_pt.forward(&x).unwrap().y, from_st.forward(&x).unwrap().y);
    assert_eq!(ya.dims(), [1, 7, 84]);
    assert_eq!(bits(&ya), bits(&yb));
    let (fa, fb) = (from_pt.fuse().unwrap().forward(&x).unwrap().y, from_st.fuse().unwrap().forward(&x).unwrap().y);
    assert_eq!(bits(&fa), bits(&fb));
}

#[test]
fn saved_model_reads_its_model_entry_and_loads_through_load_weights() {
    let ckpt = read_pt(fixture("v8t_save.pt")).unwrap();
    assert_eq!((ckpt.entry, ckpt.dtype, ckpt.nc), ("model", DType::F16, 3));
    let mut m = Yolo::new(YoloConfig::new(tiny(), 3), DType::F32, &Device::Cpu).unwrap();
    m.load_weights(fixture("v8t_save.pt"), LoadMode::Strict).unwrap();
    let w = m.var("model.0.conv.weight").unwrap().as_tensor().clone();
    assert_eq!(bits(&w), bits(&ckpt.tensors["model.0.conv.weight"]));
    // A float16 value widened to float32 keeps its bits' meaning: every weight is representable in half.
    let back = w.to_dtype(DType::F16).unwrap().to_dtype(DType::F32).unwrap();
    assert_eq!(bits(&back), bits(&w));
}

#[test]
fn float32_checkpoint_matches_the_ultralytics_forward() {
    let (m, ckpt) = Yolo::from_pt(fixture("v8t_float.pt"), DType::F32, &Device::Cpu).unwrap();
    assert_eq!((ckpt.entry, ckpt.dtype), ("model", DType::F32));
    let y = m.forward(&input()).unwrap().y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let want = Tensor::read_npy(fixture("v8t_float_out_64.npy")).unwrap();
    assert_eq!(want.dims(), [1, 7, 84]);
    let want = want.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let worst = y.iter().zip(&want).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0f32, f32::max);
    assert!(worst < 1e-4, "worst relative difference {worst}");
}

#[test]
fn checkpoints_sluice_cannot_use_are_refused_naming_the_file_and_what_was_found() {
    let e = err(&fixture("v8t_fused.pt"));
    assert!(e.contains("v8t_fused.pt") && e.contains("fused"), "{e}");
    let e = err(&fixture("v8t_seg.pt"));
    assert!(e.contains("v8t_seg.pt") && e.contains("segmentation") && e.contains("Segment"), "{e}");
    let e = err(&fixture("v8t_custom.pt"));
    assert!(e.contains("v8t_custom.pt") && e.contains("unknown module class __main__.Custom"), "{e}");

    let bytes = std::fs::read(fixture("v8t_save.pt")).unwrap();
    for cut in [10, bytes.len() / 2, bytes.len() - 30] {
        let e = read_pt_bytes(&bytes[..cut], Path::new("cut.pt")).expect_err("truncated").to_string();
        assert!(e.starts_with("cut.pt: ") && e.contains("truncated"), "{e}");
    }
    let e = read_pt(fixture("v8t_in_64.npy")).expect_err("not a zip").to_string();
    assert!(e.contains("v8t_in_64.npy") && e.contains("zip"), "{e}");
}

#[test]
fn a_checkpoint_for_other_classes_or_another_scale_is_an_error() {
    let mut m = Yolo::new(YoloConfig::new(tiny(), 5), DType::F32, &Device::Cpu).unwrap();
    let e = m.load_weights(fixture("v8t_save.pt"), LoadMode::Strict).expect_err("nc").to_string();
    assert!(e.contains("v8t_save.pt") && e.contains("3 classes (cat, dog, bird)") && e.contains("has 5"), "{e}");
    let mut m = Yolo::new(YoloConfig::new(Scale::N, 3), DType::F32, &Device::Cpu).unwrap();
    let e = m.load_weights(fixture("v8t_save.pt"), LoadMode::Strict).expect_err("scale").to_string();
    assert!(e.contains("v8t_save.pt") && e.contains("shape"), "{e}");
}
