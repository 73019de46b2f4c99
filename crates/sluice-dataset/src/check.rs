//! `sluice data check`: a dataset's split summarised — images, labelled and background images, boxes,
//! per-class counts, and problems grouped by kind with the first few files of each.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::cache::CacheStatus;
use crate::config::{DataConfig, Split};
use crate::error::Result;
use crate::index::{IndexOptions, IndexResult};
use crate::problem::{Problem, Severity};

/// How many files each problem kind lists.
pub const FIRST_FILES: usize = 5;

/// Boxes and images of one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassCount {
    /// Class id.
    pub class: u32,
    /// Class name.
    pub name: String,
    /// Boxes of this class.
    pub boxes: usize,
    /// Images holding at least one box of this class.
    pub images: usize,
}

/// One kind of problem: how many, what it did, and the first files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProblemGroup {
    /// Occurrences.
    pub count: usize,
    /// What happened to the data.
    pub severity: Severity,
    /// The first [`FIRST_FILES`] occurrences: `file[:line]: message`.
    pub first: Vec<String>,
}

/// The summary of one split.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// The dataset YAML.
    pub data: String,
    /// The split checked.
    pub split: String,
    /// Image files listed for the split.
    pub found: usize,
    /// Usable images (labelled + background).
    pub images: usize,
    /// Usable images with at least one box.
    pub labelled_images: usize,
    /// Usable images without boxes.
    pub background_images: usize,
    /// Images skipped as corrupt or unsupported.
    pub skipped_images: usize,
    /// Boxes in usable images.
    pub boxes: usize,
    /// Per class (every class of the dataset, in class order).
    pub per_class: Vec<ClassCount>,
    /// Problems by kind (`corrupt_image`, `missing_label`, …).
    pub problems: BTreeMap<&'static str, ProblemGroup>,
    /// What the label cache did.
    pub cache: CacheStatus,
}

impl CheckReport {
    /// Summarises an index build.
    pub fn from_index(data: &Path, split: Split, r: &IndexResult) -> Self {
        let nc = r.index.names.len();
        let mut per_class: Vec<ClassCount> = r
            .index
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| ClassCount { class: i as u32, name: n.clone(), boxes: 0, images: 0 })
            .collect();
        let mut labelled = 0;
        for s in &r.index.samples {
            if !s.labels.objects.is_empty() {
                labelled += 1;
            }
            let mut seen = vec![false; nc];
            for o in &s.labels.objects {
                if let Some(c) = per_class.get_mut(o.class as usize) {
                    c.boxes += 1;
                    if !seen[o.class as usize] {
                        seen[o.class as usize] = true;
                        c.images += 1;
                    }
                }
            }
        }
        let mut problems: BTreeMap<&'static str, ProblemGroup> = BTreeMap::new();
        for p in &r.problems {
            let g = problems.entry(p.kind.as_str()).or_insert_with(|| ProblemGroup {
                count: 0,
                severity: p.kind.severity(),
                first: Vec::new(),
            });
            g.count += 1;
            if g.first.len() < FIRST_FILES {
                g.first.push(p.to_string());
            }
        }
        let images = r.index.len();
        Self {
            data: data.display().to_string(),
            split: split.as_str().to_string(),
            found: r.found,
            images,
            labelled_images: labelled,
            background_images: images - labelled,
            skipped_images: r.found - images,
            boxes: r.index.boxes(),
            per_class,
            problems,
            cache: r.cache.clone(),
        }
    }

    /// A human-readable multi-line summary.
    pub fn to_text(&self) -> String {
        let mut s = format!(
            "{} [{}]: {} images ({} labelled, {} background), {} boxes, {} skipped of {} found\n",
            self.data,
            self.split,
            self.images,
            self.labelled_images,
            self.background_images,
            self.boxes,
            self.skipped_images,
            self.found
        );
        s.push_str("per class (boxes / images):\n");
        for c in self.per_class.iter().filter(|c| c.boxes > 0) {
            s.push_str(&format!("  {:>3} {:<20} {:>6} / {}\n", c.class, c.name, c.boxes, c.images));
        }
        let empty = self.per_class.iter().filter(|c| c.boxes == 0).count();
        if empty > 0 {
            s.push_str(&format!("  ({empty} classes without boxes)\n"));
        }
        if self.problems.is_empty() {
            s.push_str("no problems\n");
        }
        for (kind, g) in &self.problems {
            s.push_str(&format!("{kind}: {} ({:?})\n", g.count, g.severity));
            for f in &g.first {
                s.push_str(&format!("  {f}\n"));
            }
            if g.count > g.first.len() {
                s.push_str(&format!("  … and {} more\n", g.count - g.first.len()));
            }
        }
        let c = &self.cache;
        if let Some(p) = &c.path {
            s.push_str(&format!("cache {}: {} reused, {} scanned", p.display(), c.reused, c.scanned));
            if c.saved {
                s.push_str(", saved");
            }
            if let Some(w) = &c.warning {
                s.push_str(&format!(" ({w})"));
            }
            s.push('\n');
        }
        s
    }
}

/// Indexes `split` of the dataset YAML `data` and summarises it.
pub fn check(data: &Path, split: Split, opts: &IndexOptions) -> Result<(CheckReport, IndexResult)> {
    let cfg = DataConfig::load(data)?;
    let r = cfg.index(split, opts)?;
    Ok((CheckReport::from_index(data, split, &r), r))
}

/// The problems that made images unusable.
pub fn skipped(problems: &[Problem]) -> impl Iterator<Item = &Problem> {
    problems.iter().filter(|p| p.kind.severity() == Severity::Skipped)
}
