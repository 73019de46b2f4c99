//! The label index cache (like Ultralytics' `labels/<split>.cache`): every scanned image's outcome (its sample
//! or the reason it was skipped, and its problems) keyed by the size and modification time of the image and of
//! its label file. An entry is reused only when both stamps still match, so a changed, added or removed file is
//! rescanned; a cache with another format version, class count or a bad checksum is ignored and rebuilt, never
//! trusted. Written atomically: a temporary file in the same folder, then a rename.
//!
//! Layout: one ASCII header line `sluice-label-cache <version> <fnv1a64 of body, hex> <body length>` and a JSON
//! body.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use crate::error::{DatasetError, Result};
use crate::index::Sample;
use crate::problem::Problem;

const MAGIC: &str = "sluice-label-cache";
/// Bump when the scan rules or the entry layout change: older caches are then rebuilt.
pub const CACHE_VERSION: u32 = 1;

/// Size and modification time of a file, the key of a cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    /// Length in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the Unix epoch (0 if unknown).
    pub mtime_ns: u64,
}

impl FileStamp {
    /// The stamp of `path`, `None` when it is not a readable regular file.
    pub fn of(path: &Path) -> Option<Self> {
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        let mtime_ns = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        Some(Self { len: m.len(), mtime_ns })
    }
}

/// The outcome of scanning one image, as cached.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScanEntry {
    /// The image file.
    pub image: PathBuf,
    /// Its stamp when scanned (`None`: it could not be read).
    pub image_stamp: Option<FileStamp>,
    /// The label file's stamp when scanned (`None`: there was none).
    pub label_stamp: Option<FileStamp>,
    /// The sample, `None` when the image was skipped.
    pub sample: Option<Sample>,
    /// Problems found.
    pub problems: Vec<Problem>,
}

/// What the cache did during one index build.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CacheStatus {
    /// The cache file (`None`: caching disabled).
    pub path: Option<PathBuf>,
    /// Entries reused from the cache.
    pub reused: usize,
    /// Images scanned afresh.
    pub scanned: usize,
    /// Why the cache file was not used at all (absent, other version, corrupt…).
    pub rebuilt_reason: Option<String>,
    /// Whether a new cache file was written.
    pub saved: bool,
    /// Why writing failed (e.g. a read-only dataset folder); the index is still complete.
    pub warning: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Body {
    version: u32,
    nc: usize,
    entries: Vec<ScanEntry>,
}

/// FNV-1a, 64 bit: a checksum of the body (corruption detection, not security).
fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Loads a cache for a dataset of `nc` classes. `Err` says why it cannot be used.
pub fn load(path: &Path, nc: usize) -> std::result::Result<Vec<ScanEntry>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    decode(&bytes, path, nc)
}

/// Decodes a cache file's bytes (the body of [`load`], no filesystem access); `path` names it in errors. The
/// header's length is compared as text with the body's, never used to allocate. Cached samples are checked like
/// a scan's output (class below `nc`, one crowd flag per object or none, finite boxes with a positive area
/// inside the image): a cache that passes the checksum but breaks these is corrupt too.
pub fn decode(bytes: &[u8], path: &Path, nc: usize) -> std::result::Result<Vec<ScanEntry>, String> {
    let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(|| format!("{}: no header line", path.display()))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| format!("{}: header not text", path.display()))?;
    let body = &bytes[nl + 1..];
    let parts: Vec<&str> = header.split(' ').collect();
    let [magic, version, sum, len] = parts[..] else {
        return Err(format!("{}: not a Sluice label cache", path.display()));
    };
    if magic != MAGIC {
        return Err(format!("{}: not a Sluice label cache", path.display()));
    }
    if version != CACHE_VERSION.to_string() {
        return Err(format!("{}: cache version {version}, expected {CACHE_VERSION}", path.display()));
    }
    if len != body.len().to_string() || sum != format!("{:016x}", fnv1a64(body)) {
        return Err(format!("{}: corrupt cache (length or checksum mismatch)", path.display()));
    }
    let b: Body = serde_json::from_slice(body).map_err(|e| format!("{}: corrupt cache: {e}", path.display()))?;
    if b.version != CACHE_VERSION || b.nc != nc {
        return Err(format!("{}: cache made for {} classes, dataset has {nc}", path.display(), b.nc));
    }
    for (i, e) in b.entries.iter().enumerate() {
        if let Some(s) = &e.sample
            && let Err(why) = check_sample(s, nc)
        {
            return Err(format!("{}: corrupt cache: entry {i} ({}): {why}", path.display(), e.image.display()));
        }
    }
    Ok(b.entries)
}

/// What a scanned sample always satisfies (see `index::scan_image` and `labels::to_pixel_labels`).
fn check_sample(s: &Sample, nc: usize) -> std::result::Result<(), String> {
    let l = &s.labels;
    if !(s.crowd.is_empty() || s.crowd.len() == l.objects.len()) {
        return Err(format!("{} crowd flags for {} objects", s.crowd.len(), l.objects.len()));
    }
    let (w, h) = (l.width as f32, l.height as f32);
    for o in &l.objects {
        if o.class as usize >= nc {
            return Err(format!("class {} with {nc} classes", o.class));
        }
        let b = o.bbox;
        if !(0.0 <= b.x1 && b.x1 < b.x2 && b.x2 <= w && 0.0 <= b.y1 && b.y1 < b.y2 && b.y2 <= h) {
            return Err(format!("box {b:?} outside {}x{} or empty", l.width, l.height));
        }
    }
    Ok(())
}

/// Writes a cache atomically (temporary file + rename).
pub fn save(path: &Path, nc: usize, entries: &[ScanEntry]) -> Result<()> {
    let body = Body { version: CACHE_VERSION, nc, entries: entries.to_vec() };
    let json = serde_json::to_vec(&body)
        .map_err(|e| DatasetError::Json { path: path.to_path_buf(), reason: e.to_string() })?;
    let header = format!("{MAGIC} {CACHE_VERSION} {:016x} {}\n", fnv1a64(&json), json.len());
    // Like Ultralytics' `is_dir_writeable`, but also for root: a folder without write bits (a read-only shared
    // dataset) is left alone.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if std::fs::metadata(dir).map_err(|e| DatasetError::io(dir, e))?.permissions().readonly() {
        let e = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "cache folder is not writeable");
        return Err(DatasetError::io(dir, e));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(header.as_bytes())?;
        f.write_all(&json)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        DatasetError::io(path, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects_tampering() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.cache");
        let e = ScanEntry {
            image: "a.jpg".into(),
            image_stamp: Some(FileStamp { len: 3, mtime_ns: 7 }),
            label_stamp: None,
            sample: None,
            problems: vec![],
        };
        save(&p, 4, std::slice::from_ref(&e)).unwrap();
        assert_eq!(load(&p, 4).unwrap(), vec![e]);
        assert!(load(&p, 5).unwrap_err().contains("classes"));
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert!(load(&p, 4).unwrap_err().contains("corrupt"));
        std::fs::write(&p, b"garbage").unwrap();
        assert!(load(&p, 4).is_err());
        assert!(decode(b"sluice-label-cache 1 0 18446744073709551615\n{}", &p, 4).unwrap_err().contains("corrupt"));
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    /// A cache whose checksum matches but whose samples no scan could produce (a class past `nc`, a box outside
    /// the image, crowd flags not matching the objects) is corrupt, not trusted.
    #[test]
    fn rejects_samples_a_scan_cannot_produce() {
        use sluice_core::{BoxXyxy, ImageLabels, Label};
        let p = Path::new("t.cache");
        let sample = |class: u32, x2: f32, crowd: usize| Sample {
            image: "a.jpg".into(),
            format: crate::header::ImageFormat::Jpeg,
            label_file: None,
            labels: ImageLabels {
                width: 10,
                height: 10,
                objects: vec![Label { class, bbox: BoxXyxy { x1: 1.0, y1: 1.0, x2, y2: 5.0 } }],
            },
            crowd: vec![false; crowd],
            image_id: None,
        };
        let bytes = |s: Sample| {
            let e = ScanEntry {
                image: "a.jpg".into(),
                image_stamp: None,
                label_stamp: None,
                sample: Some(s),
                problems: vec![],
            };
            let json = serde_json::to_vec(&Body { version: CACHE_VERSION, nc: 4, entries: vec![e] }).unwrap();
            let mut out = format!("{MAGIC} {CACHE_VERSION} {:016x} {}\n", fnv1a64(&json), json.len()).into_bytes();
            out.extend(json);
            out
        };
        assert_eq!(decode(&bytes(sample(3, 5.0, 1)), p, 4).unwrap().len(), 1);
        assert_eq!(decode(&bytes(sample(3, 5.0, 0)), p, 4).unwrap().len(), 1);
        for (s, why) in [(sample(4, 5.0, 1), "class 4"), (sample(0, 11.0, 1), "outside"), (sample(0, 5.0, 2), "crowd")]
        {
            let e = decode(&bytes(s), p, 4).unwrap_err();
            assert!(e.contains("corrupt cache: entry 0") && e.contains(why), "{e}");
        }
    }
}
