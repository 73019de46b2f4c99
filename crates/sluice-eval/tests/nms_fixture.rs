//! NMS against Ultralytics 8.4.190 / torchvision 0.29.2 on the reference prediction (`m7_nms.py`): the class
//! offset mode must reproduce `non_max_suppression` (rows and anchor indices), the exact mode
//! `torchvision.ops.batched_nms`; tolerances from the fixture README (boxes 1e-4 px, scores/classes exact).
#![allow(clippy::unwrap_used)] // Test helpers outside #[test] functions.

mod common;

use sluice_eval::{Error, Layout, MaskNms, MaskScratch, Nms, NmsMode, NmsParams, NmsScratch, PredView};

fn pred() -> Vec<f32> {
    let npy = common::read_npy("nms_pred_img0.npy");
    assert_eq!(npy.shape, vec![1, 84, 8400]);
    npy.f32()
}

fn run(data: &[f32], layout: Layout, multi_label: bool, mode: NmsMode) -> (Vec<sluice_core::Detection>, Vec<usize>) {
    let view = PredView::new(data, 80, 8400, layout).unwrap();
    let nms = Nms::new(NmsParams { multi_label, mode, ..NmsParams::default() });
    let (mut out, mut idx) = (Vec::new(), Vec::new());
    nms.run(&view, 0, &mut NmsScratch::default(), &mut out, Some(&mut idx)).unwrap();
    (out, idx)
}

fn compare(got: &[sluice_core::Detection], reference: &str) {
    let r = common::read_npy(reference);
    let rows = r.f32();
    assert_eq!(got.len() * 6, rows.len(), "{reference}: row count");
    for (i, (d, row)) in got.iter().zip(rows.chunks_exact(6)).enumerate() {
        let b = [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2];
        for k in 0..4 {
            assert!((b[k] - row[k]).abs() <= 1e-4, "{reference} row {i}: box {b:?} vs {row:?}");
        }
        assert_eq!(d.score, row[4], "{reference} row {i}: score");
        assert_eq!(d.class as f32, row[5], "{reference} row {i}: class");
    }
}

#[test]
fn class_offset_mode_matches_ultralytics_rows_and_anchor_indices() {
    let data = pred();
    for (multi, tag) in [(false, "single"), (true, "multi")] {
        let (out, idx) = run(&data, Layout::ChannelsFirst, multi, NmsMode::ClassOffset { max_wh: 7680.0 });
        compare(&out, &format!("nms_ref_img0_{tag}.npy"));
        let want: Vec<usize> =
            common::read_npy(&format!("nms_ref_img0_{tag}_idx.npy")).i64().iter().map(|&v| v as usize).collect();
        assert_eq!(idx, want, "{tag}: anchor indices");
    }
}

#[test]
fn exact_mode_matches_torchvision_batched_nms() {
    let data = pred();
    for (multi, tag) in [(false, "single"), (true, "multi")] {
        let (out, _) = run(&data, Layout::ChannelsFirst, multi, NmsMode::Exact);
        compare(&out, &format!("nms_ref_img0_{tag}_exactpercls.npy"));
    }
}

#[test]
fn the_two_modes_differ_where_the_reference_says() {
    // nms_ref_img0.json: 1 row (single) and 2 rows (multi) differ between Ultralytics and exact per-class.
    let data = pred();
    for (multi, differ) in [(false, 1), (true, 2)] {
        let (a, _) = run(&data, Layout::ChannelsFirst, multi, NmsMode::Exact);
        let (b, _) = run(&data, Layout::ChannelsFirst, multi, NmsMode::ClassOffset { max_wh: 7680.0 });
        let n = b.iter().filter(|d| !a.contains(d)).count();
        assert_eq!(n, differ, "multi_label={multi}");
    }
}

#[test]
fn anchors_first_layout_gives_the_same_result() {
    let data = pred();
    let t: Vec<f32> = (0..8400).flat_map(|a| (0..84).map(move |r| (r, a))).map(|(r, a)| data[r * 8400 + a]).collect();
    for multi in [false, true] {
        let mode = NmsMode::ClassOffset { max_wh: 7680.0 };
        assert_eq!(run(&data, Layout::ChannelsFirst, multi, mode), run(&t, Layout::AnchorsFirst, multi, mode));
    }
}

#[test]
fn nan_in_the_real_prediction_is_an_error() {
    let mut data = pred();
    // A class score of anchor 1234.
    data[(4 + 17) * 8400 + 1234] = f32::NAN;
    let view = PredView::new(&data, 80, 8400, Layout::ChannelsFirst).unwrap();
    let e = Nms::default().run(&view, 3, &mut NmsScratch::default(), &mut Vec::new(), None).unwrap_err();
    assert!(matches!(e, Error::NonFinite { image: 3, anchor: 1234, row: 21, .. }), "{e}");
    // A box coordinate of a candidate anchor (the first kept anchor of the reference).
    let mut data = pred();
    let first = common::read_npy("nms_ref_img0_multi_idx.npy").i64()[0] as usize;
    data[2 * 8400 + first] = f32::NAN;
    let view = PredView::new(&data, 80, 8400, Layout::ChannelsFirst).unwrap();
    let e = Nms::default().run(&view, 0, &mut NmsScratch::default(), &mut Vec::new(), None).unwrap_err();
    assert!(e.to_string().contains(&format!("anchor {first}, row 2")), "{e}");
}

#[test]
fn the_device_steps_host_twin_keeps_the_references_rows() {
    // MaskNms runs the device's candidate keys, sort, masks and greedy keep on the host: on the real prediction
    // (84 x 8400, conf 0.001: tens of thousands of multi-label candidates cut to max_nms) it keeps exactly the
    // rows and anchors of the CPU NMS, hence of Ultralytics and torchvision.
    let data = pred();
    let view = PredView::new(&data, 80, 8400, Layout::ChannelsFirst).unwrap();
    for (multi, tag) in [(false, "single"), (true, "multi")] {
        for (mode, reference) in [
            (NmsMode::ClassOffset { max_wh: 7680.0 }, format!("nms_ref_img0_{tag}.npy")),
            (NmsMode::Exact, format!("nms_ref_img0_{tag}_exactpercls.npy")),
        ] {
            let params = NmsParams { multi_label: multi, mode, ..NmsParams::default() };
            let (mut out, mut idx) = (Vec::new(), Vec::new());
            MaskNms::new(params).run(&view, 0, &mut MaskScratch::default(), &mut out, Some(&mut idx)).unwrap();
            compare(&out, &reference);
            assert_eq!((out, idx), run(&data, Layout::ChannelsFirst, multi, mode), "{reference}");
        }
    }
}
