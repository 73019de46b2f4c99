//! The streaming part of the COCO evaluator: `evaluateImg` per image (IoUs, greedy matching per area range
//! and IoU threshold) into one compact record per detection, then `accumulate` per category.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::{CocoEval, CocoParams, Dims, DtBox, GtBox};
use crate::error::{Error, Result};

/// `np.spacing(1)`, the epsilon pycocotools adds to the precision denominator.
const EPS: f64 = f64::EPSILON;

/// One detection after matching: its score, its image, its rank within its (image, category).
#[derive(Debug, Clone, Copy)]
struct DetRec {
    score: f64,
    image: i64,
    rank: u32,
}

/// Records of one category. `masks[i * A + a]`: bit `t` = true positive at threshold `t`, bit `16 + t` =
/// ignored at threshold `t`, for area range `a`; neither bit = false positive.
#[derive(Debug, Clone, Default)]
struct CatRecords {
    recs: Vec<DetRec>,
    masks: Vec<u32>,
}

/// Buffers reused from image to image.
#[derive(Debug, Clone, Default)]
struct Scratch {
    gt_groups: Vec<(u32, u32)>,
    dt_groups: Vec<(u32, u32)>,
    dt_order: Vec<u32>,
    ious: Vec<f64>,
    gt_ig: Vec<bool>,
    gt_sorted: Vec<u32>,
    gt_matched: Vec<bool>,
    /// Per detection, the GTs it may match (IoU >= the lowest threshold): offsets into `cand`.
    cand_off: Vec<u32>,
    cand: Vec<u32>,
    /// `cand` with each detection's list in the GT order of the current area range.
    cand_sorted: Vec<u32>,
    gt_rank: Vec<u32>,
    /// Per detection of the current area range, bit `t` for a match and bit `16 + t` for an ignored detection.
    masks: Vec<u32>,
}

impl Scratch {
    /// Orders one (image, category) group's detections by descending score (stable, cut at `max_det`), fills the
    /// IoU matrix `[d][g]` in GT file order (maskUtils.iou / bbIou) and lists per detection the GTs with IoU >=
    /// `t_min`, the lowest threshold.
    fn candidates(
        &mut self,
        max_det: usize,
        t_min: f64,
        gts: &[GtBox],
        g_idx: &[(u32, u32)],
        dts: &[DtBox],
        d_idx: &[(u32, u32)],
    ) {
        self.dt_order.clear();
        self.dt_order.extend(d_idx.iter().map(|p| p.1));
        self.dt_order.sort_by(|&i, &j| (dts[j as usize].score + 0.0).total_cmp(&(dts[i as usize].score + 0.0)));
        self.dt_order.truncate(max_det);
        let nd = self.dt_order.len();
        let ng = g_idx.len();
        self.ious.clear();
        self.ious.resize(nd * ng, 0.0);
        for (d, &di) in self.dt_order.iter().enumerate() {
            let db = &dts[di as usize].bbox;
            let da = db[2] * db[3];
            for (g, &(_, gi)) in g_idx.iter().enumerate() {
                let gt = &gts[gi as usize];
                let gb = &gt.bbox;
                let w = (db[2] + db[0]).min(gb[2] + gb[0]) - db[0].max(gb[0]);
                if w <= 0.0 {
                    continue;
                }
                let h = (db[3] + db[1]).min(gb[3] + gb[1]) - db[1].max(gb[1]);
                if h <= 0.0 {
                    continue;
                }
                let i = w * h;
                let u = if gt.iscrowd { da } else { da + gb[2] * gb[3] - i };
                self.ious[d * ng + g] = i / u;
            }
        }
        // Only GTs with IoU >= the lowest threshold can ever be matched; visiting just those (in the same GT
        // order) gives the same matches: skipped GTs would `continue`, and once a regular GT is matched every
        // later GT is an ignored one, where the scan stops either way.
        self.cand_off.clear();
        self.cand.clear();
        self.cand_off.push(0);
        for d in 0..nd {
            for g in 0..ng {
                if self.ious[d * ng + g] >= t_min {
                    self.cand.push(g as u32);
                }
            }
            self.cand_off.push(self.cand.len() as u32);
        }
    }

    /// Marks the GTs that area range `[lo, hi]` ignores (crowds and areas outside it).
    fn ignore_by_area(&mut self, [lo, hi]: [f64; 2], gts: &[GtBox], g_idx: &[(u32, u32)]) {
        self.gt_ig.clear();
        self.gt_ig.extend(g_idx.iter().map(|&(_, gi)| {
            let g = &gts[gi as usize];
            g.iscrowd || g.area < lo || g.area > hi
        }));
    }

    /// pycocotools' greedy matching of the group's detections at every threshold within one area range, into
    /// `masks` (after `candidates` and `ignore_by_area`).
    fn match_area(&mut self, thrs: &[f64], [lo, hi]: [f64; 2], gts: &[GtBox], g_idx: &[(u32, u32)], dts: &[DtBox]) {
        let nd = self.dt_order.len();
        let ng = g_idx.len();
        // GT order: not ignored first (stable).
        self.gt_sorted.clear();
        self.gt_sorted.extend((0..ng as u32).filter(|&g| !self.gt_ig[g as usize]));
        self.gt_sorted.extend((0..ng as u32).filter(|&g| self.gt_ig[g as usize]));
        self.gt_rank.clear();
        self.gt_rank.resize(ng, 0);
        for (r, &g) in self.gt_sorted.iter().enumerate() {
            self.gt_rank[g as usize] = r as u32;
        }
        self.cand_sorted.clear();
        self.cand_sorted.extend_from_slice(&self.cand);
        for d in 0..nd {
            let seg = &mut self.cand_sorted[self.cand_off[d] as usize..self.cand_off[d + 1] as usize];
            if seg.len() > 1 {
                seg.sort_unstable_by_key(|&g| self.gt_rank[g as usize]);
            }
        }
        self.masks.clear();
        self.masks.resize(nd, 0);
        for (t, &thr) in thrs.iter().enumerate() {
            self.gt_matched.clear();
            self.gt_matched.resize(ng, false);
            for d in 0..nd {
                let mut iou = thr.min(1.0 - 1e-10);
                let mut m: Option<usize> = None;
                for &g in &self.cand_sorted[self.cand_off[d] as usize..self.cand_off[d + 1] as usize] {
                    let g = g as usize;
                    let crowd = gts[g_idx[g].1 as usize].iscrowd;
                    if self.gt_matched[g] && !crowd {
                        continue;
                    }
                    if m.is_some_and(|mm| !self.gt_ig[mm] && self.gt_ig[g]) {
                        break;
                    }
                    let v = self.ious[d * ng + g];
                    if v < iou {
                        continue;
                    }
                    iou = v;
                    m = Some(g);
                }
                let db = &dts[self.dt_order[d] as usize].bbox;
                let darea = db[2] * db[3];
                let out_of_range = darea < lo || darea > hi;
                // dtm holds the matched GT's id; pycocotools reads an id of 0 as "no match".
                let (dtm_nonzero, mut ignored) = match m {
                    Some(g) => {
                        self.gt_matched[g] = true;
                        (gts[g_idx[g].1 as usize].id != 0, self.gt_ig[g])
                    }
                    None => (false, false),
                };
                ignored |= !dtm_nonzero && out_of_range;
                if ignored {
                    self.masks[d] |= 1 << (16 + t);
                } else if dtm_nonzero {
                    self.masks[d] |= 1 << t;
                }
            }
        }
    }
}

/// A streaming COCO bbox evaluator: add images in any order (on any number of accumulators), merge, finalize.
#[derive(Debug, Clone)]
pub struct CocoAccumulator {
    params: CocoParams,
    dims: Dims,
    cat_ids: Vec<i64>,
    cat_index: HashMap<i64, u32>,
    cats: Vec<CatRecords>,
    /// Non-ignored GT count per (category, area range).
    npig: Vec<u64>,
    images: HashSet<i64>,
    scratch: Scratch,
}

impl CocoAccumulator {
    /// An empty evaluator for the categories `cat_ids` (detections and GT of other categories are skipped, as
    /// pycocotools does with `params.catIds`).
    pub fn new(params: CocoParams, cat_ids: &[i64]) -> Result<Self> {
        let params = params.validated()?;
        let dims = params.dims();
        let mut ids = cat_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let cat_index = ids.iter().enumerate().map(|(k, &c)| (c, k as u32)).collect();
        Ok(Self {
            dims,
            cats: vec![CatRecords::default(); ids.len()],
            npig: vec![0; ids.len() * dims.a],
            cat_ids: ids,
            cat_index,
            params,
            images: HashSet::new(),
            scratch: Scratch::default(),
        })
    }

    /// Number of images added so far.
    pub fn num_images(&self) -> usize {
        self.images.len()
    }

    /// Evaluates one image (`evaluateImg` for every category and area range) and keeps its per-detection
    /// records. Boxes and scores must be finite (the JSON reader checks this).
    pub fn add_image(&mut self, image_id: i64, gts: &[GtBox], dts: &[DtBox]) -> Result<()> {
        if !self.images.insert(image_id) {
            return Err(Error::DuplicateImage(image_id));
        }
        let mut s = std::mem::take(&mut self.scratch);
        s.gt_groups.clear();
        s.dt_groups.clear();
        for (i, g) in gts.iter().enumerate() {
            if let Some(&k) = self.cat_index.get(&g.category_id) {
                s.gt_groups.push((k, i as u32));
            }
        }
        for (i, d) in dts.iter().enumerate() {
            if let Some(&k) = self.cat_index.get(&d.category_id) {
                s.dt_groups.push((k, i as u32));
            }
        }
        // Stable: file order within a category.
        s.gt_groups.sort_by_key(|p| p.0);
        s.dt_groups.sort_by_key(|p| p.0);
        let (mut gi, mut di) = (0, 0);
        let gt_groups = std::mem::take(&mut s.gt_groups);
        let dt_groups = std::mem::take(&mut s.dt_groups);
        while gi < gt_groups.len() || di < dt_groups.len() {
            let kg = gt_groups.get(gi).map_or(u32::MAX, |p| p.0);
            let kd = dt_groups.get(di).map_or(u32::MAX, |p| p.0);
            let k = kg.min(kd);
            let g_end = gi + gt_groups[gi..].iter().take_while(|p| p.0 == k).count();
            let d_end = di + dt_groups[di..].iter().take_while(|p| p.0 == k).count();
            self.eval_group(&mut s, image_id, k as usize, gts, &gt_groups[gi..g_end], dts, &dt_groups[di..d_end]);
            gi = g_end;
            di = d_end;
        }
        s.gt_groups = gt_groups;
        s.dt_groups = dt_groups;
        self.scratch = s;
        Ok(())
    }

    /// `computeIoU` + `evaluateImg` for one (image, category) for every area range.
    #[allow(clippy::too_many_arguments)]
    fn eval_group(
        &mut self,
        s: &mut Scratch,
        image: i64,
        k: usize,
        gts: &[GtBox],
        g_idx: &[(u32, u32)],
        dts: &[DtBox],
        d_idx: &[(u32, u32)],
    ) {
        let na = self.dims.a;
        let max_det = self.params.max_dets.last().copied().unwrap_or(0);
        let t_min = self.params.iou_thrs.iter().fold(f64::INFINITY, |m, &t| m.min(t.min(1.0 - 1e-10)));
        s.candidates(max_det, t_min, gts, g_idx, dts, d_idx);
        let nd = s.dt_order.len();
        let base = self.cats[k].recs.len();
        {
            let cat = &mut self.cats[k];
            for (rank, &di) in s.dt_order.iter().enumerate() {
                cat.recs.push(DetRec { score: dts[di as usize].score + 0.0, image, rank: rank as u32 });
            }
            cat.masks.resize(cat.recs.len() * na, 0);
        }
        for a in 0..na {
            let area = self.params.area_rng[a];
            s.ignore_by_area(area, gts, g_idx);
            self.npig[k * na + a] += s.gt_ig.iter().filter(|&&ig| !ig).count() as u64;
            if nd == 0 {
                continue;
            }
            s.match_area(&self.params.iou_thrs, area, gts, g_idx, dts);
            let cat = &mut self.cats[k];
            for (d, &mask) in s.masks.iter().enumerate() {
                cat.masks[(base + d) * na + a] = mask;
            }
        }
    }

    /// Adds everything `other` holds (same parameters and categories; disjoint images).
    pub fn merge(&mut self, other: CocoAccumulator) -> Result<()> {
        if other.params != self.params || other.cat_ids != self.cat_ids {
            return Err(Error::Invalid {
                what: "accumulator merge",
                reason: "the two evaluators have different parameters or categories".into(),
            });
        }
        for id in other.images {
            if !self.images.insert(id) {
                return Err(Error::DuplicateImage(id));
            }
        }
        for (mine, theirs) in self.cats.iter_mut().zip(other.cats) {
            mine.recs.extend(theirs.recs);
            mine.masks.extend(theirs.masks);
        }
        for (a, b) in self.npig.iter_mut().zip(other.npig) {
            *a += b;
        }
        Ok(())
    }

    /// `accumulate()` + `summarize()` on the calling thread.
    pub fn finalize(&self) -> CocoEval {
        self.finalize_parallel(false)
    }

    /// `accumulate()` + `summarize()`, categories in parallel on the current rayon pool when `parallel`.
    pub fn finalize_parallel(&self, parallel: bool) -> CocoEval {
        let d = self.dims;
        let nk = self.cat_ids.len();
        let per_cat: Vec<(Vec<f64>, Vec<f64>)> = if parallel {
            (0..nk).into_par_iter().map(|k| self.accumulate_cat(k)).collect()
        } else {
            (0..nk).map(|k| self.accumulate_cat(k)).collect()
        };
        let mut precision = vec![-1.0; d.t * d.r * nk * d.a * d.m];
        let mut recall = vec![-1.0; d.t * nk * d.a * d.m];
        for (k, (p, r)) in per_cat.iter().enumerate() {
            for t in 0..d.t {
                for ri in 0..d.r {
                    for am in 0..d.a * d.m {
                        precision[((t * d.r + ri) * nk + k) * d.a * d.m + am] = p[(t * d.r + ri) * d.a * d.m + am];
                    }
                }
                for am in 0..d.a * d.m {
                    recall[(t * nk + k) * d.a * d.m + am] = r[t * d.a * d.m + am];
                }
            }
        }
        let mut eval =
            CocoEval { params: self.params.clone(), cat_ids: self.cat_ids.clone(), precision, recall, stats: vec![] };
        eval.compute_stats();
        eval
    }

    /// Precision `(T, R, A, M)` and recall `(T, A, M)` of category `k`.
    fn accumulate_cat(&self, k: usize) -> (Vec<f64>, Vec<f64>) {
        let d = self.dims;
        let mut prec = vec![-1.0; d.t * d.r * d.a * d.m];
        let mut rec = vec![-1.0; d.t * d.a * d.m];
        let cat = &self.cats[k];
        // The order of pycocotools' mergesort on -score over detections concatenated in image-id order.
        let mut order: Vec<u32> = (0..cat.recs.len() as u32).collect();
        order.sort_unstable_by(|&i, &j| {
            let (a, b) = (&cat.recs[i as usize], &cat.recs[j as usize]);
            b.score.total_cmp(&a.score).then(a.image.cmp(&b.image)).then(a.rank.cmp(&b.rank))
        });
        let mut rc: Vec<f64> = Vec::with_capacity(order.len());
        let mut pr: Vec<f64> = Vec::with_capacity(order.len());
        // Masks of the selected detections in sorted order, contiguous for the per-threshold passes.
        let mut sel: Vec<u32> = Vec::with_capacity(order.len());
        for a in 0..d.a {
            let npig = self.npig[k * d.a + a];
            if npig == 0 {
                continue;
            }
            for (m, &max_det) in self.params.max_dets.iter().enumerate() {
                sel.clear();
                sel.extend(
                    order
                        .iter()
                        .filter(|&&i| (cat.recs[i as usize].rank as usize) < max_det)
                        .map(|&i| cat.masks[i as usize * d.a + a]),
                );
                for t in 0..d.t {
                    rc.clear();
                    pr.clear();
                    let (mut tp, mut fp) = (0u64, 0u64);
                    // Ignored detections only repeat the previous (recall, precision) point; skipping them
                    // leaves the envelope and every recall-threshold lookup unchanged.
                    for &mask in &sel {
                        if mask & (1 << (16 + t)) != 0 {
                            continue;
                        }
                        if mask & (1 << t) != 0 {
                            tp += 1;
                        } else {
                            fp += 1;
                        }
                        let (tpf, fpf) = (tp as f64, fp as f64);
                        rc.push(tpf / npig as f64);
                        pr.push(tpf / (fpf + tpf + EPS));
                    }
                    rec[(t * d.a + a) * d.m + m] = rc.last().copied().unwrap_or(0.0);
                    for i in (1..pr.len()).rev() {
                        if pr[i] > pr[i - 1] {
                            pr[i - 1] = pr[i];
                        }
                    }
                    // searchsorted(rc, recThrs, side='left'); past the end stays 0.
                    let mut j = 0;
                    for (ri, &thr) in self.params.rec_thrs.iter().enumerate() {
                        while j < rc.len() && rc[j] < thr {
                            j += 1;
                        }
                        prec[((t * d.r + ri) * d.a + a) * d.m + m] = if j < rc.len() { pr[j] } else { 0.0 };
                    }
                }
            }
        }
        (prec, rec)
    }
}
