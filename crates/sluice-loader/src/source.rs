//! The decoded-image source shared by every loader worker: read → decode to the training size → labels scaled
//! into the decoded frame, with a RAM cache under a byte budget (Ultralytics' `cache=ram`, one copy for all
//! workers). A budget of 0 disables caching (`cache=none`). The bytes come from the reader the user chose
//! ([`SourceKind`]): the image files one by one, or the records of a packed shard (slices of its mmap). With a
//! [`NodeCache`] attached (the node cache of a data-parallel run, or the `cache: disk` file), the images come first
//! from that mapped file, read in place.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Instant;

use serde::Serialize;
use sluice_core::stage::SourceImage;
use sluice_core::{DecodeHint, Decoder, Error, ImageLabels, ImageRgb8, ImageSource, Label, Reader, Result, SampleId};
use sluice_dataset::{Sample, SampleIndex};
use sluice_decode::{Backend, TargetDecoder, TargetOptions};
use std::path::PathBuf;

use sluice_storage::{FileReader, PackedReader};

use crate::node_cache::NodeCache;

/// Bytes of decoded images kept with `cache: ram` (Ultralytics' `cache=ram`).
pub const RAM_CACHE_BYTES: usize = 8 << 30;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Where a source reads its images' bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SourceKind {
    /// The index's image files, one `read` each.
    #[default]
    Files,
    /// A shard written by `sluice pack` whose record `i` is sample `i` of the index.
    Packed(PathBuf),
}

impl SourceKind {
    /// `files` or `packed`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Files => "files",
            Self::Packed(_) => "packed",
        }
    }

    /// The reader over `index`'s samples (ids = index positions). A shard must hold exactly one record per sample.
    pub fn reader(&self, index: &SampleIndex) -> Result<Arc<dyn Reader>> {
        match self {
            Self::Files => Ok(Arc::new(FileReader::new(index.samples.iter().map(|s| s.image.clone()).collect()))),
            Self::Packed(shard) => {
                let reader = PackedReader::open(shard).map_err(|e| Error::Other(Box::new(e)))?;
                if reader.records() != index.len() {
                    return Err(Error::Invalid {
                        what: "shard",
                        reason: format!(
                            "{}: {} records for {} samples",
                            shard.display(),
                            reader.records(),
                            index.len()
                        ),
                    });
                }
                Ok(Arc::new(reader))
            }
        }
    }
}

/// How [`DecodedSource::open_or_build_disk_cache`] came by its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheFile {
    /// The file held this source's images already.
    Reused,
    /// The file was built now; `replaced` says why the file found under its name could not be used (`None` when
    /// there was none).
    Built {
        /// Why the previous file was rejected.
        replaced: Option<String>,
    },
}

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SourceStats {
    /// Lookups served from the cache or the node cache.
    pub hits: u64,
    /// Lookups that read and decoded.
    pub misses: u64,
    /// Images held in this process's cache.
    pub cached_images: usize,
    /// Bytes held in this process's cache.
    pub cached_bytes: usize,
    /// This process's cache's byte budget (0 with a node cache, whose budget replaces it).
    pub budget_bytes: usize,
    /// Images held in the node cache or the `cache: disk` file (mapped, shared by every rank of the machine:
    /// count them once per machine).
    pub node_cache_images: usize,
    /// Pixel bytes held in the node cache or the `cache: disk` file (count them once per machine).
    pub node_cache_bytes: usize,
    /// Bytes of the node cache or `cache: disk` file asked to be read ahead: the rows each sample's augmentation
    /// reads, requested when its batch is planned.
    pub prefetch_bytes: u64,
    /// Seconds spent reading, summed over threads.
    pub read_s: f64,
    /// Seconds spent decoding and resizing, summed over threads.
    pub decode_s: f64,
}

/// Decoded images at the training size, cached under a byte budget, or served from a [`NodeCache`].
pub struct DecodedSource {
    index: Arc<SampleIndex>,
    reader: Arc<dyn Reader>,
    decoder: Arc<dyn Decoder>,
    /// The training size and augmentation when [`DecodedSource::open`] built the decoder; they are part of the
    /// node cache's key.
    target: Option<TargetOptions>,
    node: Option<NodeCache>,
    node_key: OnceLock<u64>,
    budget: usize,
    used: AtomicUsize,
    map: RwLock<HashMap<SampleId, Arc<SourceImage>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    read_ns: AtomicU64,
    decode_ns: AtomicU64,
}

impl std::fmt::Debug for DecodedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodedSource").field("decoder", &self.decoder.name()).field("stats", &self.stats()).finish()
    }
}

impl DecodedSource {
    /// A source over `index`, reading with `reader` (ids = index positions) and decoding with `decoder`, which
    /// must produce the training size (e.g. `sluice_decode::TargetDecoder`). `budget_bytes` 0 caches nothing.
    pub fn new(
        index: Arc<SampleIndex>,
        reader: Arc<dyn Reader>,
        decoder: Arc<dyn Decoder>,
        budget_bytes: usize,
    ) -> Self {
        Self {
            index,
            reader,
            decoder,
            target: None,
            node: None,
            node_key: OnceLock::new(),
            budget: budget_bytes,
            used: AtomicUsize::new(0),
            map: RwLock::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            read_ns: AtomicU64::new(0),
            decode_ns: AtomicU64::new(0),
        }
    }

    /// The loaders' usual source: `index`'s image files read with a [`FileReader`] and decoded to the training
    /// size `imgsz` by the preferred compiled-in backend, with Ultralytics' interpolation for training (`augment`)
    /// or validation, caching up to `budget_bytes` (0: nothing, [`RAM_CACHE_BYTES`] for `cache=ram`).
    pub fn from_files(index: SampleIndex, imgsz: u32, augment: bool, budget_bytes: usize) -> Result<Self> {
        Self::open(&SourceKind::Files, index, imgsz, augment, budget_bytes)
    }

    /// As [`DecodedSource::from_files`], reading through the reader `kind` names.
    pub fn open(kind: &SourceKind, index: SampleIndex, imgsz: u32, augment: bool, budget_bytes: usize) -> Result<Self> {
        let reader = kind.reader(&index)?;
        let inner = Backend::preferred_decoder()?;
        let opts = TargetOptions { imgsz, augment, dct_scaling: true };
        let decoder: Arc<dyn Decoder> = Arc::new(TargetDecoder::new(inner, opts));
        Ok(Self { target: Some(opts), ..Self::new(Arc::new(index), reader, decoder, budget_bytes) })
    }

    /// The training size when [`DecodedSource::open`] built the decoder (`None` for [`DecodedSource::new`]).
    pub fn target_size(&self) -> Option<u32> {
        self.target.map(|t| t.imgsz)
    }

    /// Whether the decoder resizes with the training interpolation (`None` for [`DecodedSource::new`]).
    pub fn augment(&self) -> Option<bool> {
        self.target.map(|t| t.augment)
    }

    /// The key of this source's node cache ([`NodeCache::key_of`] over the index, the training size, the
    /// augmentation and the decoder's name), computed once. For a source made with [`DecodedSource::new`] the
    /// size and augmentation are unknown and the decoder's name alone must tell its outputs apart.
    pub fn node_cache_key(&self) -> u64 {
        *self.node_key.get_or_init(|| {
            let (imgsz, augment) = self.target.map_or((0, false), |t| (t.imgsz, t.augment));
            NodeCache::key_of(&self.index, imgsz, augment, self.decoder.name())
        })
    }

    /// Decodes this source's samples into a node cache at `path` holding up to `budget_bytes` of pixels (see
    /// [`NodeCache::build`]). One process per machine builds it; the others [`NodeCache::open`] it with
    /// [`DecodedSource::node_cache_key`] once it exists, and every one attaches it with
    /// [`DecodedSource::with_node_cache`].
    pub fn build_node_cache(&self, path: &Path, budget_bytes: usize) -> Result<NodeCache> {
        NodeCache::build(path, self, self.node_cache_key(), budget_bytes)
    }

    /// The `cache: disk` file at `path`: opened when it holds this source's images (same key), else built there
    /// (decoding every sample; `progress(done, total)` follows the build) and opened. A file that fails to open
    /// (another key, truncated, damaged, another format version) is replaced, and the returned [`CacheFile`] says
    /// why. The build writes a temporary file beside `path` and renames it, so a killed build leaves no file under
    /// `path` and the next run builds again.
    pub fn open_or_build_disk_cache(
        &self,
        path: &Path,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(NodeCache, CacheFile)> {
        let key = self.node_cache_key();
        let rebuilt = match NodeCache::open(path, key) {
            Ok(cache) => return Ok((cache, CacheFile::Reused)),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(e.to_string()),
        };
        // A `cache_dir` named for the first time may not exist yet.
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io { path: dir.to_path_buf(), source: e })?;
        }
        let cache = NodeCache::build_with_progress(path, self, key, usize::MAX, progress)?;
        Ok((cache, CacheFile::Built { replaced: rebuilt }))
    }

    /// Serves images from `cache` first. Its budget replaces this source's own: the private cache is turned off
    /// (a second copy of what the node holds once would defeat it), so the images the node cache lacks are read
    /// and decoded on every use, and their errors surface as without it. Fails when `cache` was built for another
    /// key (another dataset, size, augmentation or decoder).
    pub fn with_node_cache(mut self, cache: NodeCache) -> Result<Self> {
        let key = self.node_cache_key();
        if cache.key() != key || cache.samples() != self.index.len() {
            return Err(Error::Invalid {
                what: "node cache",
                reason: format!(
                    "{}: built for key {:016x} over {} samples, this source has key {key:016x} over {} samples",
                    cache.path().display(),
                    cache.key(),
                    cache.samples(),
                    self.index.len()
                ),
            });
        }
        self.budget = 0;
        self.used = AtomicUsize::new(0);
        self.map = RwLock::new(HashMap::new());
        self.node = Some(cache);
        Ok(self)
    }

    /// The node cache attached with [`DecodedSource::with_node_cache`].
    pub fn node_cache(&self) -> Option<&NodeCache> {
        self.node.as_ref()
    }

    /// Starts reading rows `rows` of sample `id` ahead of use where they come from a mapped file (the node
    /// cache); nothing otherwise (a decoded image in memory has nothing to read).
    pub fn prefetch(&self, id: SampleId, rows: std::ops::Range<u32>) {
        if let Some(node) = &self.node {
            node.prefetch(id, rows);
        }
    }

    /// Waits until rows `rows` of sample `id` are in memory and mapped, where they come from a mapped file, by
    /// reading a byte of each page; the time counts as reading ([`SourceStats::read_s`]). Nothing otherwise.
    pub fn fault_in(&self, id: SampleId, rows: std::ops::Range<u32>) {
        if let Some(node) = &self.node {
            let t0 = Instant::now();
            node.fault_in(id, rows);
            self.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// The dataset index.
    pub fn index(&self) -> &SampleIndex {
        &self.index
    }

    /// Counters so far.
    pub fn stats(&self) -> SourceStats {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        SourceStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            cached_images: map.len(),
            cached_bytes: self.used.load(Ordering::Relaxed),
            budget_bytes: self.budget,
            node_cache_images: self.node.as_ref().map_or(0, NodeCache::images),
            node_cache_bytes: self.node.as_ref().map_or(0, NodeCache::len),
            prefetch_bytes: self.node.as_ref().map_or(0, NodeCache::prefetched_bytes),
            read_s: self.read_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            decode_s: self.decode_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    fn sample(&self, id: SampleId) -> Result<&Sample> {
        self.index.samples.get(id as usize).ok_or_else(|| Error::Invalid {
            what: "sample id",
            reason: format!("{id} is not in the index ({} samples)", self.index.len()),
        })
    }

    /// Reads and decodes sample `id` to the training size; also returns the original size the labels refer to.
    pub(crate) fn decode(&self, id: SampleId) -> Result<(ImageRgb8, u32, u32)> {
        let sample = self.sample(id)?;
        let named = |e: Error| Error::Decode { what: sample.image.display().to_string(), reason: e.to_string() };
        let mut image = ImageRgb8::default();
        let info = SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let t0 = Instant::now();
            let bytes = self.reader.read(id, &mut scratch)?;
            let t1 = Instant::now();
            let info = self.decoder.decode(bytes, DecodeHint::default(), &mut image).map_err(named);
            self.read_ns.fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
            self.decode_ns.fetch_add(t1.elapsed().as_nanos() as u64, Ordering::Relaxed);
            info
        })?;
        Ok((image, info.orig_width, info.orig_height))
    }

    fn load(&self, id: SampleId) -> Result<SourceImage> {
        let (image, w0, h0) = self.decode(id)?;
        let labels = scaled_labels(self.sample(id)?, &image, w0, h0);
        Ok(SourceImage { image, labels })
    }

    /// Sample `id` from the node cache, if it holds it: an image that reads the mapped pixels in place and keeps
    /// the map alive however long the augmentation holds it, and the labels scaled exactly as
    /// [`DecodedSource::load`] scales them.
    fn node_image(&self, id: SampleId) -> Result<Option<SourceImage>> {
        let Some(node) = &self.node else { return Ok(None) };
        let Some(hit) = node.image(id) else { return Ok(None) };
        let (image, w0, h0) = hit?;
        let labels = scaled_labels(self.sample(id)?, &image, w0, h0);
        Ok(Some(SourceImage { image, labels }))
    }
}

/// `sample`'s labels moved from its original `w0 x h0` frame into the decoded `image`'s frame.
fn scaled_labels(sample: &Sample, image: &ImageRgb8, w0: u32, h0: u32) -> ImageLabels {
    let (w0, h0) = (w0.max(1), h0.max(1));
    let (sx, sy) = (image.width() as f32 / w0 as f32, image.height() as f32 / h0 as f32);
    ImageLabels {
        width: image.width(),
        height: image.height(),
        objects: sample
            .labels
            .objects
            .iter()
            .map(|l| Label { class: l.class, bbox: l.bbox.scale_shift(sx, sy, 0.0, 0.0) })
            .collect(),
    }
}

impl ImageSource for DecodedSource {
    fn get(&self, id: SampleId) -> Result<Arc<SourceImage>> {
        if let Some(hit) = self.map.read().unwrap_or_else(PoisonError::into_inner).get(&id) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(hit));
        }
        // A node-cache hit is not kept in the private map: that would be a second copy of what the node holds.
        if let Some(image) = self.node_image(id)? {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::new(image));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let loaded = Arc::new(self.load(id)?);
        let size = loaded.image.byte_size();
        let fits = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| (u + size <= self.budget).then_some(u + size))
            .is_ok();
        if fits {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            if map.insert(id, Arc::clone(&loaded)).is_some() {
                // Another worker loaded the same image meanwhile: keep one copy, give the bytes back.
                self.used.fetch_sub(size, Ordering::AcqRel);
            }
        }
        Ok(loaded)
    }
}
