//! Helpers shared by the integration tests: fixture loading and pixel comparison.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;

use sluice_decode::{Backend, Decoder, ImageRgb8};

/// Path of a fixture in `tests/data`, or in `$SLUICE_DECODE_TEST_DATA` (the device check runs the prebuilt suite
/// from another checkout).
pub fn data(name: &str) -> PathBuf {
    let dir = std::env::var_os("SLUICE_DECODE_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"));
    dir.join(name)
}

/// Bytes of a fixture.
pub fn bytes(name: &str) -> Vec<u8> {
    std::fs::read(data(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A reference PNG as an RGB8 image (decoded with the `image` crate's PNG decoder, lossless).
pub fn reference(name: &str) -> ImageRgb8 {
    let img = image::load_from_memory_with_format(&bytes(name), image::ImageFormat::Png).expect("reference png");
    let rgb = img.into_rgb8();
    let (w, h) = rgb.dimensions();
    ImageRgb8::from_raw(w, h, w as usize * 3, rgb.into_raw()).expect("packed")
}

/// The backends the suite runs against: every compiled-in backend that can run on this machine
/// ([`Backend::available`]; nvjpeg only where its libraries load and a GPU is present). Prints the list. With
/// `SLUICE_REQUIRE_NVJPEG=1`, fails unless nvjpeg is among them, so a GPU run cannot pass without testing it.
pub fn backends() -> Vec<Backend> {
    let all = Backend::available();
    let skipped: Vec<String> = Backend::compiled()
        .into_iter()
        .filter(|b| !all.contains(b))
        .map(|b| format!("{b} ({})", b.probe().err().map_or_else(String::new, |e| e.to_string())))
        .collect();
    // Once per test binary (tests run in parallel threads and all ask).
    static PRINTED: std::sync::Once = std::sync::Once::new();
    PRINTED.call_once(|| {
        eprintln!(
            "decode backends under test: {}{}",
            all.iter().map(|b| b.name()).collect::<Vec<_>>().join(", "),
            if skipped.is_empty() { String::new() } else { format!("; skipped: {}", skipped.join("; ")) }
        );
    });
    if std::env::var("SLUICE_REQUIRE_NVJPEG").is_ok_and(|v| v == "1")
        && let Err(e) = Backend::NvJpeg.probe()
    {
        panic!("SLUICE_REQUIRE_NVJPEG=1 but the nvjpeg backend cannot run: {e}");
    }
    assert!(!all.is_empty(), "no backend compiled in and available");
    all
}

/// A decoder of every backend of [`backends`].
pub fn decoders() -> Vec<Box<dyn Decoder>> {
    backends().into_iter().map(|b| b.decoder().unwrap_or_else(|e| panic!("available backend {b}: {e}"))).collect()
}

/// Pixel difference statistics between two images of the same size.
#[derive(Debug, Clone, Copy)]
pub struct Diff {
    pub mean: f64,
    pub max: u8,
    /// Fraction of channel values differing by more than 8 levels.
    pub over8: f64,
}

pub fn diff(a: &ImageRgb8, b: &ImageRgb8) -> Diff {
    assert_eq!((a.width(), a.height()), (b.width(), b.height()), "sizes differ");
    let (mut sum, mut max, mut over, mut n) = (0u64, 0u8, 0u64, 0u64);
    for y in 0..a.height() {
        for (p, q) in a.row(y).iter().zip(b.row(y)) {
            let d = p.abs_diff(*q);
            sum += u64::from(d);
            max = max.max(d);
            over += u64::from(d > 8);
            n += 1;
        }
    }
    Diff { mean: sum as f64 / n.max(1) as f64, max, over8: over as f64 / n.max(1) as f64 }
}
