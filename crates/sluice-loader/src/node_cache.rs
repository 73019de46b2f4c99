//! The node cache: one file of decoded images (already at the training size) that one process per machine writes
//! and every rank of a data-parallel run on that machine maps read-only, so the machine holds one copy of the
//! decoded dataset instead of one per rank, and its byte budget is counted once.
//!
//! File layout (all integers little-endian):
//!
//! | bytes | what |
//! |---|---|
//! | 0..8 | magic `SLUINODE` |
//! | 8..12 | format version ([`VERSION`]) |
//! | 12..16 | bytes per table entry (40) |
//! | 16..24 | the key the file was built for ([`NodeCache::key_of`]) |
//! | 24..32 | samples in the index (table entries) |
//! | 32..40 | images held |
//! | 40..48 | pixel bytes held |
//! | 48..52 | CRC-32 of the header (these four bytes taken as zero) and the table |
//! | 52..56 | zero |
//! | 56..64 | the file's length in bytes |
//! | 64.. | one entry per sample: offset (u64, `u64::MAX` when absent), byte length (u64), row stride (u64), width, height, original width, original height (u32 each) |
//! | then | the pixels, each image's whole backing buffer (rows `stride` bytes apart) |

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;
use rayon::prelude::*;
use sluice_core::{Error, ImageRgb8, Result, SampleId, SharedBytes};
use sluice_dataset::SampleIndex;

use crate::DecodedSource;

const MAGIC: [u8; 8] = *b"SLUINODE";
/// The file format version a reader accepts; bump it whenever the layout changes.
pub const VERSION: u32 = 2;
const HEADER_LEN: usize = 64;
const ENTRY_LEN: usize = 40;
const ABSENT: u64 = u64::MAX;
const CRC_AT: usize = 48;
const FILE_LEN_AT: usize = 56;
/// Bytes between the reads of [`NodeCache::fault_in`]: the smallest page size of the platforms Sluice runs on.
const PAGE: usize = 4096;

/// One image of the node cache: a view into the mapped file.
#[derive(Debug, Clone, Copy)]
pub struct CachedImage<'a> {
    /// The image's backing buffer: `height` rows `stride` bytes apart, `3 * width` bytes of RGB each.
    pub pixels: &'a [u8],
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Bytes between the starts of two rows.
    pub stride: usize,
    /// The original width the decoder reported, the frame the index's labels refer to.
    pub orig_width: u32,
    /// The original height the decoder reported.
    pub orig_height: u32,
}

/// One table entry, as written and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    offset: u64,
    len: u64,
    stride: u64,
    width: u32,
    height: u32,
    orig_width: u32,
    orig_height: u32,
}

impl Entry {
    const ABSENT: Self = Self { offset: ABSENT, len: 0, stride: 0, width: 0, height: 0, orig_width: 0, orig_height: 0 };

    fn to_bytes(self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.stride.to_le_bytes());
        b[24..28].copy_from_slice(&self.width.to_le_bytes());
        b[28..32].copy_from_slice(&self.height.to_le_bytes());
        b[32..36].copy_from_slice(&self.orig_width.to_le_bytes());
        b[36..40].copy_from_slice(&self.orig_height.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Self {
        Self {
            offset: u64_at(b, 0),
            len: u64_at(b, 8),
            stride: u64_at(b, 16),
            width: u32_at(b, 24),
            height: u32_at(b, 28),
            orig_width: u32_at(b, 32),
            orig_height: u32_at(b, 36),
        }
    }
}

// Callers pass slices whose length the header and table checks have already established.
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut v = [0u8; 4];
    v.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(v)
}

/// Decoded images at the training size in a read-only mapped file shared by the processes of one machine.
///
/// The file must not be modified in place while mapped; [`NodeCache::build`] never does (it writes a temporary file
/// and renames it), and a rebuild replaces the name, leaving the mapped inode intact.
pub struct NodeCache {
    path: PathBuf,
    map: Arc<Mmap>,
    /// Bytes asked to be read ahead so far ([`NodeCache::prefetch`]).
    prefetched: AtomicU64,
    key: u64,
    samples: usize,
    images: usize,
    bytes: usize,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache")
            .field("path", &self.path)
            .field("key", &format_args!("{:016x}", self.key))
            .field("samples", &self.samples)
            .field("images", &self.images)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl NodeCache {
    /// Decodes `source`'s samples in index order and writes their pixels to `path` until the next image would take
    /// the pixel bytes past `budget_bytes`; the samples from there on, and any sample that fails to read or decode,
    /// are absent (the source decodes them itself and reports their errors as it would without a node cache).
    /// The file appears under `path` atomically (written beside it, then renamed), so a process that opens `path`
    /// never maps a half-written file; the result is the mapped file.
    pub fn build(path: &Path, source: &DecodedSource, key: u64, budget_bytes: usize) -> Result<Self> {
        Self::build_with_progress(path, source, key, budget_bytes, &mut |_, _| {})
    }

    /// As [`NodeCache::build`], calling `progress(done, total)` after each group of samples is written. Before
    /// writing it checks that the file system holding `path` has room for the file (an estimate from the index's
    /// image sizes, capped by the budget) and fails naming the folder and the bytes needed when it has not.
    pub fn build_with_progress(
        path: &Path,
        source: &DecodedSource,
        key: u64,
        budget_bytes: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let io = |e: std::io::Error| Error::Io { path: path.to_path_buf(), source: e };
        let samples = source.index().len();
        let table_end = (HEADER_LEN + samples * ENTRY_LEN) as u64;
        // The temporary file is named after the cache so a leftover of a killed build says what it was, and the
        // next build of the same file can remove it.
        let name = path.file_name().map_or_else(|| "sluice-node-cache".into(), |n| n.to_string_lossy().into_owned());
        remove_stale_temps(dir, &name);
        let need = table_end.saturating_add(estimated_pixel_bytes(source).min(budget_bytes as u64));
        sluice_storage::ensure_free_space(dir, need, "the decoded-image cache (or choose another folder: cache_dir)")?;
        let tmp = tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(dir).map_err(io)?;
        let mut out = BufWriter::with_capacity(1 << 20, tmp);
        let table = write_body(&mut out, source, budget_bytes, progress).map_err(io)?;
        let (images, bytes) =
            table.iter().filter(|e| e.offset != ABSENT).fold((0u64, 0u64), |(n, b), e| (n + 1, b + e.len));
        let mut head = [0u8; HEADER_LEN];
        head[0..8].copy_from_slice(&MAGIC);
        head[8..12].copy_from_slice(&VERSION.to_le_bytes());
        head[12..16].copy_from_slice(&(ENTRY_LEN as u32).to_le_bytes());
        head[16..24].copy_from_slice(&key.to_le_bytes());
        head[24..32].copy_from_slice(&(samples as u64).to_le_bytes());
        head[32..40].copy_from_slice(&images.to_le_bytes());
        head[40..48].copy_from_slice(&bytes.to_le_bytes());
        head[FILE_LEN_AT..FILE_LEN_AT + 8].copy_from_slice(&(table_end + bytes).to_le_bytes());
        let table: Vec<u8> = table.iter().flat_map(|e| e.to_bytes()).collect();
        let crc = checksum(&head, &table);
        head[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        out.seek(SeekFrom::Start(0)).map_err(io)?;
        out.write_all(&head).map_err(io)?;
        out.write_all(&table).map_err(io)?;
        let tmp = out.into_inner().map_err(|e| io(e.into_error()))?;
        // No fsync: the file is a cache that any crash invalidates anyway (the next run rebuilds it), and on
        // /dev/shm there is no disk to reach.
        tmp.persist(path).map_err(|e| io(e.error))?;
        Self::open(path, key)
    }

    /// Maps the finished file at `path`, checking its magic, version, that it was built for `key`, its exact length,
    /// the checksum of its header and table, and that every table entry lies inside the file (so
    /// [`NodeCache::get`] cannot read out of bounds). A truncated, extended or damaged file is an error naming it.
    pub fn open(path: &Path, key: u64) -> Result<Self> {
        let io = |e: std::io::Error| Error::Io { path: path.to_path_buf(), source: e };
        let bad =
            |reason: String| Error::Invalid { what: "node cache", reason: format!("{}: {reason}", path.display()) };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len < HEADER_LEN as u64 {
            return Err(bad(format!("{len} bytes, shorter than the {HEADER_LEN}-byte header")));
        }
        // SAFETY: the map is read-only. The usual mmap caveat applies: the file must not be truncated or modified
        // in place while mapped (documented on the type); `build` only ever renames a finished file into place.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        if map.len() < HEADER_LEN {
            return Err(bad(format!("{} bytes, shorter than the {HEADER_LEN}-byte header", map.len())));
        }
        if map[0..8] != MAGIC {
            return Err(bad("not a Sluice node cache (bad magic)".into()));
        }
        let version = u32_at(&map, 8);
        if version != VERSION {
            return Err(bad(format!("format version {version}, this build reads version {VERSION}")));
        }
        let entry_len = u32_at(&map, 12);
        if entry_len as usize != ENTRY_LEN {
            return Err(bad(format!("{entry_len}-byte table entries, expected {ENTRY_LEN}")));
        }
        let found = u64_at(&map, 16);
        if found != key {
            return Err(bad(format!(
                "built for key {found:016x}, expected {key:016x} (another dataset, image size, augmentation or decoder)"
            )));
        }
        let want_len = u64_at(&map, FILE_LEN_AT);
        if want_len != map.len() as u64 {
            return Err(bad(format!("{} bytes, the header says {want_len} (truncated or partly written)", map.len())));
        }
        let samples = usize::try_from(u64_at(&map, 24)).map_err(|_| bad("sample count overflows".into()))?;
        let table_end = samples
            .checked_mul(ENTRY_LEN)
            .and_then(|t| t.checked_add(HEADER_LEN))
            .filter(|&end| end <= map.len())
            .ok_or_else(|| bad(format!("{} bytes, too short for a table of {samples} samples", map.len())))?;
        let mut head = [0u8; HEADER_LEN];
        head.copy_from_slice(&map[..HEADER_LEN]);
        let want_crc = u32_at(&head, CRC_AT);
        head[CRC_AT..CRC_AT + 4].fill(0);
        let crc = checksum(&head, &map[HEADER_LEN..table_end]);
        if crc != want_crc {
            return Err(bad(format!("header and table checksum {crc:08x}, the file says {want_crc:08x} (damaged)")));
        }
        let (mut images, mut bytes) = (0u64, 0u64);
        for (i, chunk) in map[HEADER_LEN..table_end].chunks_exact(ENTRY_LEN).enumerate() {
            let e = Entry::from_bytes(chunk);
            if e.offset == ABSENT {
                continue;
            }
            check_entry(&e, table_end as u64, map.len() as u64).map_err(|r| bad(format!("sample {i}: {r}")))?;
            images += 1;
            bytes += e.len;
        }
        let (want_images, want_bytes) = (u64_at(&map, 32), u64_at(&map, 40));
        if (images, bytes) != (want_images, want_bytes) {
            return Err(bad(format!(
                "table holds {images} images of {bytes} bytes, header says {want_images} of {want_bytes}"
            )));
        }
        let (images, bytes) = (images as usize, bytes as usize);
        // No read-around on a page fault: the kernel would read up to the device's read-ahead window (often
        // megabytes) around each faulted page, most of it rows of other images a random draw does not use; once the
        // file no longer fits in the page cache that multiplies the bytes read per sample several times. The rows a
        // sample uses are asked for ahead instead ([`NodeCache::prefetch`]). Advice only: an error changes nothing.
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        Ok(Self {
            path: path.to_path_buf(),
            map: Arc::new(map),
            prefetched: AtomicU64::new(0),
            key,
            samples,
            images,
            bytes,
        })
    }

    /// The key of a node cache for `index` decoded to `imgsz` with Ultralytics' interpolation for training
    /// (`augment`) or validation by the decoder named `decoder_name`: an FNV-1a hash of every sample's image path,
    /// size and modification time (when readable), and the settings. It is stable across builds and processes
    /// (unlike std's `DefaultHasher`), so every rank of a machine computes the same key.
    pub fn key_of(index: &SampleIndex, imgsz: u32, augment: bool, decoder_name: &str) -> u64 {
        let mut h = Fnv::new();
        h.bytes(&MAGIC);
        h.u64(u64::from(VERSION));
        h.u64(index.len() as u64);
        for sample in &index.samples {
            let path = sample.image.as_os_str().as_encoded_bytes();
            h.u64(path.len() as u64);
            h.bytes(path);
            match std::fs::metadata(&sample.image) {
                Ok(m) => {
                    h.u64(m.len());
                    let mtime = m.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok());
                    h.u64(mtime.map_or(u64::MAX, |d| d.as_nanos() as u64));
                }
                // A packed source may have no image files beside it: the path still names the sample.
                Err(_) => {
                    h.u64(u64::MAX);
                    h.u64(u64::MAX);
                }
            }
        }
        h.u64(u64::from(imgsz));
        h.u64(u64::from(augment));
        h.u64(decoder_name.len() as u64);
        h.bytes(decoder_name.as_bytes());
        h.0
    }

    /// Where the node cache with `key` lives: in `dir` when given, else in `/dev/shm` when it is a folder (shared
    /// memory: the file is its own page cache, nothing goes to disk), else in the system's temporary folder.
    pub fn default_path(dir: Option<&Path>, key: u64) -> PathBuf {
        let dir = match dir {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ if Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            _ => std::env::temp_dir(),
        };
        dir.join(format!("sluice-node-cache-{key:016x}.bin"))
    }

    /// The sample `id`'s image, or `None` when the cache does not hold it (outside the budget, failed to decode,
    /// or not in the index).
    pub fn get(&self, id: SampleId) -> Option<CachedImage<'_>> {
        let e = self.entry(id)?;
        // `open` checked that every present entry lies inside the map.
        let (start, len) = (e.offset as usize, e.len as usize);
        Some(CachedImage {
            pixels: &self.map[start..start + len],
            width: e.width,
            height: e.height,
            stride: e.stride as usize,
            orig_width: e.orig_width,
            orig_height: e.orig_height,
        })
    }

    /// The sample `id`'s image as an [`ImageRgb8`] that reads the mapped bytes in place (no copy; the image keeps
    /// the map alive), with the original width and height the labels refer to; `None` as for [`NodeCache::get`].
    pub fn image(&self, id: SampleId) -> Option<Result<(ImageRgb8, u32, u32)>> {
        let e = self.entry(id)?;
        let (start, len) = (e.offset as usize, e.len as usize);
        let shared: SharedBytes = Arc::clone(&self.map) as SharedBytes;
        let image = ImageRgb8::from_shared(e.width, e.height, e.stride as usize, shared, start..start + len);
        Some(image.map(|i| (i, e.orig_width, e.orig_height)).map_err(|e| Error::Invalid {
            what: "node cache",
            reason: format!("{}: sample {id}: {e}", self.path.display()),
        }))
    }

    /// Asks the kernel to start reading rows `rows` of sample `id` into the page cache (`madvise(MADV_WILLNEED)`,
    /// which returns without waiting), so that the augmentation finds them there. Rows past the image and samples
    /// the cache does not hold are ignored; a no-op where the platform has no such advice.
    pub fn prefetch(&self, id: SampleId, rows: Range<u32>) {
        let Some((start, len)) = self.rows_span(id, rows) else { return };
        self.prefetched.fetch_add(len as u64, Ordering::Relaxed);
        #[cfg(unix)]
        let _ = self.map.advise_range(memmap2::Advice::WillNeed, start, len);
        #[cfg(not(unix))]
        let _ = (start, len);
    }

    /// Where in the map rows `rows` of sample `id` lie, as (offset, length); `None` for an absent sample or no rows.
    fn rows_span(&self, id: SampleId, rows: Range<u32>) -> Option<(usize, usize)> {
        let e = self.entry(id)?;
        let end = rows.end.min(e.height);
        if rows.start >= end {
            return None;
        }
        // `open` checked that the entry's bytes lie inside the map; the rows lie inside the entry's bytes.
        let start = e.stride as usize * rows.start as usize;
        let len = (e.stride as usize * end as usize).min(e.len as usize).saturating_sub(start);
        Some((e.offset as usize + start, len))
    }

    /// Reads one byte of every page that holds rows `rows` of sample `id`: returns once they are in memory and
    /// mapped into this process (after [`NodeCache::prefetch`], mostly a wait for reads already under way). Rows
    /// past the image and samples the cache does not hold are ignored.
    pub fn fault_in(&self, id: SampleId, rows: Range<u32>) {
        let Some((start, len)) = self.rows_span(id, rows) else { return };
        let bytes = &self.map[start..start + len];
        for page in bytes.iter().step_by(PAGE) {
            std::hint::black_box(*page);
        }
        if let Some(last) = bytes.last() {
            std::hint::black_box(*last);
        }
    }

    /// Bytes asked to be read ahead so far by [`NodeCache::prefetch`] (pages already in memory included).
    pub fn prefetched_bytes(&self) -> u64 {
        self.prefetched.load(Ordering::Relaxed)
    }

    /// The table entry of a present sample `id`.
    fn entry(&self, id: SampleId) -> Option<Entry> {
        let i = usize::try_from(id).ok().filter(|&i| i < self.samples)?;
        let at = HEADER_LEN + i * ENTRY_LEN;
        let e = Entry::from_bytes(&self.map[at..at + ENTRY_LEN]);
        (e.offset != ABSENT).then_some(e)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key the file was built for.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Samples in the index the file was built for.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Images held.
    pub fn images(&self) -> usize {
        self.images
    }

    /// Pixel bytes held (what the budget counts).
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether no image is held.
    pub fn is_empty(&self) -> bool {
        self.images == 0
    }

    /// The file's size: the pixels plus the header and table.
    pub fn file_len(&self) -> usize {
        self.map.len()
    }
}

/// How long a temporary file of a build may go unmodified before another build of the same cache takes it for the
/// leftover of a killed build. A live build writes continuously, so its file is never this old.
const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files of killed builds of the cache `name` in `dir` (`.NAME.*.tmp`, unmodified for
/// [`STALE_TEMP`]), so they do not fill the disk. Best effort: a file that cannot be removed only costs space.
fn remove_stale_temps(dir: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let file = file.to_string_lossy();
        if !(file.starts_with(&prefix) && file.ends_with(".tmp")) {
            continue;
        }
        let age = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a >= STALE_TEMP) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// CRC-32 of a header (with its checksum field zero) and a table.
fn checksum(head: &[u8], table: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    h.update(table);
    h.finalize()
}

/// The pixel bytes `source`'s images take at the training size, estimated from the sizes the index records (a
/// sample whose size is unknown counts as a full `imgsz` square; a source of unknown size counts nothing).
fn estimated_pixel_bytes(source: &DecodedSource) -> u64 {
    let Some(imgsz) = source.target_size() else { return 0 };
    let imgsz = u64::from(imgsz);
    source
        .index()
        .samples
        .iter()
        .map(|s| {
            let (w, h) = (u64::from(s.labels.width), u64::from(s.labels.height));
            if w == 0 || h == 0 {
                return imgsz * imgsz * 3;
            }
            let long = w.max(h);
            let (nw, nh) = ((w * imgsz).div_ceil(long).clamp(1, imgsz), (h * imgsz).div_ceil(long).clamp(1, imgsz));
            nw * nh * 3
        })
        .sum()
}

/// Why a present entry cannot be served, if it cannot.
fn check_entry(e: &Entry, data_start: u64, file_len: u64) -> std::result::Result<(), String> {
    let end = e.offset.checked_add(e.len).ok_or("offset + length overflows")?;
    if e.offset < data_start || end > file_len {
        return Err(format!("bytes {}..{end} outside the pixel data {data_start}..{file_len}", e.offset));
    }
    let row = u64::from(e.width) * 3;
    if e.stride < row {
        return Err(format!("stride {} < 3 * width {}", e.stride, e.width));
    }
    let need = match e.height {
        0 => Some(0),
        h => e.stride.checked_mul(u64::from(h) - 1).and_then(|n| n.checked_add(row)),
    }
    .ok_or("stride * height overflows")?;
    if e.len < need {
        return Err(format!("{} bytes < {need} for {}x{} stride {}", e.len, e.width, e.height, e.stride));
    }
    Ok(())
}

/// Writes placeholders for the header and table, then the pixels of the samples that fit the budget; returns the
/// table to write over the placeholders.
fn write_body<W: Write>(
    out: &mut W,
    source: &DecodedSource,
    budget: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> std::io::Result<Vec<Entry>> {
    let samples = source.index().len();
    let mut table = vec![Entry::ABSENT; samples];
    out.write_all(&[0u8; HEADER_LEN])?;
    for e in &table {
        out.write_all(&e.to_bytes())?;
    }
    let mut offset = (HEADER_LEN + samples * ENTRY_LEN) as u64;
    let mut used = 0usize;
    // Decode a few images per thread at a time, then write them in order: the images in flight stay bounded while
    // every core decodes.
    let chunk = rayon::current_num_threads().max(1) * 2;
    let ids: Vec<SampleId> = (0..samples as SampleId).collect();
    for (n, ids) in ids.chunks(chunk).enumerate() {
        progress(n * chunk, samples);
        let decoded: Vec<_> = ids.par_iter().map(|&id| source.decode(id)).collect();
        for (&id, result) in ids.iter().zip(decoded) {
            // A sample that fails stays absent: the source decodes it again on use and reports the error then,
            // naming the file, exactly as without a node cache.
            let Ok((image, w0, h0)) = result else { continue };
            let size = image.byte_size();
            if size > budget - used {
                return Ok(table);
            }
            out.write_all(image.as_bytes())?;
            table[id as usize] = Entry {
                offset,
                len: size as u64,
                stride: image.stride() as u64,
                width: image.width(),
                height: image.height(),
                orig_width: w0,
                orig_height: h0,
            };
            offset += size as u64;
            used += size;
        }
    }
    progress(samples, samples);
    Ok(table)
}

/// 64-bit FNV-1a: tiny, and the same in every build and process.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_matches_reference_vectors() {
        let mut h = Fnv::new();
        h.bytes(b"");
        assert_eq!(h.0, 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv::new();
        h.bytes(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv::new();
        h.bytes(b"foobar");
        assert_eq!(h.0, 0x8594_4171_f739_67e8);
    }

    #[test]
    fn entries_round_trip() {
        let e = Entry { offset: 1 << 40, len: 12, stride: 9, width: 3, height: 1, orig_width: 640, orig_height: 1 };
        assert_eq!(Entry::from_bytes(&e.to_bytes()), e);
        assert_eq!(Entry::from_bytes(&Entry::ABSENT.to_bytes()), Entry::ABSENT);
    }

    #[test]
    fn entries_outside_the_file_or_short_of_their_rows_are_rejected() {
        let ok = Entry { offset: 100, len: 24, stride: 12, width: 4, height: 2, orig_width: 8, orig_height: 4 };
        assert!(check_entry(&ok, 100, 124).is_ok());
        assert!(check_entry(&ok, 100, 123).is_err());
        assert!(check_entry(&ok, 101, 200).is_err());
        assert!(check_entry(&Entry { stride: 11, ..ok }, 100, 200).is_err());
        assert!(check_entry(&Entry { len: 23, ..ok }, 100, 200).is_err());
        assert!(check_entry(&Entry { offset: u64::MAX - 1, ..ok }, 100, u64::MAX).is_err());
        assert!(check_entry(&Entry { stride: u64::MAX / 2, ..ok }, 100, u64::MAX).is_err());
    }

    #[test]
    fn default_path_names_the_key() {
        let p = NodeCache::default_path(None, 0xab);
        assert_eq!(p.file_name().and_then(|n| n.to_str()), Some("sluice-node-cache-00000000000000ab.bin"));
        assert_eq!(NodeCache::default_path(Some(Path::new("/c")), 1).parent(), Some(Path::new("/c")));
    }
}
