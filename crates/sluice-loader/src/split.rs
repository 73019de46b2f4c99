//! One split of a dataset, indexed the way the trainer indexes it ([`load_split`]), packed into one shard
//! ([`pack_index`], `sluice pack`), and read back from one: a `data.yaml` whose split is a single `.sluice` file
//! is indexed from the shard's records alone ([`index_shard`]: names, label bytes, image headers), so a packed
//! dataset needs no image or label files beside it.

use std::path::{Path, PathBuf};

use std::io::Cursor;

use sluice_dataset::cache::CacheStatus;
use sluice_dataset::header::read_header_from;
use sluice_dataset::{DataConfig, DatasetError, IndexOptions, IndexResult, Sample, SampleIndex, Severity, Split};
use sluice_storage::{PackSummary, PackedReader, StorageError, decode_labels, encode_labels, pack_files};

use crate::SkipReport;
use crate::source::SourceKind;

/// The extension of a shard written by `sluice pack`.
pub const SHARD_EXTENSION: &str = "sluice";

/// What can go wrong in the dataset tools.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The dataset YAML or its labels could not be read.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A shard could not be written or read.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The loader failed (the message names the sample).
    #[error(transparent)]
    Loader(#[from] sluice_core::Error),
    /// A shard's record does not hold a readable image.
    #[error("{}: record {record} ({name}): {reason}", shard.display())]
    BadRecord {
        /// The shard.
        shard: PathBuf,
        /// The record number.
        record: usize,
        /// The record's name (the packed image's path).
        name: String,
        /// Why.
        reason: String,
    },
    /// A split named by URL could not be read (the message names the object and why).
    #[error("{}: the {split} split: {reason}", data.display())]
    Remote {
        /// The dataset YAML.
        data: PathBuf,
        /// The split.
        split: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// The split has no usable image.
    #[error("{}: the {split} split has no usable images (see `sluice data check`)", data.display())]
    EmptySplit {
        /// The dataset YAML.
        data: PathBuf,
        /// The split.
        split: &'static str,
    },
}

/// This module's result type.
pub type Result<T> = std::result::Result<T, DataError>;

/// A split of a dataset, indexed as the trainer indexes it (label cache read and written, no orphan search).
#[derive(Debug, Clone)]
pub struct LoadedSplit {
    /// The dataset description (class names, paths).
    pub config: DataConfig,
    /// The index and the problems found.
    pub indexed: IndexResult,
    /// Where the images' bytes are: the files, or the shard the split names.
    pub source: SourceKind,
    /// The local copy of the split's shard when the data YAML names it by URL.
    pub staged: Option<StagedCopy>,
}

/// A split's shard copied from object storage.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedCopy {
    /// The object's URL.
    pub url: String,
    /// The local copy.
    pub path: PathBuf,
    /// The object's size in bytes.
    pub bytes: u64,
    /// Bytes read from the store by this load (0 when an earlier copy was reused).
    pub fetched: u64,
    /// Seconds the copy took (the metadata request alone when reused).
    pub seconds: f64,
}

impl StagedCopy {
    /// One line for the console: what was fetched, how fast, or that the copy was reused.
    pub fn line(&self) -> String {
        if self.fetched == 0 {
            format!("{}: the local copy {} is current, nothing fetched", self.url, self.path.display())
        } else {
            format!(
                "{}: fetched {:.1} MB in {:.1} s ({:.0} MB/s) into {}",
                self.url,
                self.fetched as f64 / 1e6,
                self.seconds,
                self.fetched as f64 / 1e6 / self.seconds.max(1e-9),
                self.path.display()
            )
        }
    }
}

impl LoadedSplit {
    /// The usable samples.
    pub fn index(&self) -> &SampleIndex {
        &self.indexed.index
    }

    /// The images indexing left out of the split (an unreadable or corrupt image, an invalid label file: the
    /// problems of severity `Skipped`), one per file, with their messages.
    pub fn left_out(&self) -> SkipReport {
        let mut files: Vec<&Path> = Vec::new();
        let mut first = Vec::new();
        for p in self.indexed.problems.iter().filter(|p| p.kind.severity() == Severity::Skipped) {
            if !files.contains(&p.file.as_path()) {
                files.push(&p.file);
                first.push(p.to_string());
            }
        }
        SkipReport { skipped: files.len() as u64, first }
    }
}

/// How splits named by URL are reached: where their local copies go and the object store client's settings.
#[derive(Debug, Clone, Default)]
pub struct RemoteConfig {
    /// The folder of the local copies; `None`: `.sluice-remote` beside the dataset YAML.
    pub cache_dir: Option<PathBuf>,
    /// The client's settings, `(key, value)` (see `sluice_storage::remote::RemoteOptions::settings`).
    pub settings: Vec<(String, String)>,
}

/// Loads `data` and indexes `split`; with `require_images`, an empty split is an error naming the file. A split
/// named by URL is read with the client's default settings (see [`load_split_with`]).
pub fn load_split(data: &Path, split: Split, opts: &IndexOptions, require_images: bool) -> Result<LoadedSplit> {
    load_split_with(data, split, opts, require_images, &RemoteConfig::default())
}

/// [`load_split`], with a split named by URL (`s3://bucket/coco/train.sluice`: one shard written by `sluice pack`)
/// first copied to local disk as `remote` says (once per node; later runs reuse the copy while the object is
/// unchanged), then read as a local shard.
pub fn load_split_with(
    data: &Path,
    split: Split,
    opts: &IndexOptions,
    require_images: bool,
    remote: &RemoteConfig,
) -> Result<LoadedSplit> {
    load_split_observed(data, split, opts, require_images, remote, &mut |_, _, _| {})
}

/// [`load_split_with`], calling `progress(url, bytes_done, bytes_total)` as a copy from object storage arrives
/// (not at all when the split is local or its copy is current).
pub fn load_split_observed(
    data: &Path,
    split: Split,
    opts: &IndexOptions,
    require_images: bool,
    remote: &RemoteConfig,
    progress: &mut dyn FnMut(&str, u64, u64),
) -> Result<LoadedSplit> {
    let mut config = DataConfig::load(data)?;
    let staged = stage_remote(&mut config, split, remote, progress)?;
    let (indexed, source) = match shard_of(&config, split) {
        Some(shard) => (index_shard(&shard, &config.names)?, SourceKind::Packed(shard)),
        None => (config.index(split, opts)?, SourceKind::Files),
    };
    if require_images && indexed.index.is_empty() {
        return Err(DataError::EmptySplit { data: data.to_path_buf(), split: split.as_str() });
    }
    Ok(LoadedSplit { config, indexed, source, staged })
}

/// Replaces a URL source of `split` by its local copy.
fn stage_remote(
    config: &mut DataConfig,
    split: Split,
    remote: &RemoteConfig,
    progress: &mut dyn FnMut(&str, u64, u64),
) -> Result<Option<StagedCopy>> {
    let sources = match split {
        Split::Train => &mut config.train,
        Split::Val => &mut config.val,
        Split::Test => &mut config.test,
    };
    let urls: Vec<String> =
        sources.iter().map(|p| p.to_string_lossy().into_owned()).filter(|s| sluice_dataset::is_url(s)).collect();
    let Some(url) = urls.first() else { return Ok(None) };
    let bad = |reason: String| DataError::Remote { data: config.yaml.clone(), split: split.as_str(), reason };
    if sources.len() != 1 || !url.ends_with(&format!(".{SHARD_EXTENSION}")) {
        return Err(bad(format!(
            "{url}: a split in object storage is one shard written by `sluice pack` (a `.{SHARD_EXTENSION}` object), \
             alone in its split"
        )));
    }
    let dir = remote.cache_dir.clone().unwrap_or_else(|| {
        config.yaml.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).join(".sluice-remote")
    });
    let copy = stage(url, &dir, remote, &mut |done, total| progress(url, done, total)).map_err(bad)?;
    *sources = vec![copy.path.clone()];
    Ok(Some(copy))
}

#[cfg(feature = "object-store")]
fn stage(
    url: &str,
    dir: &Path,
    remote: &RemoteConfig,
    progress: &mut dyn FnMut(u64, u64),
) -> std::result::Result<StagedCopy, String> {
    use sluice_storage::remote::{RemoteOptions, stage_shard};
    let opts = RemoteOptions { settings: remote.settings.clone(), ..RemoteOptions::default() };
    let t0 = std::time::Instant::now();
    let s = stage_shard(url, dir, &opts, progress).map_err(|e| e.to_string())?;
    let seconds = t0.elapsed().as_secs_f64();
    Ok(StagedCopy { url: url.to_string(), path: s.path, bytes: s.bytes, fetched: s.fetched, seconds })
}

#[cfg(not(feature = "object-store"))]
fn stage(
    url: &str,
    _dir: &Path,
    _remote: &RemoteConfig,
    _progress: &mut dyn FnMut(u64, u64),
) -> std::result::Result<StagedCopy, String> {
    Err(format!("{url}: this build of Sluice reads no object storage; build it with the `object-store` feature"))
}

/// The shard `split` names, when its only source is a `.sluice` file.
pub fn shard_of(config: &DataConfig, split: Split) -> Option<PathBuf> {
    match config.sources(split) {
        [one] if one.extension().is_some_and(|e| e == SHARD_EXTENSION) => Some(one.clone()),
        _ => None,
    }
}

/// Indexes a shard written by [`pack_index`]: sample `i` is record `i`, named by the image path it was packed
/// from, with the labels stored beside it and the format read from the image's own header. A record whose labels
/// or image header cannot be read is an error naming the shard and the record (a shard is checksummed as a
/// whole, so a bad record means a damaged or foreign file, not a bad sample to skip).
pub fn index_shard(shard: &Path, names: &[String]) -> Result<IndexResult> {
    let reader = PackedReader::open(shard)?;
    let mut samples = Vec::with_capacity(reader.records());
    for id in 0..reader.records() {
        let name = reader.name(id as u64)?.to_string();
        let labels = decode_labels(id as u64, reader.labels(id as u64)?)?;
        let bad = |reason: String| DataError::BadRecord {
            shard: shard.to_path_buf(),
            record: id,
            name: name.clone(),
            reason,
        };
        if let Some(l) = labels.objects.iter().find(|l| l.class as usize >= names.len()) {
            return Err(bad(format!("class {} but the dataset has {} classes", l.class, names.len())));
        }
        let header = read_header_from(Cursor::new(reader.image(id as u64)?), Path::new(&name))
            .map_err(|e| bad(e.to_string()))?;
        let crowd = vec![false; labels.objects.len()];
        samples.push(Sample {
            image: PathBuf::from(&name),
            format: header.format,
            label_file: None,
            labels,
            crowd,
            image_id: None,
        });
    }
    let found = samples.len();
    let index = SampleIndex { names: names.to_vec(), samples, category_ids: None };
    Ok(IndexResult { index, found, problems: Vec::new(), cache: CacheStatus::default() })
}

/// Packs every sample of `index` (its image file and its labels in the binary encoding) into the shard `out`,
/// atomically; record `i` is sample `i`.
pub fn pack_index(index: &SampleIndex, out: &Path) -> std::result::Result<PackSummary, StorageError> {
    let items = index.samples.iter().map(|s| {
        let mut labels = Vec::new();
        encode_labels(&s.labels, &mut labels);
        (s.image.clone(), labels)
    });
    pack_files(items, out)
}

/// The split read from a shard: itself when it already is; otherwise its samples packed into a shard beside its
/// label cache (`labels/train2017.sluice` for `labels/train2017.cache`), reused on later runs while its records
/// are the split's images, in the same order and with the same labels, and repacked when not. An image file
/// rewritten in place under the same name is not noticed: delete the shard after editing images.
pub fn packed(split: LoadedSplit) -> Result<LoadedSplit> {
    if matches!(split.source, SourceKind::Packed(_)) {
        return Ok(split);
    }
    let samples = &split.index().samples;
    let images: Vec<PathBuf> = samples.iter().map(|s| s.image.clone()).collect();
    let Some(shard) = sluice_dataset::index::cache_path_for(&images).map(|c| c.with_extension(SHARD_EXTENSION)) else {
        // An empty split: nothing to pack.
        return Ok(split);
    };
    let fresh = PackedReader::open(&shard).is_ok_and(|r| {
        r.records() == samples.len()
            && samples.iter().enumerate().all(|(i, s)| {
                let id = i as u64;
                r.name(id).is_ok_and(|n| Path::new(n) == s.image.as_path())
                    && r.labels(id).ok().and_then(|b| decode_labels(id, b).ok()).is_some_and(|l| l == s.labels)
            })
    });
    if !fresh {
        pack_index(split.index(), &shard)?;
    }
    Ok(LoadedSplit { source: SourceKind::Packed(shard), ..split })
}
