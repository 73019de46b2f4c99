//! COCO import and export checked against the COCO ground truth the reference fixtures wrote from coco128's YOLO
//! labels (image id = stem, sizes from the JPEGs, category id = class + 1, bbox rounded to 2 decimals): the
//! committed six-image cut (`tests/data/coco128-mini`) always; the full 128-image file, which lives outside the
//! repository (`sluice_testkit::locations`: `SLUICE_FIXTURES` / `SLUICE_COCO128`, default `../shared`), only when
//! asked for: `cargo test -p sluice-dataset -- --ignored`, and then a missing file is a failure.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

use std::path::Path;

use sluice_testkit::locations::{coco128_dir, fixtures_dir};

use sluice_dataset::coco::{export_ground_truth, load_coco};
use sluice_dataset::{DataConfig, IndexOptions, SampleIndex, Split};

fn yolo_index(yaml: &Path) -> SampleIndex {
    let cfg = DataConfig::load(yaml).unwrap();
    cfg.index(Split::Train, &IndexOptions { cache: false, find_orphans: false }).unwrap().index
}

/// The YOLO index and the COCO file describe the same images, sizes and boxes (to the file's 0.01 px rounding).
fn compare(yolo: &SampleIndex, json: &Path, images: &Path) {
    let (coco, problems) = load_coco(json, images).unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(coco.names, yolo.names);
    assert_eq!(coco.category_ids, Some((1..=80).collect()));
    assert_eq!(coco.len(), yolo.len());
    assert_eq!(coco.boxes(), yolo.boxes());
    for y in &yolo.samples {
        let c = coco.samples.iter().find(|c| c.image == y.image).unwrap();
        assert_eq!((c.labels.width, c.labels.height), (y.labels.width, y.labels.height), "{}", y.image.display());
        assert_eq!(c.labels.objects.len(), y.labels.objects.len());
        for (a, b) in c.labels.objects.iter().zip(&y.labels.objects) {
            assert_eq!(a.class, b.class);
            for (p, q) in
                [(a.bbox.x1, b.bbox.x1), (a.bbox.y1, b.bbox.y1), (a.bbox.x2, b.bbox.x2), (a.bbox.y2, b.bbox.y2)]
            {
                assert!((p - q).abs() <= 0.011, "{}: {a:?} vs {b:?}", y.image.display());
            }
        }
    }
    // Export: the same JSON up to rounding.
    let want: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let got = export_ground_truth(yolo, images);
    for k in ["id", "file_name", "width", "height"] {
        let ids =
            |v: &serde_json::Value| v["images"].as_array().unwrap().iter().map(|i| i[k].clone()).collect::<Vec<_>>();
        assert_eq!(ids(&got), ids(&want), "images.{k}");
    }
    let (ga, wa) = (got["annotations"].as_array().unwrap(), want["annotations"].as_array().unwrap());
    assert_eq!(ga.len(), wa.len());
    for (g, w) in ga.iter().zip(wa) {
        for k in ["id", "image_id", "category_id"] {
            assert_eq!(g[k], w[k], "{k}");
        }
        for i in 0..4 {
            let (p, q) = (g["bbox"][i].as_f64().unwrap(), w["bbox"][i].as_f64().unwrap());
            assert!((p - q).abs() <= 0.011, "{g} vs {w}");
        }
        let (p, q) = (g["area"].as_f64().unwrap(), w["area"].as_f64().unwrap());
        assert!(
            (p - q).abs()
                <= 1e-3 * q.max(1.0) + 0.02 * (g["bbox"][2].as_f64().unwrap() + g["bbox"][3].as_f64().unwrap()),
            "{g} vs {w}"
        );
    }
}

#[test]
fn mini_coco_matches_yolo_labels_both_ways() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/coco128-mini");
    let yolo = yolo_index(&dir.join("data.yaml"));
    let images = dir.join("images/train2017").canonicalize().unwrap();
    let json = dir.join("instances_mini.json");
    // The committed cut carries three crowd annotations; plain comparison ignores them, check them here.
    let (coco, _) = load_coco(&json, &images).unwrap();
    let crowd: usize = coco.samples.iter().map(|s| s.crowd.iter().filter(|c| **c).count()).sum();
    assert_eq!(crowd, 3);
    let exported = export_ground_truth(&coco, &images);
    let n = exported["annotations"].as_array().unwrap().iter().filter(|a| a["iscrowd"] == 1).count();
    assert_eq!(n, 3);
    // Without the crowd flags, the export of the YOLO index equals the file.
    let tmp = tempfile::tempdir().unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // The cut keeps coco128's annotation ids; an export numbers from 1.
    for (i, a) in v["annotations"].as_array_mut().unwrap().iter_mut().enumerate() {
        a["iscrowd"] = 0.into();
        a["id"] = (i + 1).into();
    }
    let plain = tmp.path().join("plain.json");
    sluice_dataset::coco::write_json(&plain, &v).unwrap();
    compare(&yolo, &plain, &images);
}

#[test]
#[ignore = "needs the full coco128 and its COCO fixture outside the repository (SLUICE_COCO128, SLUICE_FIXTURES); \
            run with `cargo test -p sluice-dataset -- --ignored`"]
fn full_coco128_ground_truth_matches_fixture() {
    let fixture = fixtures_dir().join("eval/coco128train_gt.json");
    let yaml = coco128_dir().join("data.yaml");
    for f in [&fixture, &yaml] {
        assert!(f.is_file(), "{} not found: set SLUICE_FIXTURES / SLUICE_COCO128 (or SLUICE_SHARED)", f.display());
    }
    let yolo = yolo_index(&yaml);
    let images = coco128_dir().join("images/train2017").canonicalize().unwrap();
    compare(&yolo, &fixture, &images);
}
