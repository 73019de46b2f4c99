//! The decoded-image source shared by every loader worker: read → decode to the training size → labels scaled
//! into the decoded frame, with a RAM cache under a byte budget (Ultralytics' `cache=ram`, one copy for all
//! workers). A budget of 0 disables caching (`cache=none`). The bytes come from the reader the user chose
//! ([`SourceKind`]): the image files one by one, or the records of a packed shard (slices of its mmap).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use serde::Serialize;
use sluice_core::stage::SourceImage;
use sluice_core::{DecodeHint, Decoder, Error, ImageLabels, ImageRgb8, ImageSource, Label, Reader, Result, SampleId};
use sluice_dataset::SampleIndex;
use sluice_decode::{Backend, TargetDecoder, TargetOptions};
use std::path::PathBuf;

use sluice_storage::{FileReader, PackedReader};

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

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SourceStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that read and decoded.
    pub misses: u64,
    /// Images held in the cache.
    pub cached_images: usize,
    /// Bytes held in the cache.
    pub cached_bytes: usize,
    /// The cache's byte budget.
    pub budget_bytes: usize,
    /// Seconds spent reading, summed over threads.
    pub read_s: f64,
    /// Seconds spent decoding and resizing, summed over threads.
    pub decode_s: f64,
}

/// Decoded images at the training size, cached under a byte budget.
pub struct DecodedSource {
    index: Arc<SampleIndex>,
    reader: Arc<dyn Reader>,
    decoder: Arc<dyn Decoder>,
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
        let decoder: Arc<dyn Decoder> =
            Arc::new(TargetDecoder::new(inner, TargetOptions { imgsz, augment, dct_scaling: true }));
        Ok(Self::new(Arc::new(index), reader, decoder, budget_bytes))
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
            read_s: self.read_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            decode_s: self.decode_ns.load(Ordering::Relaxed) as f64 * 1e-9,
        }
    }

    fn load(&self, id: SampleId) -> Result<SourceImage> {
        let sample = self.index.samples.get(id as usize).ok_or_else(|| Error::Invalid {
            what: "sample id",
            reason: format!("{id} is not in the index ({} samples)", self.index.len()),
        })?;
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
        let (w0, h0) = (info.orig_width.max(1), info.orig_height.max(1));
        let (sx, sy) = (image.width() as f32 / w0 as f32, image.height() as f32 / h0 as f32);
        let labels = ImageLabels {
            width: image.width(),
            height: image.height(),
            objects: sample
                .labels
                .objects
                .iter()
                .map(|l| Label { class: l.class, bbox: l.bbox.scale_shift(sx, sy, 0.0, 0.0) })
                .collect(),
        };
        Ok(SourceImage { image, labels })
    }
}

impl ImageSource for DecodedSource {
    fn get(&self, id: SampleId) -> Result<Arc<SourceImage>> {
        if let Some(hit) = self.map.read().unwrap_or_else(PoisonError::into_inner).get(&id) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(hit));
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
