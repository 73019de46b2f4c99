//! The index and `check` on real coco128 data: the committed six-image copy (`tests/data/coco128-mini`, always),
//! and the full coco128, whose counts must equal Ultralytics' (128 images, 929 boxes, 2 background images; 2 orphan
//! label files). The full set lives outside the repository (`sluice_testkit::locations::coco128_dir`: `SLUICE_COCO128`,
//! default `../shared/datasets/coco128`), so its test runs only when asked for
//! (`cargo test -p sluice-dataset -- --ignored`), and then a missing dataset is a failure.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

use std::path::{Path, PathBuf};

use sluice_dataset::{DataConfig, IndexOptions, ProblemKind, Split, check};

fn mini() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/coco128-mini/data.yaml")
}

fn no_cache() -> IndexOptions {
    IndexOptions { cache: false, find_orphans: true }
}

#[test]
fn mini_coco128_counts_sizes_and_boxes() {
    let (report, r) = check::check(&mini(), Split::Train, &no_cache()).unwrap();
    assert_eq!((report.found, report.images, report.labelled_images, report.background_images), (6, 6, 5, 1));
    assert_eq!(report.boxes, 40);
    assert_eq!(report.skipped_images, 0);
    assert_eq!(report.problems["missing_label"].count, 1);
    assert!(report.problems["missing_label"].first[0].contains("000000000250.jpg"));
    assert_eq!(report.problems["orphan_label"].count, 1);
    assert!(report.problems["orphan_label"].first[0].contains("000000000656.txt"));
    assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
    assert_eq!(report.per_class.len(), 80);
    assert_eq!(report.per_class.iter().map(|c| c.boxes).sum::<usize>(), 40);

    // Sizes from the JPEG headers, as `file(1)` reports them.
    let sizes: Vec<(String, u32, u32)> = r
        .index
        .samples
        .iter()
        .map(|s| (s.image.file_name().unwrap().to_string_lossy().into_owned(), s.labels.width, s.labels.height))
        .collect();
    let want = [
        ("000000000250.jpg", 640, 480),
        ("000000000359.jpg", 500, 332),
        ("000000000472.jpg", 640, 226),
        ("000000000536.jpg", 448, 336),
        ("000000000562.jpg", 423, 640),
        ("000000000643.jpg", 500, 375),
    ];
    for ((name, w, h), (wn, ww, wh)) in sizes.iter().zip(want) {
        assert_eq!((name.as_str(), *w, *h), (wn, ww, wh));
    }
    // 000000000472.txt holds one row, `4 0.685102 0.320398 0.136266 0.139204` (an airplane), on a 640x226 image.
    let plane = &r.index.samples[2].labels.objects;
    assert_eq!(plane.len(), 1);
    assert_eq!(plane[0].class, 4);
    let b = plane[0].bbox;
    let want = [
        (0.685102 - 0.136266 / 2.0) * 640.0,
        (0.320398 - 0.139204 / 2.0) * 226.0,
        (0.685102 + 0.136266 / 2.0) * 640.0,
        (0.320398 + 0.139204 / 2.0) * 226.0,
    ];
    for (got, want) in [b.x1, b.y1, b.x2, b.y2].into_iter().zip(want) {
        assert!((f64::from(got) - want).abs() < 1e-3, "{b:?} vs {want}");
    }
}

#[test]
fn check_json_has_the_keys_the_cli_promises() {
    let (report, _) = check::check(&mini(), Split::Val, &no_cache()).unwrap();
    let v = serde_json::to_value(&report).unwrap();
    for k in ["images", "labelled_images", "boxes", "per_class", "problems"] {
        assert!(v.get(k).is_some(), "missing key {k}");
    }
    assert_eq!(v["per_class"][0]["name"], "person");
    assert_eq!(v["split"], "val");
}

#[test]
#[ignore = "needs the full coco128 outside the repository (SLUICE_COCO128); \
            run with `cargo test -p sluice-dataset -- --ignored`"]
fn full_coco128_matches_ultralytics() {
    let yaml = sluice_testkit::locations::coco128_dir().join("data.yaml");
    assert!(yaml.is_file(), "{} not found: set SLUICE_COCO128 (or SLUICE_DATASETS, SLUICE_SHARED)", yaml.display());
    let cfg = DataConfig::load(&yaml).unwrap();
    assert_eq!(cfg.nc(), 80);
    let r = cfg.index(Split::Train, &no_cache()).unwrap();
    let report = check::CheckReport::from_index(&yaml, Split::Train, &r);
    assert_eq!(report.images, 128);
    assert_eq!(report.boxes, 929);
    assert_eq!(report.background_images, 2);
    assert_eq!(report.labelled_images, 126);
    assert_eq!(report.skipped_images, 0);
    let orphans: Vec<&str> = r
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::OrphanLabel)
        .map(|p| p.file.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(orphans, vec!["000000000656.txt", "000000000659.txt"]);
    let bg: Vec<&str> = r
        .problems
        .iter()
        .filter(|p| p.kind == ProblemKind::MissingLabel)
        .map(|p| p.file.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(bg, vec!["000000000250.jpg", "000000000508.jpg"]);
    // Person is coco128's most frequent class.
    let top = report.per_class.iter().max_by_key(|c| c.boxes).unwrap();
    assert_eq!(top.name, "person");
}
