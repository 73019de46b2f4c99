//! The sample index: every usable image of a split with its size and pixel-`xyxy` labels, built by scanning
//! image headers and label files in parallel (Ultralytics' `cache_labels` / `verify_image_label`), reusing the
//! label cache's entries whose files did not change.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sluice_core::{ImageLabels, SampleId};

use crate::cache::{self, CacheStatus, FileStamp, ScanEntry};
use crate::config::{DataConfig, Split, img2label_path};
use crate::error::{DatasetError, Result};
use crate::header::{ImageFormat, read_header};
use crate::labels::{parse_yolo_labels, to_pixel_labels};
use crate::problem::{Problem, ProblemKind};

/// One usable sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The image file.
    pub image: PathBuf,
    /// Its format (from the bytes).
    pub format: ImageFormat,
    /// The label file, `None` when there is none (a background image, or a COCO dataset).
    pub label_file: Option<PathBuf>,
    /// Size after EXIF orientation and the objects in pixel `xyxy`.
    pub labels: ImageLabels,
    /// Per object: COCO `iscrowd` (all false for YOLO labels).
    pub crowd: Vec<bool>,
    /// The COCO image id, when the sample came from COCO JSON.
    pub image_id: Option<u64>,
}

/// The samples of one split, in the order Ultralytics lists them; a sample's [`SampleId`] is its position.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SampleIndex {
    /// Class names, index = class id.
    pub names: Vec<String>,
    /// The samples.
    pub samples: Vec<Sample>,
    /// For an index built from COCO JSON: the COCO category id of each contiguous class.
    pub category_ids: Option<Vec<u64>>,
}

impl SampleIndex {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The sample with id `id`.
    pub fn get(&self, id: SampleId) -> Option<&Sample> {
        usize::try_from(id).ok().and_then(|i| self.samples.get(i))
    }

    /// Total number of boxes.
    pub fn boxes(&self) -> usize {
        self.samples.iter().map(|s| s.labels.objects.len()).sum()
    }

    /// A seed-determined `fraction` of the samples (at least one), in their original order (the trainer's
    /// `val_fraction`).
    pub fn subset(&self, fraction: f64, seed: u64) -> SampleIndex {
        if fraction >= 1.0 || self.samples.is_empty() {
            return self.clone();
        }
        let keep = ((self.len() as f64 * fraction).ceil() as usize).clamp(1, self.len());
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut sluice_core::sample_rng(seed, u64::MAX, 0));
        let mut chosen = order[..keep].to_vec();
        chosen.sort_unstable();
        SampleIndex {
            names: self.names.clone(),
            samples: chosen.into_iter().map(|i| self.samples[i].clone()).collect(),
            category_ids: self.category_ids.clone(),
        }
    }
}

/// How to build an index.
#[derive(Debug, Clone)]
pub struct IndexOptions {
    /// Read and write the label cache (`labels/<split folder>.cache`).
    pub cache: bool,
    /// Look for label files that have no image (reported as [`ProblemKind::OrphanLabel`]).
    pub find_orphans: bool,
}

impl Default for IndexOptions {
    fn default() -> Self {
        Self { cache: true, find_orphans: true }
    }
}

/// An index and what was found while building it.
#[derive(Debug, Clone)]
pub struct IndexResult {
    /// The usable samples.
    pub index: SampleIndex,
    /// Image files listed for the split (usable + skipped).
    pub found: usize,
    /// Every problem, in image order (orphans last).
    pub problems: Vec<Problem>,
    /// What the label cache did.
    pub cache: CacheStatus,
}

/// Scans one image and its label file: header, label rows, validation. Never fails: problems are recorded.
pub fn scan_image(image: &Path, label: &Path, nc: usize) -> ScanEntry {
    let image_stamp = FileStamp::of(image);
    let label_stamp = FileStamp::of(label);
    let mut problems = Vec::new();
    let sample = scan_inner(image, label, label_stamp.is_some(), nc, &mut problems);
    ScanEntry { image: image.to_path_buf(), image_stamp, label_stamp, sample, problems }
}

fn scan_inner(image: &Path, label: &Path, has_label: bool, nc: usize, problems: &mut Vec<Problem>) -> Option<Sample> {
    let header = match read_header(image) {
        Ok(h) => h,
        Err(e) => {
            problems.push(Problem::file(
                ProblemKind::CorruptImage,
                image,
                format!("ignoring corrupt image/label: {e}"),
            ));
            return None;
        }
    };
    if header.missing_eoi {
        problems.push(Problem::file(
            ProblemKind::CorruptJpeg,
            image,
            "corrupt JPEG: no end-of-image marker (Ultralytics re-saves such files)",
        ));
    }
    let mut labels = ImageLabels { width: header.width, height: header.height, objects: Vec::new() };
    let label_file = if has_label {
        let text = match std::fs::read(label) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(_) => {
                    let m = format!("ignoring corrupt image/label: {}: not UTF-8 text", label.display());
                    problems.push(Problem::file(ProblemKind::CorruptLabel, label, m));
                    return None;
                }
            },
            Err(e) => {
                let m = format!("ignoring corrupt image/label: {}", DatasetError::io(label, e));
                problems.push(Problem::file(ProblemKind::CorruptLabel, label, m));
                return None;
            }
        };
        let parsed = match parse_yolo_labels(&text, label, nc) {
            Ok(p) => p,
            Err(e) => {
                let (line, msg) = match &e {
                    DatasetError::Label { line, reason, .. } => (Some(*line), reason.clone()),
                    other => (None, other.to_string()),
                };
                let message = format!("ignoring corrupt image/label: {msg}");
                problems.push(Problem { kind: ProblemKind::CorruptLabel, file: label.to_path_buf(), line, message });
                return None;
            }
        };
        if parsed.rows.is_empty() {
            problems.push(Problem::file(ProblemKind::EmptyLabel, label, "empty label file: background image"));
        }
        if parsed.duplicates > 0 {
            let m = format!("{} duplicate labels removed", parsed.duplicates);
            problems.push(Problem::file(ProblemKind::DuplicateLabels, label, m));
        }
        let (objects, p) = to_pixel_labels(&parsed.rows, header.width, header.height, label);
        problems.extend(p);
        labels.objects = objects;
        Some(label.to_path_buf())
    } else {
        problems.push(Problem::file(ProblemKind::MissingLabel, image, "no label file: background image"));
        None
    };
    let crowd = vec![false; labels.objects.len()];
    Some(Sample { image: image.to_path_buf(), format: header.format, label_file, labels, crowd, image_id: None })
}

/// Label files (`*.txt`) in the folders of `labels` that no image refers to.
pub fn orphan_labels(labels: &[PathBuf]) -> Vec<PathBuf> {
    let used: BTreeSet<&Path> = labels.iter().map(PathBuf::as_path).collect();
    let dirs: BTreeSet<&Path> = labels.iter().filter_map(|l| l.parent()).collect();
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "txt") && !used.contains(p.as_path()) && p.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Builds the index of `images` (label files found by [`img2label_path`]) for `nc` classes, using the cache at
/// `cache_path` when given.
pub fn build_index(
    images: &[PathBuf],
    names: &[String],
    cache_path: Option<&Path>,
    opts: &IndexOptions,
) -> IndexResult {
    let nc = names.len();
    let labels: Vec<PathBuf> = images.iter().map(|i| img2label_path(i)).collect();
    let mut status = CacheStatus { path: cache_path.map(Path::to_path_buf), ..CacheStatus::default() };
    let mut cached: HashMap<PathBuf, ScanEntry> = HashMap::new();
    if let Some(cp) = cache_path {
        match cache::load(cp, nc) {
            Ok(entries) => cached = entries.into_iter().map(|e| (e.image.clone(), e)).collect(),
            Err(reason) => status.rebuilt_reason = Some(reason),
        }
    }
    let scanned: Vec<(ScanEntry, bool)> = images
        .par_iter()
        .zip(labels.par_iter())
        .map(|(img, lbl)| match cached.get(img) {
            Some(e) if e.image_stamp == FileStamp::of(img) && e.label_stamp == FileStamp::of(lbl) => (e.clone(), true),
            _ => (scan_image(img, lbl, nc), false),
        })
        .collect();
    status.reused = scanned.iter().filter(|(_, hit)| *hit).count();
    status.scanned = scanned.len() - status.reused;
    let entries: Vec<ScanEntry> = scanned.into_iter().map(|(e, _)| e).collect();
    if let Some(cp) = cache_path
        && (status.scanned > 0 || cached.len() != entries.len())
    {
        match cache::save(cp, nc, &entries) {
            Ok(()) => status.saved = true,
            Err(e) => status.warning = Some(format!("cache not saved: {e}")),
        }
    }
    let mut problems = Vec::new();
    let mut samples = Vec::with_capacity(entries.len());
    for e in entries {
        problems.extend(e.problems);
        samples.extend(e.sample);
    }
    if opts.find_orphans {
        for o in orphan_labels(&labels) {
            problems.push(Problem::file(ProblemKind::OrphanLabel, o, "label file without an image: ignored"));
        }
    }
    let index = SampleIndex { names: names.to_vec(), samples, category_ids: None };
    IndexResult { index, found: images.len(), problems, cache: status }
}

impl DataConfig {
    /// Builds the index of `split`: lists its images, scans them (or reuses the cache), validates the labels.
    pub fn index(&self, split: Split, opts: &IndexOptions) -> Result<IndexResult> {
        let images = self.image_files(split)?;
        let cache_path = if opts.cache { cache_path_for(&images) } else { None };
        Ok(build_index(&images, &self.names, cache_path.as_deref(), opts))
    }
}

/// Ultralytics' cache location: the first label file's folder with a `.cache` suffix (`labels/train2017.cache`).
pub fn cache_path_for(images: &[PathBuf]) -> Option<PathBuf> {
    let first = img2label_path(images.first()?);
    Some(first.parent()?.with_extension("cache"))
}
