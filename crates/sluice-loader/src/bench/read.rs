//! `sluice bench read`: the byte readers of `sluice-storage` on the same records — the split's image files read
//! one by one ([`FileReader`], from the OS page cache after the warm-up), the split packed into a temporary shard
//! the way `sluice pack` packs it ([`PackedReader`], slices of the mmap, crc32-checked on every read, and
//! unchecked), and a warm RAM cache in front of the files ([`CachedReader`]). One pass = every record once; the
//! consumer touches one byte per 64 (every cache line), as a decoder would read them all. The readers take turns
//! within each repeat, so machine noise spreads evenly over them. Figures: MB/s (10^6 bytes of image data), median
//! over the repeats with their range.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use sluice_core::Reader;
use sluice_dataset::{IndexOptions, Split};
use sluice_storage::{CachedReader, FileReader, PackedReader, Verify};

use super::{BenchError, Result, Spread, rate, touch};
use crate::split::{DataError, load_split, pack_index};

/// What to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBenchOptions {
    /// The dataset YAML.
    pub data: PathBuf,
    /// The split whose images are read.
    pub split: Split,
    /// Timed passes per reader.
    pub repeats: usize,
    /// Untimed passes per reader first (at least one fills the RAM cache).
    pub warmup: usize,
}

/// One reader's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReaderFigures {
    /// `file`, `packed`, `packed_unverified` or `cached`.
    pub reader: &'static str,
    /// Median MB/s over the passes.
    pub mb_per_s: f64,
    /// Slowest pass, MB/s.
    pub mb_per_s_min: f64,
    /// Fastest pass, MB/s.
    pub mb_per_s_max: f64,
    /// Median records/s.
    pub records_per_s: f64,
    /// Seconds of every timed pass.
    pub pass_seconds: Vec<f64>,
}

/// The result of [`run`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReadBenchReport {
    /// The split.
    pub split: &'static str,
    /// Records (usable images of the split).
    pub records: usize,
    /// Image bytes per pass.
    pub bytes: u64,
    /// Size of the temporary shard.
    pub shard_bytes: u64,
    /// Timed passes per reader.
    pub repeats: usize,
    /// [`FileReader`]: open + read per record.
    pub file: ReaderFigures,
    /// [`PackedReader`], crc32 checked on every read.
    pub packed: ReaderFigures,
    /// [`PackedReader`] with [`Verify::Never`].
    pub packed_unverified: ReaderFigures,
    /// [`CachedReader`] over the files, warm.
    pub cached: ReaderFigures,
    /// A checksum of the bytes touched.
    pub checksum: u64,
}

/// One pass over every record: bytes served and a checksum.
fn pass(reader: &dyn Reader, scratch: &mut Vec<u8>) -> Result<(u64, u64)> {
    let (mut bytes, mut sum) = (0u64, 0u64);
    for id in 0..reader.len() as u64 {
        let b = reader.read(id, scratch)?;
        bytes += b.len() as u64;
        sum = sum.wrapping_mul(31).wrapping_add(touch(b, 64));
    }
    Ok((bytes, sum))
}

/// Packs the split into a temporary shard and times the readers on it and on the files.
pub fn run(opts: &ReadBenchOptions) -> Result<ReadBenchReport> {
    if opts.repeats == 0 {
        return Err(BenchError::Invalid { what: "repeats", reason: "must be positive".into() });
    }
    let loaded = load_split(&opts.data, opts.split, &IndexOptions { cache: true, find_orphans: false }, true)?;
    let index = loaded.index();
    let dir = tempfile::tempdir().map_err(|source| BenchError::Io { path: std::env::temp_dir(), source })?;
    let shard = dir.path().join(format!("{}.sluice", opts.split.as_str()));
    let packed = pack_index(index, &shard).map_err(DataError::from)?;
    let paths: Vec<PathBuf> = index.samples.iter().map(|s| s.image.clone()).collect();
    let readers: [(&'static str, Box<dyn Reader>); 4] = [
        ("file", Box::new(FileReader::new(paths.clone()))),
        ("packed", Box::new(PackedReader::open(&shard)?)),
        ("packed_unverified", Box::new(PackedReader::open(&shard)?.with_verify(Verify::Never))),
        ("cached", Box::new(CachedReader::new(FileReader::new(paths), usize::MAX))),
    ];
    let mut scratch = Vec::new();
    let mut expected = None;
    for (name, reader) in &readers {
        for _ in 0..opts.warmup.max(1) {
            let (bytes, _) = pass(&**reader, &mut scratch)?;
            if *expected.get_or_insert(bytes) != bytes {
                return Err(BenchError::Invalid {
                    what: "readers",
                    reason: format!("{name} served {bytes} bytes, the files hold {}", expected.unwrap_or(0)),
                });
            }
        }
    }
    let bytes = expected.unwrap_or(0);
    let mut seconds: [Vec<f64>; 4] = Default::default();
    let mut checksum = 0u64;
    for _ in 0..opts.repeats {
        for ((_, reader), secs) in readers.iter().zip(seconds.iter_mut()) {
            let t0 = Instant::now();
            let (_, sum) = pass(&**reader, &mut scratch)?;
            secs.push(t0.elapsed().as_secs_f64());
            checksum = checksum.wrapping_mul(31).wrapping_add(sum);
        }
    }
    let records = index.len();
    let figures = |k: usize| -> Result<ReaderFigures> {
        let mbs: Vec<f64> = seconds[k].iter().map(|&t| rate(bytes as f64 / 1e6, t)).collect();
        let rps: Vec<f64> = seconds[k].iter().map(|&t| rate(records as f64, t)).collect();
        let none = || BenchError::Invalid { what: "repeats", reason: "no timed pass".into() };
        let (m, r) = (Spread::of(&mbs).ok_or_else(none)?, Spread::of(&rps).ok_or_else(none)?);
        Ok(ReaderFigures {
            reader: readers[k].0,
            mb_per_s: m.median,
            mb_per_s_min: m.min,
            mb_per_s_max: m.max,
            records_per_s: r.median,
            pass_seconds: seconds[k].clone(),
        })
    };
    Ok(ReadBenchReport {
        split: opts.split.as_str(),
        records,
        bytes,
        shard_bytes: packed.file_bytes,
        repeats: opts.repeats,
        file: figures(0)?,
        packed: figures(1)?,
        packed_unverified: figures(2)?,
        cached: figures(3)?,
        checksum,
    })
}

impl ReadBenchReport {
    /// A few lines for the console.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{} {} records, {:.1} MB per pass (shard {:.1} MB), {} passes per reader:\n",
            self.records,
            self.split,
            self.bytes as f64 / 1e6,
            self.shard_bytes as f64 / 1e6,
            self.repeats
        );
        for f in [&self.file, &self.packed, &self.packed_unverified, &self.cached] {
            s += &format!(
                "  {:<18} {:>9.1} MB/s (min {:.1}, max {:.1}) · {:.0} records/s\n",
                f.reader, f.mb_per_s, f.mb_per_s_min, f.mb_per_s_max, f.records_per_s
            );
        }
        s
    }
}
