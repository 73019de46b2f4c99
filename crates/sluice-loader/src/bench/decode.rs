//! `sluice bench decode`: image decoding alone. Every image file of a split is read into RAM first; then each
//! repeat decodes the whole list with `threads` threads taking the next image from a shared counter, either at
//! full size or to the training size (`decode_to_target`: DCT-scaled decode when the source is at least twice
//! `imgsz`, then Ultralytics' resize with the training interpolation). Figures: images/s and megapixels/s of the
//! *source* images (width × height of the full image, also for reduced decodes, as in
//! `$PEERS_DIR/m3_jpeg_decode.py`), median over the repeats with their range.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;
use sluice_core::{DecodeHint, Decoder, ImageRgb8};
use sluice_dataset::{IndexOptions, Split};
use sluice_decode::{Backend, TargetOptions, decode_to_target};

use super::{BenchError, Result, Spread, rate, touch};
use crate::split::load_split;

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeBenchOptions {
    /// The dataset YAML.
    pub data: PathBuf,
    /// The split whose images are decoded.
    pub split: Split,
    /// The decode backend (one that is not compiled in answers "built without feature X").
    pub backend: Backend,
    /// Decoding threads.
    pub threads: usize,
    /// `Some(imgsz)`: decode to the training size; `None`: full-size decode.
    pub imgsz: Option<u32>,
    /// Timed passes over every image.
    pub repeats: usize,
    /// Untimed passes first.
    pub warmup: usize,
}

/// The result of [`run`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeBenchReport {
    /// The backend's name.
    pub backend: String,
    /// The split.
    pub split: &'static str,
    /// Decoding threads.
    pub threads: usize,
    /// `full` or `target`.
    pub mode: &'static str,
    /// The training size of a `target` decode.
    pub imgsz: Option<u32>,
    /// Images decoded per pass.
    pub images: usize,
    /// Encoded bytes of those images.
    pub encoded_bytes: u64,
    /// Megapixels of the source images (full width × height).
    pub source_mp: f64,
    /// Timed passes.
    pub repeats: usize,
    /// Median images/s over the passes.
    pub images_per_s: f64,
    /// Slowest pass, images/s.
    pub images_per_s_min: f64,
    /// Fastest pass, images/s.
    pub images_per_s_max: f64,
    /// Median source megapixels/s.
    pub mp_per_s: f64,
    /// Slowest pass, source MP/s.
    pub mp_per_s_min: f64,
    /// Fastest pass, source MP/s.
    pub mp_per_s_max: f64,
    /// Seconds of every timed pass.
    pub pass_seconds: Vec<f64>,
    /// A checksum of the decoded pixels (keeps the work observable).
    pub checksum: u64,
}

/// One pass: every blob decoded once; returns the source pixels and a checksum of the output.
fn pass(decoder: &dyn Decoder, blobs: &[(PathBuf, Vec<u8>)], threads: usize, imgsz: Option<u32>) -> Result<(u64, u64)> {
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<BenchError>> = Mutex::new(None);
    let worker = || {
        let (mut scratch, mut out) = (ImageRgb8::default(), ImageRgb8::default());
        let (mut pixels, mut sum) = (0u64, 0u64);
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((path, bytes)) = blobs.get(i) else { break };
            let decoded = match imgsz {
                Some(imgsz) => {
                    let opts = TargetOptions { imgsz, augment: true, dct_scaling: true };
                    decode_to_target(decoder, bytes, opts, &mut scratch, &mut out)
                        .map(|t| (t.orig_width, t.orig_height))
                }
                None => decoder.decode(bytes, DecodeHint::default(), &mut out).map(|d| (d.orig_width, d.orig_height)),
            };
            match decoded {
                Ok((w, h)) => {
                    pixels += u64::from(w) * u64::from(h);
                    sum = sum.wrapping_add(touch(out.as_bytes(), 4096));
                }
                Err(e) => {
                    let err = sluice_core::Error::Decode { what: path.display().to_string(), reason: e.to_string() };
                    first_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(err.into());
                    next.store(blobs.len(), Ordering::Relaxed);
                    break;
                }
            }
        }
        (pixels, sum)
    };
    let results: Vec<std::thread::Result<(u64, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.max(1)).map(|_| s.spawn(worker)).collect();
        handles.into_iter().map(|h| h.join()).collect()
    });
    if let Some(e) = first_error.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner) {
        return Err(e);
    }
    let mut total = (0u64, 0u64);
    for r in results {
        let (p, s) = r.map_err(|_| BenchError::Invalid { what: "decode thread", reason: "panicked".into() })?;
        total = (total.0 + p, total.1.wrapping_add(s));
    }
    Ok(total)
}

/// Reads the split's images into RAM, then times `opts.repeats` decoding passes.
pub fn run(opts: &DecodeBenchOptions) -> Result<DecodeBenchReport> {
    if opts.threads == 0 || opts.repeats == 0 {
        return Err(BenchError::Invalid { what: "settings", reason: "threads and repeats must be positive".into() });
    }
    if opts.imgsz == Some(0) {
        return Err(BenchError::Invalid { what: "imgsz", reason: "must be positive".into() });
    }
    let decoder = opts.backend.decoder()?;
    let loaded = load_split(&opts.data, opts.split, &IndexOptions { cache: true, find_orphans: false }, true)?;
    let mut blobs = Vec::with_capacity(loaded.index().len());
    for s in &loaded.index().samples {
        let bytes = std::fs::read(&s.image).map_err(|source| BenchError::Io { path: s.image.clone(), source })?;
        blobs.push((s.image.clone(), bytes));
    }
    let encoded_bytes = blobs.iter().map(|(_, b)| b.len() as u64).sum();
    for _ in 0..opts.warmup {
        pass(&*decoder, &blobs, opts.threads, opts.imgsz)?;
    }
    let (mut seconds, mut pixels, mut checksum) = (Vec::with_capacity(opts.repeats), 0u64, 0u64);
    for _ in 0..opts.repeats {
        let t0 = Instant::now();
        let (px, sum) = pass(&*decoder, &blobs, opts.threads, opts.imgsz)?;
        seconds.push(t0.elapsed().as_secs_f64());
        pixels = px;
        checksum = checksum.wrapping_mul(31).wrapping_add(sum);
    }
    let n = blobs.len();
    let mp = pixels as f64 / 1e6;
    let ips: Vec<f64> = seconds.iter().map(|&t| rate(n as f64, t)).collect();
    let mps: Vec<f64> = seconds.iter().map(|&t| rate(mp, t)).collect();
    let none = || BenchError::Invalid { what: "repeats", reason: "no timed pass".into() };
    let (i, m) = (Spread::of(&ips).ok_or_else(none)?, Spread::of(&mps).ok_or_else(none)?);
    Ok(DecodeBenchReport {
        backend: decoder.name().to_string(),
        split: opts.split.as_str(),
        threads: opts.threads,
        mode: if opts.imgsz.is_some() { "target" } else { "full" },
        imgsz: opts.imgsz,
        images: n,
        encoded_bytes,
        source_mp: mp,
        repeats: opts.repeats,
        images_per_s: i.median,
        images_per_s_min: i.min,
        images_per_s_max: i.max,
        mp_per_s: m.median,
        mp_per_s_min: m.min,
        mp_per_s_max: m.max,
        pass_seconds: seconds,
        checksum,
    })
}

impl DecodeBenchReport {
    /// One line for the console.
    pub fn to_text(&self) -> String {
        let what = match self.imgsz {
            Some(s) => format!("to imgsz {s}"),
            None => "full size".to_string(),
        };
        format!(
            "{} decode {what}, {} thread(s), {} {} images ({:.1} MB, {:.1} source MP), {} passes: {:.1} img/s \
             (min {:.1}, max {:.1}), {:.1} MP/s (min {:.1}, max {:.1})\n",
            self.backend,
            self.threads,
            self.images,
            self.split,
            self.encoded_bytes as f64 / 1e6,
            self.source_mp,
            self.repeats,
            self.images_per_s,
            self.images_per_s_min,
            self.images_per_s_max,
            self.mp_per_s,
            self.mp_per_s_min,
            self.mp_per_s_max
        )
    }
}
