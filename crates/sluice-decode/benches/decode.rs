//! Decode throughput per backend on real JPEGs (coco128 train2017 when available): full decode, full decode +
//! Ultralytics resize, and decode-to-target (DCT-scaled where the source allows, then resize), at 640 and 320.
//! One iteration = one pass over every image, single thread (like `m3_jpeg_decode.py`); throughput in images.
//!
//! Images: `$SLUICE_DATASETS/coco128/images/train2017`, else `/work/shared/datasets/coco128/images/train2017`,
//! else the JPEGs committed in `tests/data`. Run: `cargo bench -p sluice-decode --features turbojpeg`.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_decode::{Backend, DecodeHint, ImageRgb8, TargetOptions, decode_to_target, resize};

fn image_dir() -> (PathBuf, bool) {
    let coco = |root: PathBuf| root.join("coco128/images/train2017");
    let candidates = std::env::var_os("SLUICE_DATASETS")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/work/shared/datasets")]);
    for root in candidates {
        if coco(root.clone()).is_dir() {
            return (coco(root), true);
        }
    }
    (PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"), false)
}

fn load() -> Vec<Vec<u8>> {
    let (dir, is_coco) = image_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("image directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg") && (is_coco || p.to_string_lossy().contains("coco_")))
        .collect();
    files.sort();
    let blobs: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).expect("read image")).collect();
    let decoder = Backend::preferred().expect("a backend").decoder().expect("decoder");
    let mut img = ImageRgb8::default();
    let mp: f64 = blobs
        .iter()
        .map(|b| {
            let info = decoder.decode(b, DecodeHint::default(), &mut img).expect("decode");
            f64::from(info.orig_width) * f64::from(info.orig_height) / 1e6
        })
        .sum();
    let mb = blobs.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    eprintln!(
        "{} JPEGs from {} ({mb:.2} MB, {mp:.3} source MP): MP/s = images/s * {:.4}",
        blobs.len(),
        dir.display(),
        mp / blobs.len() as f64
    );
    blobs
}

fn decode(c: &mut Criterion) {
    let blobs = load();
    let mut group = c.benchmark_group("decode");
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(blobs.len() as u64));
    // Compiled in and able to run here (nvjpeg only where its libraries load and a GPU is present).
    for backend in Backend::available() {
        let d = backend.decoder().expect("available backend");
        let (mut full, mut out) = (ImageRgb8::default(), ImageRgb8::default());
        group.bench_function(format!("{backend}/full"), |b| {
            b.iter(|| {
                for blob in &blobs {
                    d.decode(blob, DecodeHint::default(), &mut full).expect("decode");
                }
            })
        });
        for imgsz in [640u32, 320] {
            group.bench_function(format!("{backend}/full+resize{imgsz}"), |b| {
                b.iter(|| {
                    for blob in &blobs {
                        let info = d.decode(blob, DecodeHint::default(), &mut full).expect("decode");
                        resize::resize_long_side(&full, info.orig_width, info.orig_height, imgsz, false, &mut out)
                            .expect("resize");
                    }
                })
            });
            group.bench_function(format!("{backend}/target{imgsz}"), |b| {
                b.iter(|| {
                    for blob in &blobs {
                        decode_to_target(&*d, blob, TargetOptions::new(imgsz), &mut full, &mut out).expect("decode");
                    }
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
