//! Decode throughput per backend on real JPEGs (coco128 train2017 when available): full decode, full decode +
//! Ultralytics resize, and decode-to-target (DCT-scaled where the source allows, then resize), at 640 and 320.
//! One iteration = one pass over every image, single thread (like `m3_jpeg_decode.py`); throughput in images.
//!
//! Group `decode_large` measures the decode target "decode-to-target (640) ≥ 1.3× full decode + resize", which needs
//! sources at least twice the target: coco128's images are at most 640 px, so it encodes camera-sized copies of
//! them (the first 24 with a long side ≥ 600, upscaled 3× to ~1920×1440, JPEG quality 90) when the bench starts.
//! Group `decode_12mp` does the same with 8 copies upscaled 6.25× to ~4000×3000 (a phone's or an inspection
//! camera's 12 MP), where the decode to 640 runs at 1/4 scale. Upscaled photos carry less fine detail than native
//! ones, so their entropy decoding is cheaper; both cases decode the same files, so the ratio between them is what
//! the groups report.
//!
//! `SLUICE_DECODE_BENCH_RATIOS=N` adds, after the criterion groups, the target ratios measured from N interleaved
//! pairs (the two cases of a ratio alternate, so a change in the shared machine's load hits both alike): image vs
//! turbojpeg on coco128, and decode-to-target vs full decode + resize per backend and set, each as median (range).
//! With a filter that matches no group (`-- ratios-only`) only they run.
//!
//! Images: `images/train2017` of coco128 where `sluice_testkit::locations` finds it (`$SLUICE_COCO128`, by default
//! `$SLUICE_DATASETS/coco128`, by default under `../shared` beside the repository), else the JPEGs committed in
//! `tests/data`. Run: `cargo bench -p sluice-decode --features turbojpeg`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use sluice_decode::{Backend, DecodeHint, Decoder, ImageRgb8, TargetOptions, decode_to_target, resize};

fn image_dir() -> (PathBuf, bool) {
    let coco = sluice_testkit::locations::coco128_dir().join("images/train2017");
    if coco.is_dir() {
        return (coco, true);
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

/// One pass over `blobs`: full decode, then Ultralytics' resize to `imgsz` when given. The buffers live in the
/// closure, so a timed pass allocates nothing once they have grown.
fn full_pass<'a>(d: &'a dyn Decoder, blobs: &'a [Vec<u8>], imgsz: Option<u32>) -> impl FnMut() + 'a {
    let (mut full, mut out) = (ImageRgb8::default(), ImageRgb8::default());
    move || {
        for blob in blobs {
            let info = d.decode(blob, DecodeHint::default(), &mut full).expect("decode");
            if let Some(imgsz) = imgsz {
                resize::resize_long_side(&full, info.orig_width, info.orig_height, imgsz, false, &mut out)
                    .expect("resize");
            }
        }
    }
}

/// One pass over `blobs` with [`decode_to_target`] (DCT-scaled where the source allows, then resize).
fn target_pass<'a>(d: &'a dyn Decoder, blobs: &'a [Vec<u8>], imgsz: u32) -> impl FnMut() + 'a {
    let (mut scratch, mut out) = (ImageRgb8::default(), ImageRgb8::default());
    move || {
        for blob in blobs {
            decode_to_target(d, blob, TargetOptions::new(imgsz), &mut scratch, &mut out).expect("decode");
        }
    }
}

/// Per compiled backend (nvjpeg only where its libraries load and a GPU is present): full decode, and for each
/// size full decode + resize against decode-to-target.
fn decode_cases(c: &mut Criterion, name: &str, blobs: &[Vec<u8>], sizes: &[u32]) {
    let mut group = c.benchmark_group(name);
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(blobs.len() as u64));
    for backend in Backend::available() {
        let d = backend.decoder().expect("available backend");
        let mut full = full_pass(&*d, blobs, None);
        group.bench_function(format!("{backend}/full"), |b| b.iter(&mut full));
        for &imgsz in sizes {
            let mut full_resize = full_pass(&*d, blobs, Some(imgsz));
            group.bench_function(format!("{backend}/full+resize{imgsz}"), |b| b.iter(&mut full_resize));
            let mut target = target_pass(&*d, blobs, imgsz);
            group.bench_function(format!("{backend}/target{imgsz}"), |b| b.iter(&mut target));
        }
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    decode_cases(c, "decode", &load(), &[640, 320]);
}

/// Camera-sized JPEGs made from `blobs` (see the header): the first `count` with a long side of at least 600 px,
/// upscaled `factor`× (triangle filter) and encoded at quality 90; `label` names the set in the log.
fn large_copies(blobs: &[Vec<u8>], factor: f64, count: usize, label: &str) -> Vec<Vec<u8>> {
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
        let (bw, bh) = ((f64::from(w) * factor).round() as u32, (f64::from(h) * factor).round() as u32);
        let big = image::imageops::resize(&src, bw, bh, image::imageops::FilterType::Triangle);
        let mut jpeg = Vec::new();
        JpegEncoder::new_with_quality(&mut jpeg, 90).encode_image(&big).expect("encode");
        out.push(jpeg);
        if out.len() == count {
            break;
        }
    }
    let mb = out.iter().map(Vec::len).sum::<usize>() as f64 / 1e6;
    eprintln!("{label}: {} JPEGs upscaled {factor}x ({mb:.1} MB)", out.len());
    out
}

/// The camera-sized set: ~1920×1440, a 1/2-scale decode at 640.
const CAMERA: (f64, usize, &str) = (3.0, 24, "camera-sized (3x)");
/// The 12 MP set: ~4000×3000, a 1/4-scale decode at 640.
const TWELVE_MP: (f64, usize, &str) = (6.25, 8, "12 MP (6.25x)");

fn decode_large(c: &mut Criterion) {
    let (factor, count, label) = CAMERA;
    decode_cases(c, "decode_large", &large_copies(&load(), factor, count, label), &[640]);
}

fn decode_12mp(c: &mut Criterion) {
    let (factor, count, label) = TWELVE_MP;
    decode_cases(c, "decode_12mp", &large_copies(&load(), factor, count, label), &[640]);
}

/// The area resize alone, on one camera-sized image: by 1.5× (OpenCV's coverage weights, what a 1/2-scale decode of
/// a 1920 px source leaves to do) and by 3× (an integer factor: `fast_image_resize`'s box filter).
fn area_resize(c: &mut Criterion) {
    let blobs = large_copies(&load()[..8], 3.0, 1, "area resize source");
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

criterion_group!(benches, decode, decode_large, decode_12mp, area_resize);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let pairs = std::env::var("SLUICE_DECODE_BENCH_RATIOS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if pairs > 0 {
        interleaved_ratios(pairs);
    }
}

/// Times one pass of `a` and one of `b` in `pairs` pairs after two untimed ones, alternating which runs first, so
/// a change in the shared machine's load hits both alike. Returns the per-pair ratios time(a) / time(b) (above 1:
/// `b` is faster), sorted.
fn paired(pairs: usize, a: &mut dyn FnMut(), b: &mut dyn FnMut()) -> Vec<f64> {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    };
    let mut ratios = Vec::with_capacity(pairs);
    for i in 0..pairs + 2 {
        let (ta, tb) = if i % 2 == 0 {
            let ta = time(a);
            (ta, time(b))
        } else {
            let tb = time(b);
            (time(a), tb)
        };
        if i >= 2 {
            ratios.push(ta / tb);
        }
    }
    ratios.sort_by(f64::total_cmp);
    ratios
}

fn report(what: &str, ratios: &[f64]) {
    let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
    eprintln!("  {what:58} {:.2} ({lo:.2}–{hi:.2})", ratios[ratios.len() / 2]);
}

/// The target decode ratios from interleaved pairs (`SLUICE_DECODE_BENCH_RATIOS=N`): the image backend against
/// turbojpeg (when both are compiled in), full decodes of coco128 and decodes to target on every set, and per
/// backend decode-to-target against full decode + resize on coco128 at 320 and on the camera-sized and 12 MP sets
/// at 640 (coco128 at 640 has nothing to scale). Each line: median of the per-pair speed ratios (range).
fn interleaved_ratios(pairs: usize) {
    let coco = load();
    let large = |(factor, count, label): (f64, usize, &str)| large_copies(&coco, factor, count, label);
    let sets = [("coco128", coco.clone(), 320), ("camera 3x", large(CAMERA), 640), ("12 MP", large(TWELVE_MP), 640)];
    let backends: Vec<(Backend, Box<dyn Decoder>)> =
        Backend::available().into_iter().map(|b| (b, b.decoder().expect("available backend"))).collect();
    eprintln!("speed ratios, {pairs} interleaved pairs each: median (range); above 1 the second is faster");
    let image = backends.iter().find(|(b, _)| *b == Backend::Image);
    let turbo = backends.iter().find(|(b, _)| *b == Backend::TurboJpeg);
    if let (Some((_, image)), Some((_, turbo))) = (image, turbo) {
        let r = paired(pairs, &mut full_pass(&**turbo, &coco, None), &mut full_pass(&**image, &coco, None));
        report("coco128 full: image vs turbojpeg", &r);
        let to_640 = ("coco128", &coco, 640);
        for (set, blobs, imgsz) in [to_640].into_iter().chain(sets.iter().map(|(s, b, i)| (*s, b, *i))) {
            let r = paired(pairs, &mut target_pass(&**turbo, blobs, imgsz), &mut target_pass(&**image, blobs, imgsz));
            report(&format!("{set} to {imgsz}: image vs turbojpeg"), &r);
        }
    }
    for (backend, d) in &backends {
        for (set, blobs, imgsz) in &sets {
            let r = paired(pairs, &mut full_pass(&**d, blobs, Some(*imgsz)), &mut target_pass(&**d, blobs, *imgsz));
            report(&format!("{backend} {set}: to {imgsz} vs full + resize"), &r);
        }
    }
}
