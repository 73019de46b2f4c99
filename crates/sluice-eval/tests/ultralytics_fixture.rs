//! Ultralytics metrics against ultralytics 8.4.190 on the reference set (`m10_metrics_fixture.py`): the tp
//! matrix exactly (and its row order), `ap_per_class` values to 1e-9 (mp, mr, mAP50, mAP75, mAP50-95, max-F1
//! index, per class p, r, f1, AP at each threshold, tp/fp at max F1), and the `Metric` wrapper.
#![allow(clippy::unwrap_used)] // Test helpers outside #[test] functions.

mod common;

use std::collections::BTreeMap;

use serde_json::Value;
use sluice_core::{BoxXyxy, Detection, ImageLabels, Label, MergeMetric, Metric};
use sluice_eval::ultralytics::{DetObj, GtObj};
use sluice_eval::{ApAccumulator, UltralyticsMetric};

const TOL: f64 = 1e-9;

/// Per image id: GT (class, xyxy f32) and detections (class, xyxy f32, score f64, index in the JSON list),
/// built like the fixture script: xyxy = [x, y, x + w, y + h] in float64, then float32.
#[allow(clippy::type_complexity)]
fn per_image() -> BTreeMap<i64, (Vec<GtObj>, Vec<(DetObj, usize)>)> {
    let gt: Value = serde_json::from_slice(&std::fs::read(common::data("coco128train_gt.json")).unwrap()).unwrap();
    let dt: Value =
        serde_json::from_slice(&std::fs::read(common::data("coco128train_dets_seed1.json")).unwrap()).unwrap();
    let xyxy = |b: &Value| {
        let v: Vec<f64> = serde_json::from_value(b.clone()).unwrap();
        [v[0] as f32, v[1] as f32, (v[0] + v[2]) as f32, (v[1] + v[3]) as f32]
    };
    let mut out: BTreeMap<i64, (Vec<GtObj>, Vec<(DetObj, usize)>)> = BTreeMap::new();
    for im in gt["images"].as_array().unwrap() {
        out.entry(im["id"].as_i64().unwrap()).or_default();
    }
    for a in gt["annotations"].as_array().unwrap() {
        let cls = a["category_id"].as_i64().unwrap() as u32 - 1;
        out.get_mut(&a["image_id"].as_i64().unwrap()).unwrap().0.push((cls, xyxy(&a["bbox"])));
    }
    for (i, d) in dt.as_array().unwrap().iter().enumerate() {
        let cls = d["category_id"].as_i64().unwrap() as u32 - 1;
        let det = (cls, xyxy(&d["bbox"]), d["score"].as_f64().unwrap());
        out.get_mut(&d["image_id"].as_i64().unwrap()).unwrap().1.push((det, i));
    }
    out
}

#[test]
fn tp_matrix_and_ap_per_class_match_ultralytics() {
    let tp_ref = common::read_npy("ultralytics_tp.npy");
    assert_eq!(tp_ref.shape, vec![1390, 10]);
    let tp_ref = tp_ref.bool();
    let order_ref = common::read_npy("ultralytics_det_order.npy").i64();
    let mut acc = ApAccumulator::default();
    let mut row = 0;
    for (id, (gts, dets)) in per_image() {
        let plain: Vec<DetObj> = dets.iter().map(|d| d.0).collect();
        let tp = acc.add_image(id, &gts, &plain).unwrap();
        // Our sorted order must be the fixture's row order (score descending, stable).
        let mut idx: Vec<usize> = (0..dets.len()).collect();
        idx.sort_by(|&a, &b| dets[b].0.2.total_cmp(&dets[a].0.2));
        for (k, &bits) in tp.iter().enumerate() {
            assert_eq!(dets[idx[k]].1 as i64, order_ref[row], "row {row}: detection order");
            for t in 0..10 {
                assert_eq!(bits >> t & 1 == 1, tp_ref[row * 10 + t], "tp[{row}, {t}] (image {id})");
            }
            row += 1;
        }
    }
    assert_eq!(row, 1390);
    let rep = acc.finalize();
    let exp = &common::expected()["ultralytics"];
    let close = |got: f64, want: &Value, what: &str| {
        let want = want.as_f64().unwrap();
        assert!((got - want).abs() <= TOL, "{what}: {got} vs {want}");
    };
    close(rep.mp, &exp["mp"], "mp");
    close(rep.mr, &exp["mr"], "mr");
    close(rep.map50, &exp["map50"], "map50");
    close(rep.map75, &exp["map75"], "map75");
    close(rep.map50_95, &exp["map50_95"], "map50_95");
    assert_eq!(rep.max_f1_index as u64, exp["max_f1_conf_index"].as_u64().unwrap());
    close(rep.conf_grid[rep.max_f1_index], &exp["max_f1_conf"], "max_f1_conf");
    assert_eq!(rep.classes.len() as u64, exp["num_classes_with_gt"].as_u64().unwrap());
    for c in &rep.classes {
        let w = &exp["per_class"][c.class.to_string()];
        let what = |k: &str| format!("class {} {k}", c.class);
        close(c.p, &w["p"], &what("p"));
        close(c.r, &w["r"], &what("r"));
        close(c.f1, &w["f1"], &what("f1"));
        close(c.ap50(), &w["ap50"], &what("ap50"));
        close(c.ap[5], &w["ap75"], &what("ap75"));
        close(c.ap50_95(), &w["ap50_95"], &what("ap50_95"));
        for (t, v) in w["ap_per_iou"].as_array().unwrap().iter().enumerate() {
            close(c.ap[t], v, &what(&format!("ap[{t}]")));
        }
        close(c.tp, &w["tp_at_max_f1"], &what("tp"));
        close(c.fp, &w["fp_at_max_f1"], &what("fp"));
    }
    let rd = &exp["det_metrics_results_dict"];
    close(rep.map50_95, &rd["metrics/mAP50-95(B)"], "results_dict mAP50-95");
    // Ultralytics 8.4 reports its fitness beside the metrics: mAP50-95 alone.
    close(rep.fitness(), &rd["fitness"], "results_dict fitness");
    // Curves for plotting: one row per class, 1000 points; PR rows for classes with detections.
    assert_eq!(rep.p_curve.len(), rep.classes.len());
    assert!(rep.f1_curve.iter().all(|r| r.len() == 1000));
    assert!(!rep.pr_curve.is_empty() && rep.pr_curve.iter().all(|(_, r)| r.len() == 1000));
}

#[test]
fn metric_stage_on_several_workers_matches_the_direct_computation() {
    let images = per_image();
    let mut direct = ApAccumulator::default();
    let mut workers: Vec<UltralyticsMetric> = (0..3).map(|_| UltralyticsMetric::new(80)).collect();
    for (n, (id, (gts, dets))) in images.iter().rev().enumerate() {
        let plain: Vec<DetObj> = dets.iter().map(|d| (d.0.0, d.0.1, f64::from(d.0.2 as f32))).collect();
        direct.add_image(*id, gts, &plain).unwrap();
        let bx = |b: &[f32; 4]| BoxXyxy::new(b[0], b[1], b[2], b[3]);
        let truth = ImageLabels {
            width: 0,
            height: 0,
            objects: gts.iter().map(|g| Label { class: g.0, bbox: bx(&g.1) }).collect(),
        };
        let dets: Vec<Detection> =
            dets.iter().map(|d| Detection { bbox: bx(&d.0.1), score: d.0.2 as f32, class: d.0.0 }).collect();
        workers[n % 3].update(*id as u64, &dets, &truth).unwrap();
    }
    // The parts as another process receives them (bytes) merge to the same report.
    let mut through_bytes = UltralyticsMetric::from_bytes(&workers[0].to_bytes().unwrap(), "part 0").unwrap();
    for w in &workers[1..] {
        through_bytes.merge(UltralyticsMetric::from_bytes(&w.to_bytes().unwrap(), "part").unwrap()).unwrap();
    }
    assert_eq!(through_bytes.finalize().unwrap(), direct.finalize());
    assert!(UltralyticsMetric::from_bytes(b"{not json", "rank 1").unwrap_err().to_string().contains("rank 1"));
    let mut m = workers.pop().unwrap();
    for w in workers {
        m.merge(w).unwrap();
    }
    assert_eq!(m.finalize().unwrap(), direct.finalize());
    // A class outside 0..nc is an error, not a panic.
    let bad = [Detection { bbox: BoxXyxy::new(0.0, 0.0, 1.0, 1.0), score: 0.5, class: 80 }];
    assert!(UltralyticsMetric::new(80).update(1, &bad, &ImageLabels::default()).is_err());
}
