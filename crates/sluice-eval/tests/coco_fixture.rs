//! The COCO evaluator against pycocotools 2.0.11 on the reference set (`m10_metrics_fixture.py`): the 12 stats,
//! per-category AP / AP50 / AP75 / AR100 and mAP per IoU threshold to 1e-12, with and without crowd regions;
//! the printed summary; identical results with threads and with images streamed in any order.
#![allow(clippy::unwrap_used)] // Test helpers outside #[test] functions.

mod common;

use sluice_eval::coco::STAT_NAMES;
use sluice_eval::{CocoAccumulator, CocoDataset, CocoEval, CocoParams, Detections, DtBox, GtBox, coco_evaluate};

const TOL: f64 = 1e-12;

fn load(gt_name: &str) -> (CocoDataset, Detections) {
    let gt = CocoDataset::from_path(common::data(gt_name)).unwrap();
    let dt = Detections::from_path(common::data("coco128train_dets_seed1.json"), &gt).unwrap();
    (gt, dt)
}

fn check(case: &str, gt_name: &str) -> CocoEval {
    let (gt, dt) = load(gt_name);
    let ev = coco_evaluate(&gt, &dt, &CocoParams::default(), 1).unwrap();
    let exp = &common::expected()[format!("pycocotools_{case}")];
    let names: Vec<String> = serde_json::from_value(common::expected()["stat_names"].clone()).unwrap();
    assert_eq!(names, STAT_NAMES);
    for (i, want) in exp["stats"].as_array().unwrap().iter().enumerate() {
        let want = want.as_f64().unwrap();
        assert!((ev.stats[i] - want).abs() <= TOL, "{case} stat {i} {}: {} vs {want}", STAT_NAMES[i], ev.stats[i]);
    }
    let per_cat = ev.per_category();
    let want_cats = exp["per_category_all_100"].as_object().unwrap();
    assert_eq!(per_cat.len(), want_cats.len());
    assert_eq!(per_cat.len() as u64, exp["num_categories_with_gt"].as_u64().unwrap());
    for c in &per_cat {
        let w = &want_cats[&c.cat_id.to_string()];
        for (got, key) in [(c.ap, "ap"), (c.ap50, "ap50"), (c.ap75, "ap75"), (c.ar, "ar100")] {
            let want = w[key].as_f64().unwrap();
            assert!((got - want).abs() <= TOL, "{case} category {} {key}: {got} vs {want}", c.cat_id);
        }
    }
    for (t, (got, want)) in
        ev.map_per_iou().iter().zip(exp["per_iou_threshold_map_all_100"].as_array().unwrap()).enumerate()
    {
        let (got, want) = (got.unwrap(), want.as_f64().unwrap());
        assert!((got - want).abs() <= TOL, "{case} IoU index {t}: {got} vs {want}");
    }
    let iou: Vec<f64> = serde_json::from_value(exp["iou_thresholds"].clone()).unwrap();
    assert_eq!(ev.params.iou_thrs, iou);
    let text: Vec<String> = serde_json::from_value(exp["summarize_text"].clone()).unwrap();
    assert_eq!(ev.summary_lines(), text);
    ev
}

#[test]
fn plain_matches_pycocotools() {
    check("plain", "coco128train_gt.json");
}

#[test]
fn crowd_matches_pycocotools() {
    let plain = check("plain", "coco128train_gt.json");
    let crowd = check("crowd", "coco128train_gt_crowd.json");
    // The crowd regions change the result (so the test exercises them).
    assert!((plain.stats[0] - crowd.stats[0]).abs() > 1e-4);
}

#[test]
fn threads_give_bit_identical_results() {
    let (gt, dt) = load("coco128train_gt_crowd.json");
    let one = coco_evaluate(&gt, &dt, &CocoParams::default(), 1).unwrap();
    for threads in [2, 3] {
        let many = coco_evaluate(&gt, &dt, &CocoParams::default(), threads).unwrap();
        assert_eq!(one.stats, many.stats);
        assert_eq!(one.precision, many.precision);
        assert_eq!(one.recall, many.recall);
    }
}

#[test]
fn streaming_in_any_order_on_several_workers_is_bit_identical() {
    let (gt, dt) = load("coco128train_gt_crowd.json");
    let reference = coco_evaluate(&gt, &dt, &CocoParams::default(), 1).unwrap();
    let mut per_img: Vec<(i64, Vec<GtBox>, Vec<DtBox>)> = gt.images.iter().map(|i| (i.id, vec![], vec![])).collect();
    let pos = |id: i64| per_img.iter().position(|p| p.0 == id).unwrap();
    let ann: Vec<(usize, GtBox)> = gt.annotations.iter().map(|(i, a)| (pos(*i), *a)).collect();
    let det: Vec<(usize, DtBox)> = dt.dets.iter().map(|(i, d)| (pos(*i), *d)).collect();
    for (p, a) in ann {
        per_img[p].1.push(a);
    }
    for (p, d) in det {
        per_img[p].2.push(d);
    }
    // A fixed pseudo-random permutation, spread over 3 workers.
    let n = per_img.len();
    let order: Vec<usize> = (0..n).map(|i| (i * 89 + 17) % n).collect();
    let cats: Vec<i64> = gt.categories.iter().map(|c| c.id).collect();
    let mut workers: Vec<CocoAccumulator> =
        (0..3).map(|_| CocoAccumulator::new(CocoParams::default(), &cats).unwrap()).collect();
    for (j, &i) in order.iter().enumerate() {
        let (id, g, d) = &per_img[i];
        workers[j % 3].add_image(*id, g, d).unwrap();
    }
    let mut acc = workers.pop().unwrap();
    for w in workers {
        acc.merge(w).unwrap();
    }
    assert_eq!(acc.num_images(), n);
    let ev = acc.finalize();
    assert_eq!(ev.stats, reference.stats);
    assert_eq!(ev.precision, reference.precision);
    // An image added twice is refused.
    let (id, g, d) = &per_img[0];
    assert!(acc.add_image(*id, g, d).is_err());
}
