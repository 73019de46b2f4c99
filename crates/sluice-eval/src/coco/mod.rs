//! The COCOeval bbox algorithm of pycocotools 2.0.11, ported operation for operation in float64: IoU thresholds
//! .50:.05:.95, 101 recall points, maxDets 1/10/100, area ranges by the GT `area` field, crowd GTs as ignore
//! regions (IoU = intersection / detection area, matchable many times), stable score sorting, truncation per
//! (image, category), greedy matching, then `accumulate` and the 12 `summarize` stats.
//!
//! The work is split for streaming: [`CocoAccumulator::add_image`] evaluates one image completely (its IoU
//! matrices are dropped before it returns) and keeps only one small record per detection; accumulators built
//! on different threads are merged; [`CocoAccumulator::finalize`] sorts the records (the result does not depend on
//! the order images were added in) and computes precision, recall and the stats. [`evaluate`] drives this for
//! a parsed COCO ground truth and results file, on rayon threads when asked.

mod accumulate;
pub mod json;

use rayon::prelude::*;

pub use accumulate::CocoAccumulator;
pub use json::{CocoCategory, CocoDataset, CocoImage, Detections};

use crate::error::{Error, Result};
use crate::numeric::{linspace, mean};

/// One ground-truth box of an image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GtBox {
    /// Annotation id (pycocotools treats a match to a GT whose id is 0 as no match; so does this port).
    pub id: i64,
    /// COCO category id.
    pub category_id: i64,
    /// `[x, y, w, h]` in pixels.
    pub bbox: [f64; 4],
    /// The `area` field (used for the area ranges; not recomputed from the box).
    pub area: f64,
    /// Crowd region: ignored, matchable by any number of detections, IoU = intersection / detection area.
    pub iscrowd: bool,
}

/// One detection of an image (a COCO results entry).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DtBox {
    /// COCO category id.
    pub category_id: i64,
    /// `[x, y, w, h]` in pixels; its area is `w * h`.
    pub bbox: [f64; 4],
    /// Confidence.
    pub score: f64,
}

/// COCOeval parameters (`Params(iouType='bbox')`).
#[derive(Debug, Clone, PartialEq)]
pub struct CocoParams {
    /// IoU thresholds (at most 16).
    pub iou_thrs: Vec<f64>,
    /// Recall thresholds.
    pub rec_thrs: Vec<f64>,
    /// Detections kept per (image, category), ascending.
    pub max_dets: Vec<usize>,
    /// Area ranges `[lo, hi]`, inclusive.
    pub area_rng: Vec<[f64; 2]>,
    /// Labels of the area ranges (`all`, `small`, `medium`, `large`).
    pub area_rng_lbl: Vec<String>,
}

impl Default for CocoParams {
    fn default() -> Self {
        Self {
            iou_thrs: linspace(0.5, 0.95, 10),
            rec_thrs: linspace(0.0, 1.0, 101),
            max_dets: vec![1, 10, 100],
            area_rng: vec![[0.0, 1e10], [0.0, 1024.0], [1024.0, 9216.0], [9216.0, 1e10]],
            area_rng_lbl: ["all", "small", "medium", "large"].map(String::from).to_vec(),
        }
    }
}

impl CocoParams {
    /// Checks the sizes the evaluator relies on; sorts `max_dets` like `evaluate()` does.
    pub fn validated(mut self) -> Result<Self> {
        let bad = |reason: String| Err(Error::Invalid { what: "COCO parameters", reason });
        if self.iou_thrs.is_empty() || self.iou_thrs.len() > 16 {
            return bad(format!("{} IoU thresholds (1 to 16 supported)", self.iou_thrs.len()));
        }
        if self.max_dets.is_empty() || self.area_rng.is_empty() || self.area_rng.len() != self.area_rng_lbl.len() {
            return bad("need at least one maxDets and one area range, with one label per range".into());
        }
        if self.rec_thrs.windows(2).any(|w| w[0] > w[1]) {
            return bad("recall thresholds must be ascending".into());
        }
        self.max_dets.sort_unstable();
        Ok(self)
    }

    pub(crate) fn dims(&self) -> Dims {
        Dims { t: self.iou_thrs.len(), r: self.rec_thrs.len(), a: self.area_rng.len(), m: self.max_dets.len() }
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub(crate) t: usize,
    pub(crate) r: usize,
    pub(crate) a: usize,
    pub(crate) m: usize,
}

/// The result of `evaluate()` + `accumulate()` + `summarize()`.
#[derive(Debug, Clone)]
pub struct CocoEval {
    /// The parameters used.
    pub params: CocoParams,
    /// Category ids, ascending (the K axis).
    pub cat_ids: Vec<i64>,
    /// `eval['precision']`, shape `(T, R, K, A, M)` in C order; -1 where a category has no GT.
    pub precision: Vec<f64>,
    /// `eval['recall']`, shape `(T, K, A, M)`.
    pub recall: Vec<f64>,
    /// The 12 `summarize()` stats (see [`STAT_NAMES`]).
    pub stats: Vec<f64>,
}

/// Names of the 12 stats, in order.
pub const STAT_NAMES: [&str; 12] = [
    "AP@[.50:.95]all100",
    "AP@.50all100",
    "AP@.75all100",
    "AP@[.50:.95]small100",
    "AP@[.50:.95]medium100",
    "AP@[.50:.95]large100",
    "AR@[.50:.95]all1",
    "AR@[.50:.95]all10",
    "AR@[.50:.95]all100",
    "AR@[.50:.95]small100",
    "AR@[.50:.95]medium100",
    "AR@[.50:.95]large100",
];

/// Per-category summary at area `all`, the largest maxDets (what the reference fixture lists).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CategorySummary {
    /// COCO category id.
    pub cat_id: i64,
    /// AP over all IoU thresholds.
    pub ap: f64,
    /// AP at IoU 0.5.
    pub ap50: f64,
    /// AP at IoU 0.75.
    pub ap75: f64,
    /// Recall averaged over IoU thresholds.
    pub ar: f64,
}

fn mean_valid(values: impl Iterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.filter(|&x| x > -1.0).collect();
    if v.is_empty() { None } else { Some(mean(&v)) }
}

/// `summarize()`'s kind of statistic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ap,
    Ar,
}

const SUMMARY: [(Kind, Option<f64>, &str, usize); 12] = [
    (Kind::Ap, None, "all", 2),
    (Kind::Ap, Some(0.5), "all", 2),
    (Kind::Ap, Some(0.75), "all", 2),
    (Kind::Ap, None, "small", 2),
    (Kind::Ap, None, "medium", 2),
    (Kind::Ap, None, "large", 2),
    (Kind::Ar, None, "all", 0),
    (Kind::Ar, None, "all", 1),
    (Kind::Ar, None, "all", 2),
    (Kind::Ar, None, "small", 2),
    (Kind::Ar, None, "medium", 2),
    (Kind::Ar, None, "large", 2),
];

impl CocoEval {
    fn k(&self) -> usize {
        self.cat_ids.len()
    }

    /// `precision[t, r, k, a, m]`.
    pub fn precision_at(&self, t: usize, r: usize, k: usize, a: usize, m: usize) -> f64 {
        let d = self.params.dims();
        self.precision[(((t * d.r + r) * self.k() + k) * d.a + a) * d.m + m]
    }

    /// `recall[t, k, a, m]`.
    pub fn recall_at(&self, t: usize, k: usize, a: usize, m: usize) -> f64 {
        let d = self.params.dims();
        self.recall[((t * self.k() + k) * d.a + a) * d.m + m]
    }

    /// One `_summarize(ap, iouThr, areaRng, maxDets)` value: the mean of the selected entries that are > -1,
    /// or -1 when there is none.
    fn summarize_one(&self, kind: Kind, iou_thr: Option<f64>, area: &str, max_dets: usize) -> f64 {
        let p = &self.params;
        let d = p.dims();
        let aind = p.area_rng_lbl.iter().position(|l| l == area);
        let mind = p.max_dets.iter().position(|&m| m == max_dets);
        let (Some(a), Some(m)) = (aind, mind) else { return -1.0 };
        let ts: Vec<usize> = match iou_thr {
            // `np.where(iouThr == p.iouThrs)`: exact float equality, as in pycocotools.
            Some(thr) => (0..d.t).filter(|&t| p.iou_thrs[t] == thr).collect(),
            None => (0..d.t).collect(),
        };
        let mut v = Vec::new();
        for &t in &ts {
            match kind {
                Kind::Ap => {
                    for r in 0..d.r {
                        for k in 0..self.k() {
                            v.push(self.precision_at(t, r, k, a, m));
                        }
                    }
                }
                Kind::Ar => {
                    for k in 0..self.k() {
                        v.push(self.recall_at(t, k, a, m));
                    }
                }
            }
        }
        mean_valid(v.into_iter()).unwrap_or(-1.0)
    }

    pub(crate) fn compute_stats(&mut self) {
        let md = &self.params.max_dets;
        self.stats = SUMMARY
            .iter()
            .map(|&(kind, thr, area, mi)| match md.get(mi) {
                Some(&m) => self.summarize_one(kind, thr, area, m),
                None => -1.0,
            })
            .collect();
    }

    /// The 12 lines `summarize()` prints.
    pub fn summary_lines(&self) -> Vec<String> {
        let p = &self.params;
        let (first, last) = (p.iou_thrs[0], p.iou_thrs[p.iou_thrs.len() - 1]);
        SUMMARY
            .iter()
            .zip(&self.stats)
            .map(|(&(kind, thr, area, mi), &s)| {
                let (title, ty) = match kind {
                    Kind::Ap => ("Average Precision", "(AP)"),
                    Kind::Ar => ("Average Recall", "(AR)"),
                };
                let iou = match thr {
                    Some(t) => format!("{t:.2}"),
                    None => format!("{first:.2}:{last:.2}"),
                };
                let md = p.max_dets.get(mi).copied().unwrap_or(0);
                format!(" {title:<18} {ty} @[ IoU={iou:<9} | area={area:>6} | maxDets={md:>3} ] = {s:.3}")
            })
            .collect()
    }

    fn index_of_area(&self, label: &str) -> usize {
        self.params.area_rng_lbl.iter().position(|l| l == label).unwrap_or(0)
    }

    fn nearest_iou(&self, v: f64) -> usize {
        let t = &self.params.iou_thrs;
        (0..t.len()).min_by(|&i, &j| (t[i] - v).abs().total_cmp(&(t[j] - v).abs())).unwrap_or(0)
    }

    /// Per category with GT: AP (.50:.95), AP50, AP75 and AR at area `all` and the largest maxDets.
    pub fn per_category(&self) -> Vec<CategorySummary> {
        let d = self.params.dims();
        let (a, m) = (self.index_of_area("all"), d.m - 1);
        let (t50, t75) = (self.nearest_iou(0.5), self.nearest_iou(0.75));
        (0..self.k())
            .filter_map(|k| {
                let at = |t: usize| (0..d.r).map(move |r| self.precision_at(t, r, k, a, m));
                let ap = mean_valid((0..d.t).flat_map(at))?;
                Some(CategorySummary {
                    cat_id: self.cat_ids[k],
                    ap,
                    ap50: mean_valid(at(t50)).unwrap_or(-1.0),
                    ap75: mean_valid(at(t75)).unwrap_or(-1.0),
                    ar: mean_valid((0..d.t).map(|t| self.recall_at(t, k, a, m))).unwrap_or(-1.0),
                })
            })
            .collect()
    }

    /// mAP at each IoU threshold (area `all`, largest maxDets); `None` where no category has GT.
    pub fn map_per_iou(&self) -> Vec<Option<f64>> {
        let d = self.params.dims();
        let (a, m) = (self.index_of_area("all"), d.m - 1);
        (0..d.t)
            .map(|t| mean_valid((0..d.r).flat_map(|r| (0..self.k()).map(move |k| self.precision_at(t, r, k, a, m)))))
            .collect()
    }
}

/// Evaluates `dt` against `gt` like `COCOeval(gt, gt.loadRes(dt), 'bbox')` + `evaluate()`, `accumulate()`,
/// `summarize()`. `threads` = 1 runs on the calling thread; more uses a rayon pool of that size (0: rayon's
/// default). The result is identical for any number of threads.
pub fn evaluate(gt: &CocoDataset, dt: &Detections, params: &CocoParams, threads: usize) -> Result<CocoEval> {
    let params = params.clone().validated()?;
    let mut cat_ids: Vec<i64> = gt.categories.iter().map(|c| c.id).collect();
    cat_ids.sort_unstable();
    cat_ids.dedup();
    let mut img_ids: Vec<i64> = gt.images.iter().map(|i| i.id).collect();
    img_ids.sort_unstable();
    img_ids.dedup();
    let index: std::collections::HashMap<i64, usize> = img_ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    // Group GT and detections per image (CSR), keeping file order within each image.
    let gts = group(&gt.annotations, &index, "annotation")?;
    let dts = group(&dt.dets, &index, "detection")?;
    let run = || -> Result<CocoEval> {
        let template = CocoAccumulator::new(params.clone(), &cat_ids)?;
        let empty = || template.clone();
        let acc = if threads == 1 {
            let mut acc = empty();
            for (i, &id) in img_ids.iter().enumerate() {
                acc.add_image(id, gts.of(i), dts.of(i))?;
            }
            acc
        } else {
            (0..img_ids.len())
                .into_par_iter()
                .with_min_len(16)
                .try_fold(empty, |mut acc, i| {
                    acc.add_image(img_ids[i], gts.of(i), dts.of(i))?;
                    Ok(acc)
                })
                .try_reduce_with(|mut a, b| {
                    a.merge(b)?;
                    Ok(a)
                })
                .unwrap_or_else(|| Ok(empty()))?
        };
        Ok(acc.finalize_parallel(threads != 1))
    };
    if threads == 1 {
        run()
    } else {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .map_err(|e| Error::Invalid { what: "thread pool", reason: e.to_string() })?;
        pool.install(run)
    }
}

/// Items grouped per image index.
struct Grouped<T> {
    offsets: Vec<usize>,
    items: Vec<T>,
}

impl<T> Grouped<T> {
    fn of(&self, i: usize) -> &[T] {
        &self.items[self.offsets[i]..self.offsets[i + 1]]
    }
}

fn group<T: Copy>(items: &[(i64, T)], index: &std::collections::HashMap<i64, usize>, what: &str) -> Result<Grouped<T>> {
    let mut counts = vec![0usize; index.len() + 1];
    let mut slot = Vec::with_capacity(items.len());
    for (n, (img, _)) in items.iter().enumerate() {
        let Some(&i) = index.get(img) else {
            return Err(Error::Entry {
                what: "evaluation".into(),
                entry: format!("{what} #{n}"),
                reason: format!("image id {img} is not in the ground truth"),
            });
        };
        counts[i + 1] += 1;
        slot.push(i);
    }
    for i in 1..counts.len() {
        counts[i] += counts[i - 1];
    }
    let offsets = counts.clone();
    let mut pos = counts;
    let mut out: Vec<Option<T>> = vec![None; items.len()];
    for (n, &i) in slot.iter().enumerate() {
        out[pos[i]] = Some(items[n].1);
        pos[i] += 1;
    }
    Ok(Grouped { offsets, items: out.into_iter().flatten().collect() })
}
