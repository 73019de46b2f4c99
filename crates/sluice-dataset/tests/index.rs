//! Index building on a dataset made to hold every kind of problem, the label cache's reuse and rebuild rules,
//! and the synthetic generator's output read back through the same index.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

use std::path::Path;

use sluice_dataset::index::{IndexOptions, build_index, cache_path_for};
use sluice_dataset::synth::{SynthConfig, encode_jpeg, generate};
use sluice_dataset::{DataConfig, ProblemKind, Split, check};

fn jpeg(w: u32, h: u32) -> Vec<u8> {
    encode_jpeg(&image::RgbImage::from_pixel(w, h, image::Rgb([90, 120, 150])), 85).unwrap()
}

fn write(root: &Path, rel: &str, bytes: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

/// A 3-class dataset with one image per problem kind.
fn problem_dataset(root: &Path) {
    write(root, "data.yaml", b"train: images/train\nval: images/train\nnames: [a, b, c]\n");
    let img = jpeg(64, 48);
    write(root, "images/train/good.jpg", &img);
    write(root, "labels/train/good.txt", b"0 0.5 0.5 0.5 0.5\n2 0.25 0.25 0.1 0.1\n");
    write(root, "images/train/garbage.jpg", b"this is not an image, just some bytes");
    write(root, "labels/train/garbage.txt", b"0 0.5 0.5 0.5 0.5\n");
    write(root, "images/train/badclass.jpg", &img);
    write(root, "labels/train/badclass.txt", b"0 0.5 0.5 0.5 0.5\n3 0.5 0.5 0.5 0.5\n");
    write(root, "images/train/dups.jpg", &img);
    write(root, "labels/train/dups.txt", b"1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n0 0.1 0.1 0.1 0.1\n");
    write(root, "images/train/empty.jpg", &img);
    write(root, "labels/train/empty.txt", b"");
    write(root, "images/train/nolabel.jpg", &img);
    write(root, "images/train/truncated.jpg", &img[..img.len() - 20]);
    write(root, "labels/train/truncated.txt", b"1 0.5 0.5 0.2 0.2\n");
    write(root, "images/train/tiny.jpg", &jpeg(8, 40));
    write(root, "images/train/anim.jpg", b"GIF89a\x20\x00\x20\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00!\xf9\x04\x00;");
    write(root, "images/train/flat.jpg", &img);
    write(root, "labels/train/flat.txt", b"2 0.5 0.5 0.0 0.3\n2 0.5 0.5 1.004 0.3\n");
    write(root, "images/train/cols.jpg", &img);
    write(root, "labels/train/cols.txt", b"0 0.5 0.5 0.5\n");
    write(root, "labels/train/orphan.txt", b"0 0.5 0.5 0.5 0.5\n");
    write(root, "images/train/notes.md", b"not listed");
}

#[test]
fn every_problem_is_found_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    problem_dataset(root);
    let opts = IndexOptions { cache: false, find_orphans: true };
    let (report, r) = check::check(&root.join("data.yaml"), Split::Train, &opts).unwrap();
    assert_eq!(report.found, 11);
    // Skipped: garbage, badclass, tiny, anim, cols.
    assert_eq!(report.skipped_images, 5, "{}", report.to_text());
    assert_eq!(report.images, 6);
    // good 2 + dups 2 + truncated 1 + flat 1 (the zero-width row dropped).
    assert_eq!(report.boxes, 6);
    assert_eq!(report.background_images, 2);
    let by = |k: ProblemKind| r.problems.iter().filter(|p| p.kind == k).collect::<Vec<_>>();
    assert_eq!(by(ProblemKind::CorruptImage).len(), 3);
    let labels = by(ProblemKind::CorruptLabel);
    assert_eq!(labels.len(), 2);
    let bad = labels.iter().find(|p| p.file.ends_with("badclass.txt")).unwrap();
    assert_eq!(bad.line, Some(2));
    assert!(bad.message.contains("Label class 3 exceeds dataset class count 3"), "{}", bad.message);
    let cols = labels.iter().find(|p| p.file.ends_with("cols.txt")).unwrap();
    assert!(
        cols.to_string()
            .ends_with("cols.txt:1: ignoring corrupt image/label: labels require 5 columns, 4 columns detected")
    );
    assert!(
        by(ProblemKind::CorruptImage).iter().any(|p| p.file.ends_with("tiny.jpg") && p.message.contains("<10 pixels"))
    );
    assert!(
        by(ProblemKind::CorruptImage).iter().any(|p| p.file.ends_with("anim.jpg") && p.message.contains("unsupported"))
    );
    assert_eq!(by(ProblemKind::DuplicateLabels)[0].message, "1 duplicate labels removed");
    assert!(by(ProblemKind::CorruptJpeg)[0].file.ends_with("truncated.jpg"));
    assert!(by(ProblemKind::EmptyLabel)[0].file.ends_with("empty.txt"));
    assert!(by(ProblemKind::MissingLabel)[0].file.ends_with("nolabel.jpg"));
    assert_eq!(by(ProblemKind::ZeroArea)[0].line, Some(1));
    assert_eq!(by(ProblemKind::Clipped)[0].line, Some(2));
    assert!(by(ProblemKind::OrphanLabel)[0].file.ends_with("orphan.txt"));
    // Every problem names an existing file.
    assert!(r.problems.iter().all(|p| p.file.exists()));
    // The clipped box spans the whole width.
    let flat = r.index.samples.iter().find(|s| s.image.ends_with("flat.jpg")).unwrap();
    assert_eq!((flat.labels.objects[0].bbox.x1, flat.labels.objects[0].bbox.x2), (0.0, 64.0));
}

#[test]
fn cache_is_reused_only_while_files_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    problem_dataset(root);
    let cfg = DataConfig::load(root.join("data.yaml")).unwrap();
    let images = cfg.image_files(Split::Train).unwrap();
    let cache = cache_path_for(&images).unwrap();
    assert_eq!(cache, root.canonicalize().unwrap().join("labels/train.cache"));
    let opts = IndexOptions::default();

    let first = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!((first.cache.reused, first.cache.scanned, first.cache.saved), (0, 11, true));
    assert!(first.cache.rebuilt_reason.is_some());
    let second = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!((second.cache.reused, second.cache.scanned, second.cache.saved), (11, 0, false));
    assert_eq!(second.index, first.index);
    assert_eq!(second.problems, first.problems);

    // A label file changes (size differs): only its image is rescanned, and the new labels are used.
    write(root, "labels/train/good.txt", b"1 0.5 0.5 0.5 0.5\n");
    let third = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!((third.cache.reused, third.cache.scanned), (10, 1));
    let good = third.index.samples.iter().find(|s| s.image.ends_with("good.jpg")).unwrap();
    assert_eq!(good.labels.objects.len(), 1);
    assert_eq!(good.labels.objects[0].class, 1);
    // A label file appears for a background image.
    write(root, "labels/train/nolabel.txt", b"0 0.5 0.5 0.5 0.5\n");
    let fourth = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!(fourth.cache.scanned, 1);
    assert_eq!(fourth.index.boxes(), third.index.boxes() + 1);

    // Same size, new modification time (an edit that keeps the length): rescanned too.
    let f = std::fs::File::options().write(true).open(root.join("labels/train/good.txt")).unwrap();
    f.set_modified(std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000)).unwrap();
    drop(f);
    let touched = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!((touched.cache.reused, touched.cache.scanned), (10, 1));

    // A corrupt cache is never trusted: everything is rescanned and the cache rewritten.
    let mut bytes = std::fs::read(&cache).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x20;
    std::fs::write(&cache, &bytes).unwrap();
    let fifth = build_index(&images, &cfg.names, Some(&cache), &opts);
    assert_eq!((fifth.cache.reused, fifth.cache.scanned, fifth.cache.saved), (0, 11, true));
    assert!(fifth.cache.rebuilt_reason.as_deref().unwrap().contains("corrupt"));
    assert_eq!(fifth.index, fourth.index);
    // A cache made for another class count is rebuilt too.
    let names4: Vec<String> = ["a", "b", "c", "d"].map(String::from).to_vec();
    let sixth = build_index(&images, &names4, Some(&cache), &opts);
    assert_eq!(sixth.cache.reused, 0);
}

#[test]
fn synthetic_dataset_is_deterministic_and_clean() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let cfg = |out: &Path| SynthConfig {
        out: out.to_path_buf(),
        seed: 11,
        train: 10,
        val: 4,
        imgsz: 96,
        quality: 90,
        ..Default::default()
    };
    let sa = generate(&cfg(a.path())).unwrap();
    let sb = generate(&cfg(b.path())).unwrap();
    assert_eq!(sa.boxes, sb.boxes);
    for rel in ["images/train/000003.jpg", "labels/train/000003.txt", "images/val/000001.jpg", "labels/val/000001.txt"]
    {
        assert_eq!(std::fs::read(a.path().join(rel)).unwrap(), std::fs::read(b.path().join(rel)).unwrap(), "{rel}");
    }
    // Real JPEGs: they decode to the requested size.
    let img = image::open(a.path().join("images/val/000002.jpg")).unwrap();
    assert_eq!((img.width(), img.height()), (96, 96));
    let yaml = sa.data_yaml;
    let opts = IndexOptions { cache: false, find_orphans: true };
    let (train, _) = check::check(&yaml, Split::Train, &opts).unwrap();
    let (val, _) = check::check(&yaml, Split::Val, &opts).unwrap();
    assert_eq!((train.images, val.images), (10, 4));
    assert_eq!(train.labelled_images, 10);
    assert!(train.problems.is_empty() && val.problems.is_empty(), "{}{}", train.to_text(), val.to_text());
    assert_eq!(train.boxes + val.boxes, sa.boxes);
    assert_eq!(train.per_class.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), sluice_dataset::synth::CLASSES);
    // Regenerating into the same folder replaces it; a foreign folder is refused.
    let again = generate(&SynthConfig { train: 3, val: 0, ..cfg(a.path()) }).unwrap();
    assert_eq!(again.train_images, 3);
    assert!(!a.path().join("images/val").exists());
    let foreign = tempfile::tempdir().unwrap();
    write(foreign.path(), "images/x.jpg", b"x");
    assert!(generate(&cfg(foreign.path())).is_err());
}

#[test]
fn read_only_dataset_folder_gets_no_cache_but_a_full_index() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    problem_dataset(root);
    let labels = root.join("labels");
    std::fs::set_permissions(&labels, std::fs::Permissions::from_mode(0o555)).unwrap();
    let cfg = DataConfig::load(root.join("data.yaml")).unwrap();
    let r = cfg.index(Split::Train, &IndexOptions::default()).unwrap();
    std::fs::set_permissions(&labels, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(!r.cache.saved);
    assert!(r.cache.warning.as_deref().unwrap().contains("not writeable"), "{:?}", r.cache);
    assert!(!labels.join("train.cache").exists());
    assert_eq!(r.index.len(), 6);
}

#[test]
fn a_subset_is_seeded_ordered_and_nonempty() {
    let mut index = sluice_dataset::SampleIndex::default();
    for i in 0..10 {
        index.samples.push(sluice_dataset::Sample {
            image: std::path::PathBuf::from(format!("{i}.jpg")),
            format: sluice_dataset::ImageFormat::Jpeg,
            label_file: None,
            labels: sluice_core::ImageLabels::default(),
            crowd: Vec::new(),
            image_id: None,
        });
    }
    let a = index.subset(0.3, 1);
    assert_eq!(a.len(), 3);
    assert_eq!(a, index.subset(0.3, 1));
    assert!(a.samples.windows(2).all(|w| w[0].image < w[1].image));
    assert_ne!(a, index.subset(0.3, 2));
    assert_eq!(index.subset(0.01, 1).len(), 1);
    assert_eq!(index.subset(1.0, 1).len(), 10);
}
