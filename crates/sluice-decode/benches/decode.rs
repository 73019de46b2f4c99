//! Decode throughput per backend on real JPEGs (coco128 train2017 when available): full decode, full decode +
//! Ultralytics resize, and decode-to-target (DCT-scaled where the source allows, then resize), at 640 and 320.
//! One iteration = one pass over every image, single thread (like `m3_jpeg_decode.py`); throughput in images.
//!
//! Group `decode_large` measures the "decode-to-target (640) ≥ 1.3× full decode + resize", which needs
//! sources at least twice the target: coco128's images are at most 640 px, so it encodes camera-sized copies of
//! them (the first 24 with a long side ≥ 600, upscaled 3× to ~1920×1440, JPEG quality 90) when the bench starts.
//! Upscaled photos carry less fine detail than native ones, so their entropy decoding is cheaper; both cases decode
//! the same files, so the ratio between them is what the group reports.
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

/// Per compiled backend (nvjpeg only where its libraries load and a GPU is present): full decode, and for each
/// size full decode + resize against decode-to-target.
fn decode_cases(c: &mut Criterion, name: &str, blobs: &[Vec<u8>], sizes: &[u32]) {
    let mut group = c.benchmark_group(name);
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(blobs.len() as u64));
    for backend in Backend::available() {
        let d = backend.decoder().expect("available backend");
        let (mut full, mut out) = (ImageRgb8::default(), ImageRgb8::default());
        group.bench_function(format!("{backend}/full"), |b| {
            b.iter(|| {
                for blob in blobs {
                    d.decode(blob, DecodeHint::default(), &mut full).expect("decode");
                }
            })
        });
        for &imgsz in sizes {
            group.bench_function(format!("{backend}/full+resize{imgsz}"), |b| {
                b.iter(|| {
                    for blob in blobs {
                        let info = d.decode(blob, DecodeHint::default(), &mut full).expect("decode");
                        resize::resize_long_side(&full, info.orig_width, info.orig_height, imgsz, false, &mut out)
                            .expect("resize");
                    }
                })
            });
            group.bench_function(format!("{backend}/target{imgsz}"), |b| {
                b.iter(|| {
                    for blob in blobs {
                        decode_to_target(&*d, blob, TargetOptions::new(imgsz), &mut full, &mut out).expect("decode");
                    }
                })
            });
        }
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    decode_cases(c, "decode", &load(), &[640, 320]);
}

/// Camera-sized JPEGs made from `blobs` (see the header).
fn large_copies(blobs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    use image::codecs::jpeg::JpegEncoder;
    let decoder = Backend::preferred().expect("a backend").decoder().expect("decoder");
    let mut img = ImageRgb8::default();
    let mut out = Vec::new();
    for blob in blobs {
        let info = decoder.decode(blob, DecodeHint::default(), &mut img).expect("decode");
        if info.orig_width.max(info.orig_height) < 600 {
            continue;
        }
        let (w, h) = (img.width(), img.height());
        let rows: Vec<u8> = (0..h).flat_map(|y| img.row(y).iter().copied()).collect();
        let src = image::RgbImage::from_raw(w, h, rows).expect("rgb buffer");
        let big = image::imageops::resize(&src, w * 3, h * 3, image::imageops::FilterType::Triangle);
        let mut jpeg = Vec::new();
        JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&big).expect("encode");
        out.push(jpeg);
        if out.len() == 24 {
            break;
        }
    }
    out
}

fn decode_large(c: &mut Criterion) {
    let blobs = large_copies(&load());
    let mb = blobs.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    eprintln!("decode_large: {} camera-sized JPEGs ({mb:.1} MB)", blobs.len());
    decode_cases(c, "decode_large", &blobs, &[640]);
}

/// The area resize alone, on one camera-sized image: by 1.5× (OpenCV's coverage weights, what a 1/2-scale decode of
/// a 1920 px source leaves to do) and by 3× (an integer factor: `fast_image_resize`'s box filter).
fn area_resize(c: &mut Criterion) {
    let blobs = large_copies(&load()[..8]);
    let decoder = Backend::preferred().expect("a backend").decoder().expect("decoder");
    let mut src = ImageRgb8::default();
    decoder.decode(&blobs[0], DecodeHint::default(), &mut src).expect("decode");
    let (w, h) = (src.width(), src.height());
    let mut half = ImageRgb8::default();
    resize::resize(&src, w / 2, h / 2, resize::Interpolation::Area, &mut half).expect("resize");
    let mut out = ImageRgb8::default();
    let mut group = c.benchmark_group("area_resize");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    for (name, img, factor) in [("by1.5", &half, 1.5), ("by3", &src, 3.0)] {
        let (dw, dh) = ((f64::from(img.width()) / factor) as u32, (f64::from(img.height()) / factor) as u32);
        group.throughput(Throughput::Elements(u64::from(img.width()) * u64::from(img.height())));
        group.bench_function(format!("{name}/{}x{}", img.width(), img.height()), |b| {
            b.iter(|| resize::resize(img, dw, dh, resize::Interpolation::Area, &mut out).expect("resize"))
        });
    }
    group.finish();
}

criterion_group!(benches, decode, decode_large, area_resize);
criterion_main!(benches);
