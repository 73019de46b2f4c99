//! Ultralytics-style detection metrics (8.4): `box_iou` in float32, `match_predictions` (the tp matrix over
//! 10 IoU thresholds), and `ap_per_class` (AP per class and threshold by 101-point trapezoid integration of the
//! precision envelope, P / R / F1 at the confidence of the smoothed class-mean F1 maximum, PR curves), plus
//! `fitness`. NumPy's arithmetic is reproduced (see [`crate::numeric`]) so the values match to ~1e-15.
//!
//! Streaming: [`ApAccumulator::add_image`] turns one image into one small record per detection; accumulators
//! from several workers merge; [`ApAccumulator::finalize`] sorts the records into a fixed order, so the report
//! does not depend on the order images arrived in.

use std::collections::{BTreeMap, HashSet};

use crate::error::{Error, Result};
use crate::numeric::{interp1, linspace, mean, pairwise_sum, trapezoid};

/// `torch.linspace(0.5, 0.95, 10)` in float32, the thresholds of Ultralytics' `DetectionValidator.iouv`.
pub fn default_iou_thresholds() -> Vec<f32> {
    let (start, end, steps) = (0.5f32, 0.95f32, 10usize);
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - i - 1) as f32 }).collect()
}

/// Ultralytics' `box_iou` for one pair of xyxy boxes: float32, `inter / (area1 + area2 - inter + 1e-7)`.
pub fn box_iou(a: &[f32; 4], b: &[f32; 4]) -> f32 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let area_a = (a[2] - a[0]) * (a[3] - a[1]);
    let area_b = (b[2] - b[0]) * (b[3] - b[1]);
    inter / (area_a + area_b - inter + 1e-7)
}

/// A ground-truth object: class and xyxy box.
pub type GtObj = (u32, [f32; 4]);
/// A detection: class, xyxy box, confidence.
pub type DetObj = (u32, [f32; 4], f64);

/// `match_predictions` for one image. `dets` must be in descending confidence order (the order NMS emits);
/// returns one bitmask per detection, bit `t` set when it is a true positive at `thresholds[t]`: for each
/// threshold separately, detections in order each take the not-yet-matched same-class GT with the highest IoU
/// (first on ties) and are true positives when that IoU is `>=` the threshold.
pub fn match_image(gts: &[GtObj], dets: &[DetObj], thresholds: &[f32]) -> Vec<u32> {
    let mut tp = vec![0u32; dets.len()];
    if gts.is_empty() || dets.is_empty() {
        return tp;
    }
    let ng = gts.len();
    // IoU with other-class pairs zeroed, [d][g].
    let iou: Vec<f32> =
        dets.iter().flat_map(|d| gts.iter().map(move |g| if g.0 == d.0 { box_iou(&g.1, &d.1) } else { 0.0 })).collect();
    let mut matched = vec![false; ng];
    for (t, &thr) in thresholds.iter().enumerate() {
        matched.fill(false);
        for (d, bits) in tp.iter_mut().enumerate() {
            let row = &iou[d * ng..(d + 1) * ng];
            let mut best: Option<(usize, f32)> = None;
            for (g, &v) in row.iter().enumerate() {
                if !matched[g] && best.is_none_or(|(_, b)| v > b) {
                    best = Some((g, v));
                }
            }
            if let Some((g, _)) = best.filter(|&(_, v)| v >= thr) {
                matched[g] = true;
                *bits |= 1 << t;
            }
        }
    }
    tp
}

#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Rec {
    conf: f64,
    image: i64,
    rank: u32,
    class: u32,
    tp: u32,
}

/// Streaming `ap_per_class` inputs: per detection (confidence, class, tp bits), per class the GT count. It
/// serializes (serde) so that the parts built by the ranks of a data-parallel run can be gathered and merged.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ApAccumulator {
    thresholds: Vec<f32>,
    recs: Vec<Rec>,
    nt: BTreeMap<u32, u64>,
    images: HashSet<i64>,
}

impl Default for ApAccumulator {
    fn default() -> Self {
        Self::new(default_iou_thresholds()).unwrap_or_else(|_| unreachable!("10 thresholds are valid"))
    }
}

/// Metrics of one class (a class with GT).
#[derive(Debug, Clone, PartialEq)]
pub struct ClassMetrics {
    /// Class index.
    pub class: u32,
    /// Number of GT objects.
    pub num_gt: u64,
    /// Precision at the max-F1 confidence.
    pub p: f64,
    /// Recall at the max-F1 confidence.
    pub r: f64,
    /// F1 at the max-F1 confidence.
    pub f1: f64,
    /// AP at each IoU threshold.
    pub ap: Vec<f64>,
    /// Estimated true positives at the max-F1 confidence (`round(r * n_gt)`).
    pub tp: f64,
    /// Estimated false positives at the max-F1 confidence.
    pub fp: f64,
}

impl ClassMetrics {
    /// AP at IoU 0.5 (the first threshold).
    pub fn ap50(&self) -> f64 {
        self.ap.first().copied().unwrap_or(0.0)
    }

    /// AP averaged over the thresholds (mAP50-95 of this class).
    pub fn ap50_95(&self) -> f64 {
        if self.ap.is_empty() { 0.0 } else { mean(&self.ap) }
    }
}

/// What `ap_per_class` returns, plus the means Ultralytics reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ApReport {
    /// Per class with GT, ascending class index.
    pub classes: Vec<ClassMetrics>,
    /// Mean precision over classes.
    pub mp: f64,
    /// Mean recall over classes.
    pub mr: f64,
    /// mAP at IoU 0.5.
    pub map50: f64,
    /// mAP at IoU 0.75 (threshold index 5 with the default thresholds).
    pub map75: f64,
    /// mAP over all thresholds.
    pub map50_95: f64,
    /// Index into the 1000-point confidence grid where the smoothed mean F1 peaks.
    pub max_f1_index: usize,
    /// The confidence grid `linspace(0, 1, 1000)`.
    pub conf_grid: Vec<f64>,
    /// Per class: precision over the confidence grid.
    pub p_curve: Vec<Vec<f64>>,
    /// Per class: recall over the confidence grid.
    pub r_curve: Vec<Vec<f64>>,
    /// Per class: F1 over the confidence grid.
    pub f1_curve: Vec<Vec<f64>>,
    /// Per class with detections: precision at IoU 0.5 over the recall grid (`prec_values`, for PR plots).
    pub pr_curve: Vec<(u32, Vec<f64>)>,
    /// Number of detections.
    pub num_dets: usize,
}

impl ApReport {
    /// Fitness, the score that picks the best epoch: mAP50-95 alone, as Ultralytics 8.4's `DetMetrics.fitness`
    /// (weights `[0, 0, 0, 1]` on P, R, mAP50, mAP50-95; YOLOv5's and early YOLOv8's `0.1·mAP50 + 0.9·mAP50-95`
    /// picks another epoch when the two disagree).
    pub fn fitness(&self) -> f64 {
        self.map50_95
    }
}

impl ApAccumulator {
    /// An empty accumulator with the given IoU thresholds (1 to 32).
    pub fn new(thresholds: Vec<f32>) -> Result<Self> {
        if thresholds.is_empty() || thresholds.len() > 32 {
            return Err(Error::Invalid { what: "IoU thresholds", reason: format!("{} (1 to 32)", thresholds.len()) });
        }
        Ok(Self { thresholds, recs: Vec::new(), nt: BTreeMap::new(), images: HashSet::new() })
    }

    /// The IoU thresholds.
    pub fn thresholds(&self) -> &[f32] {
        &self.thresholds
    }

    /// Adds one image: matches `dets` (any order; sorted here by descending confidence, stable) to `gts` and
    /// keeps one record per detection. Returns the tp bitmasks in that sorted order.
    pub fn add_image(&mut self, image: i64, gts: &[GtObj], dets: &[DetObj]) -> Result<Vec<u32>> {
        if let Some((i, d)) = dets.iter().enumerate().find(|(_, d)| !d.2.is_finite()) {
            return Err(Error::Invalid {
                what: "detection",
                reason: format!("image {image}, detection {i}: confidence {} is not finite", d.2),
            });
        }
        if !self.images.insert(image) {
            return Err(Error::DuplicateImage(image));
        }
        let mut order: Vec<usize> = (0..dets.len()).collect();
        order.sort_by(|&i, &j| (dets[j].2 + 0.0).total_cmp(&(dets[i].2 + 0.0)));
        let sorted: Vec<DetObj> = order.iter().map(|&i| dets[i]).collect();
        let tp = match_image(gts, &sorted, &self.thresholds);
        for (rank, (d, &bits)) in sorted.iter().zip(&tp).enumerate() {
            self.recs.push(Rec { conf: d.2 + 0.0, image, rank: rank as u32, class: d.0, tp: bits });
        }
        for g in gts {
            *self.nt.entry(g.0).or_insert(0) += 1;
        }
        Ok(tp)
    }

    /// Adds everything `other` holds (same thresholds, disjoint images).
    pub fn merge(&mut self, other: ApAccumulator) -> Result<()> {
        if other.thresholds != self.thresholds {
            return Err(Error::Invalid { what: "accumulator merge", reason: "different IoU thresholds".into() });
        }
        for id in other.images {
            if !self.images.insert(id) {
                return Err(Error::DuplicateImage(id));
            }
        }
        self.recs.extend(other.recs);
        for (c, n) in other.nt {
            *self.nt.entry(c).or_insert(0) += n;
        }
        Ok(())
    }

    /// `ap_per_class` over everything added.
    pub fn finalize(&self) -> ApReport {
        let nthr = self.thresholds.len();
        let mut recs = self.recs.clone();
        // Descending confidence; ties in image-id then rank order (a stable sort of the per-image lists).
        recs.sort_unstable_by(|a, b| b.conf.total_cmp(&a.conf).then(a.image.cmp(&b.image)).then(a.rank.cmp(&b.rank)));
        let x = linspace(0.0, 1.0, 1000);
        let neg_x: Vec<f64> = x.iter().map(|v| -v).collect();
        let x101 = linspace(0.0, 1.0, 101);
        let classes: Vec<(u32, u64)> = self.nt.iter().map(|(&c, &n)| (c, n)).collect();
        let nc = classes.len();
        let mut ap = vec![vec![0.0; nthr]; nc];
        let mut p_curve = vec![vec![0.0; 1000]; nc];
        let mut r_curve = vec![vec![0.0; 1000]; nc];
        let mut pr_curve = Vec::new();
        for (ci, &(c, n_l)) in classes.iter().enumerate() {
            let mine: Vec<&Rec> = recs.iter().filter(|r| r.class == c).collect();
            if mine.is_empty() || n_l == 0 {
                continue;
            }
            let neg_conf: Vec<f64> = mine.iter().map(|r| -r.conf).collect();
            let denom = n_l as f64 + 1e-16;
            let mut recall = vec![vec![0.0; mine.len()]; nthr];
            let mut precision = vec![vec![0.0; mine.len()]; nthr];
            for t in 0..nthr {
                let mut tpc = 0u64;
                for (i, r) in mine.iter().enumerate() {
                    tpc += u64::from(r.tp >> t & 1);
                    let fpc = (i as u64 + 1) - tpc;
                    recall[t][i] = tpc as f64 / denom;
                    precision[t][i] = tpc as f64 / (tpc + fpc) as f64;
                }
            }
            for (i, &nx) in neg_x.iter().enumerate() {
                r_curve[ci][i] = interp1(nx, &neg_conf, &recall[0], Some(0.0), None);
                p_curve[ci][i] = interp1(nx, &neg_conf, &precision[0], Some(1.0), None);
            }
            for t in 0..nthr {
                let (v, mpre, mrec) = compute_ap(&recall[t], &precision[t], &x101);
                ap[ci][t] = v;
                if t == 0 {
                    pr_curve.push((c, x.iter().map(|&xi| interp1(xi, &mrec, &mpre, None, None)).collect()));
                }
            }
        }
        let eps = 1e-16;
        let f1_curve: Vec<Vec<f64>> = p_curve
            .iter()
            .zip(&r_curve)
            .map(|(p, r)| p.iter().zip(r).map(|(&p, &r)| 2.0 * p * r / (p + r + eps)).collect())
            .collect();
        let max_f1_index = if nc == 0 {
            0
        } else {
            let mut mean_f1 = vec![0.0; 1000];
            for row in &f1_curve {
                for (m, &v) in mean_f1.iter_mut().zip(row) {
                    *m += v;
                }
            }
            for m in &mut mean_f1 {
                *m /= nc as f64;
            }
            argmax_first(&smooth(&mean_f1, 0.1))
        };
        let class_metrics: Vec<ClassMetrics> = classes
            .iter()
            .enumerate()
            .map(|(ci, &(c, n))| {
                let (p, r, f1) = (p_curve[ci][max_f1_index], r_curve[ci][max_f1_index], f1_curve[ci][max_f1_index]);
                let tp = (r * n as f64).round_ties_even();
                let fp = (tp / (p + eps) - tp).round_ties_even();
                ClassMetrics { class: c, num_gt: n, p, r, f1, ap: ap[ci].clone(), tp, fp }
            })
            .collect();
        let col_mean = |f: &dyn Fn(&ClassMetrics) -> f64| -> f64 {
            if nc == 0 { 0.0 } else { mean(&class_metrics.iter().map(f).collect::<Vec<_>>()) }
        };
        let all_ap: Vec<f64> = ap.iter().flatten().copied().collect();
        ApReport {
            mp: col_mean(&|m| m.p),
            mr: col_mean(&|m| m.r),
            map50: col_mean(&|m| m.ap[0]),
            map75: col_mean(&|m| m.ap.get(5).copied().unwrap_or(0.0)),
            map50_95: if all_ap.is_empty() { 0.0 } else { mean(&all_ap) },
            classes: class_metrics,
            max_f1_index,
            conf_grid: x,
            p_curve,
            r_curve,
            f1_curve,
            pr_curve,
            num_dets: recs.len(),
        }
    }
}

/// `compute_ap`: sentinels, precision envelope, 101-point interpolation, trapezoid. Returns (ap, mpre, mrec).
fn compute_ap(recall: &[f64], precision: &[f64], x101: &[f64]) -> (f64, Vec<f64>, Vec<f64>) {
    // Sentinels of Ultralytics 8.4: recall [0, r..., r_last, 1], precision [1, p..., 0, 0] (precision drops to 0
    // at the last recall reached, so nothing is credited past it).
    let r_last = recall.last().copied().unwrap_or(0.0);
    let mut mrec = Vec::with_capacity(recall.len() + 3);
    mrec.push(0.0);
    mrec.extend_from_slice(recall);
    mrec.extend_from_slice(&[r_last, 1.0]);
    let mut mpre = Vec::with_capacity(precision.len() + 3);
    mpre.push(1.0);
    mpre.extend_from_slice(precision);
    mpre.extend_from_slice(&[0.0, 0.0]);
    for i in (0..mpre.len() - 1).rev() {
        mpre[i] = mpre[i].max(mpre[i + 1]);
    }
    let y: Vec<f64> = x101.iter().map(|&xi| interp1(xi, &mrec, &mpre, None, None)).collect();
    (trapezoid(&y, x101), mpre, mrec)
}

/// Ultralytics' `smooth`: a box filter of `round(len * f * 2) // 2 + 1` points with edge padding.
fn smooth(y: &[f64], f: f64) -> Vec<f64> {
    let nf = ((y.len() as f64 * f * 2.0).round_ties_even() as usize) / 2 + 1;
    let pad = nf / 2;
    let (first, last) = (y[0], y[y.len() - 1]);
    let mut yp = Vec::with_capacity(y.len() + 2 * pad);
    yp.extend(std::iter::repeat_n(first, pad));
    yp.extend_from_slice(y);
    yp.extend(std::iter::repeat_n(last, pad));
    let w = 1.0 / nf as f64;
    let mut out = Vec::with_capacity(y.len());
    let mut buf = vec![0.0; nf];
    for i in 0..=yp.len() - nf {
        for (b, &v) in buf.iter_mut().zip(&yp[i..i + nf]) {
            *b = v * w;
        }
        out.push(pairwise_sum(&buf));
    }
    out
}

fn argmax_first(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_equal_torch_linspace_float32() {
        // Values from the reference fixture (`iou_thresholds_float32`).
        let want = [
            0.5,
            0.550000011920929,
            0.6000000238418579,
            0.6499999761581421,
            0.699999988079071,
            0.75,
            0.800000011920929,
            0.8500000238418579,
            0.8999999761581421,
            0.949999988079071,
        ];
        let got: Vec<f64> = default_iou_thresholds().iter().map(|&v| f64::from(v)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn greedy_matching_takes_the_best_unmatched_gt() {
        let gts = [(0, [0.0, 0.0, 10.0, 10.0]), (0, [0.0, 0.0, 10.0, 9.0]), (1, [0.0, 0.0, 10.0, 10.0])];
        // Both detections overlap both class-0 GTs; the first takes GT 0 (IoU 1), the second GT 1.
        let dets =
            [(0, [0.0, 0.0, 10.0, 10.0], 0.9), (0, [0.0, 0.0, 10.0, 10.0], 0.8), (2, [0.0, 0.0, 10.0, 10.0], 0.7)];
        let tp = match_image(&gts, &dets, &[0.5, 0.95]);
        assert_eq!(tp, vec![0b11, 0b01, 0]);
    }

    #[test]
    fn perfect_detections_give_ap_near_one_and_order_does_not_matter() {
        let mut a = ApAccumulator::default();
        let mut b = ApAccumulator::default();
        let mut c = ApAccumulator::default();
        for img in 0..6i64 {
            let g = [(img as u32 % 2, [0.0, 0.0, 10.0, 10.0])];
            let d = [(img as u32 % 2, [0.0, 0.0, 10.0, 10.0], 0.5 + img as f64 / 100.0)];
            a.add_image(img, &g, &d).unwrap();
            if img % 2 == 0 {
                b.add_image(img, &g, &d).unwrap()
            } else {
                c.add_image(img, &g, &d).unwrap()
            };
        }
        c.merge(b).unwrap();
        let (ra, rc) = (a.finalize(), c.finalize());
        assert_eq!(ra, rc);
        assert!((ra.map50_95 - 0.995).abs() < 1e-3, "{}", ra.map50_95);
        assert_eq!(ra.classes.len(), 2);
        assert!(a.add_image(0, &[], &[]).is_err());
    }
}
