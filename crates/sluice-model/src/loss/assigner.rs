//! The task-aligned assigner of Ultralytics 8.4 (`TaskAlignedAssigner`, top-k 10, α 0.5, β 6, eps 1e-9), run
//! on the host once per batch from the detached predictions (one device→host copy per batch, none per image).
//! Candidates are anchor centres strictly inside the GT box, whose sides shorter than `min_side` (16 px, the
//! middle stride) are first widened about the centre; the metric is `score^α · CIoU^β`; each GT takes its top-k
//! candidates; an anchor positive for several GTs goes to the GT with the largest CIoU.

/// Assigner hyper-parameters (Ultralytics defaults in [`Default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AssignerConfig {
    /// Anchors per GT.
    pub topk: usize,
    /// Exponent of the class score.
    pub alpha: f64,
    /// Exponent of the CIoU.
    pub beta: f64,
    /// Epsilon of the inside test and the normalisation.
    pub eps: f64,
    /// GT sides shorter than this are widened to it for the candidate test (8.4: the middle stride, 16 px).
    pub min_side: f64,
    /// After the one-GT-per-anchor rule, each GT keeps only its `topk2` best positives (`tal_topk2`: 1 in the
    /// one-to-one loss of end-to-end heads); `None` keeps them all.
    pub topk2: Option<usize>,
    /// The tensor assigner (`dense`) computes the overlaps of every (GT, prediction) pair in one kernel
    /// (`sluice_kernels::iou::ciou_pairs`, the same values) instead of composed ops: the opt-in device path
    /// `fused_ciou`. The host assigner ignores it.
    pub fused_ciou: bool,
}

impl Default for AssignerConfig {
    fn default() -> Self {
        Self { topk: 10, alpha: 0.5, beta: 6.0, eps: 1e-9, min_side: 16.0, topk2: None, fused_ciou: false }
    }
}

/// A ground-truth box of one image: class and `x1, y1, x2, y2` in input pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GtBox {
    /// Class index.
    pub class: usize,
    /// Corners in input pixels.
    pub xyxy: [f32; 4],
}

/// The assigner's result for a batch, flattened `(image, anchor)` → `image · A + anchor`.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// Anchors per image.
    pub anchors: usize,
    /// Foreground anchors.
    pub fg: Vec<bool>,
    /// Assigned GT index within the image (0 where not foreground, as Ultralytics).
    pub gt_idx: Vec<usize>,
    /// Target class (meaningful where foreground).
    pub label: Vec<usize>,
    /// The non-zero entry of the target score vector (0 where not foreground).
    pub score: Vec<f32>,
    /// Assigned GT box in input pixels (meaningful where foreground).
    pub bbox: Vec<[f32; 4]>,
}

impl Assignment {
    /// Sum of all target scores (before the clamp to ≥ 1).
    pub fn score_sum(&self) -> f64 {
        self.score.iter().map(|&s| s as f64).sum()
    }

    /// Number of foreground anchors.
    pub fn fg_count(&self) -> usize {
        self.fg.iter().filter(|&&f| f).count()
    }
}

/// CIoU of two xyxy boxes (Ultralytics `bbox_iou(..., CIoU=True)`, eps 1e-7), in f64.
pub fn ciou_host(b1: [f64; 4], b2: [f64; 4]) -> f64 {
    let eps = 1e-7;
    let (w1, h1) = (b1[2] - b1[0], (b1[3] - b1[1]).max(eps));
    let (w2, h2) = (b2[2] - b2[0], (b2[3] - b2[1]).max(eps));
    let iw = (b1[2].min(b2[2]) - b1[0].max(b2[0])).max(0.0);
    let ih = (b1[3].min(b2[3]) - b1[1].max(b2[1])).max(0.0);
    let inter = iw * ih;
    let union = w1 * h1 + w2 * h2 - inter + eps;
    let iou = inter / union;
    let cw = b1[2].max(b2[2]) - b1[0].min(b2[0]);
    let ch = b1[3].max(b2[3]) - b1[1].min(b2[1]);
    let c2 = cw * cw + ch * ch + eps;
    let rho2 = ((b2[0] + b2[2] - b1[0] - b1[2]).powi(2) + (b2[1] + b2[3] - b1[1] - b1[3]).powi(2)) / 4.0;
    let v = 4.0 / (std::f64::consts::PI.powi(2)) * ((w2 / h2).atan() - (w1 / h1).atan()).powi(2);
    let alpha = v / (v - iou + (1.0 + eps));
    iou - (rho2 / c2 + v * alpha)
}

/// Runs the assigner.
///
/// * `scores`: class probabilities (after the sigmoid), layout `(B, nc, A)`.
/// * `pred_boxes`: predicted boxes `x1, y1, x2, y2` in input pixels, layout `(B, 4, A)`.
/// * `anchors`: anchor centres in input pixels, `A` entries.
/// * `gts`: the GT boxes of each of the `B` images.
pub fn assign(
    cfg: &AssignerConfig,
    scores: &[f32],
    pred_boxes: &[f32],
    anchors: &[[f32; 2]],
    gts: &[Vec<GtBox>],
    nc: usize,
) -> Assignment {
    let a_n = anchors.len();
    let b_n = gts.len();
    let mut out = Assignment {
        anchors: a_n,
        fg: vec![false; b_n * a_n],
        gt_idx: vec![0; b_n * a_n],
        label: vec![0; b_n * a_n],
        score: vec![0.0; b_n * a_n],
        bbox: vec![[0.0; 4]; b_n * a_n],
    };
    for (b, image_gts) in gts.iter().enumerate() {
        if image_gts.is_empty() {
            continue;
        }
        let pred = &pred_boxes[b * 4 * a_n..(b + 1) * 4 * a_n];
        let scores = &scores[b * nc * a_n..(b + 1) * nc * a_n];
        let (overlaps, metric, candidate) = alignment(cfg, scores, pred, anchors, image_gts, nc);
        let pos = positives(cfg, &overlaps, &metric, &candidate, image_gts.len(), a_n);
        targets(cfg, &overlaps, &metric, &pos, image_gts, b, &mut out);
    }
    out
}

/// One image's overlaps and alignment metrics, dense `(n, A)` for its `n` GTs, zero outside the candidates (anchor
/// centres inside a GT), and which entries are candidates. `scores` is the image's `(nc, A)`, `pred` its `(4, A)`.
fn alignment(
    cfg: &AssignerConfig,
    scores: &[f32],
    pred: &[f32],
    anchors: &[[f32; 2]],
    image_gts: &[GtBox],
    nc: usize,
) -> (Vec<f64>, Vec<f64>, Vec<bool>) {
    let (n, a_n) = (image_gts.len(), anchors.len());
    let pred = |a: usize| -> [f64; 4] { [0, 1, 2, 3].map(|k| pred[k * a_n + a] as f64) };
    let mut overlaps = vec![0.0f64; n * a_n];
    let mut metric = vec![0.0f64; n * a_n];
    let mut candidate = vec![false; n * a_n];
    for (g, gt) in image_gts.iter().enumerate() {
        let gb = gt.xyxy.map(|v| v as f64);
        let (cx, cy) = ((gb[0] + gb[2]) / 2.0, (gb[1] + gb[3]) / 2.0);
        let w = (gb[2] - gb[0]).max(cfg.min_side);
        let h = (gb[3] - gb[1]).max(cfg.min_side);
        let (x1, y1, x2, y2) = (cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0);
        let cls = gt.class.min(nc.saturating_sub(1));
        for (a, p) in anchors.iter().enumerate() {
            let (ax, ay) = (p[0] as f64, p[1] as f64);
            let d = (ax - x1).min(ay - y1).min(x2 - ax).min(y2 - ay);
            if d > cfg.eps {
                let i = g * a_n + a;
                candidate[i] = true;
                let ov = ciou_host(gb, pred(a)).max(0.0);
                let s = scores[cls * a_n + a] as f64;
                overlaps[i] = ov;
                metric[i] = s.powf(cfg.alpha) * ov.powf(cfg.beta);
            }
        }
    }
    (overlaps, metric, candidate)
}

/// The positive `(GT, anchor)` pairs of one image, dense `(n, A)`: each GT's top-k candidates by metric, one GT per
/// anchor, then the optional second top-k.
fn positives(
    cfg: &AssignerConfig,
    overlaps: &[f64],
    metric: &[f64],
    candidate: &[bool],
    n: usize,
    a_n: usize,
) -> Vec<bool> {
    // Top-k per GT (largest metric first, lower anchor index on ties), restricted to candidates.
    let mut pos = vec![false; n * a_n];
    let mut order: Vec<usize> = Vec::with_capacity(a_n);
    for g in 0..n {
        let row = &metric[g * a_n..(g + 1) * a_n];
        order.clear();
        order.extend(0..a_n);
        let k = cfg.topk.min(a_n);
        if k == 0 {
            continue;
        }
        order.select_nth_unstable_by(k - 1, |&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
        for &a in &order[..k] {
            if candidate[g * a_n + a] {
                pos[g * a_n + a] = true;
            }
        }
    }
    // One GT per anchor: the one with the largest overlap (first on ties).
    for a in 0..a_n {
        let count = (0..n).filter(|&g| pos[g * a_n + a]).count();
        if count > 1 {
            let mut best = 0;
            for g in 1..n {
                if overlaps[g * a_n + a] > overlaps[best * a_n + a] {
                    best = g;
                }
            }
            for g in 0..n {
                pos[g * a_n + a] = g == best;
            }
        }
    }
    // topk2: each GT keeps its `k2` anchors of largest metric among the positives (Ultralytics' top-k over the
    // metric masked by the positives, where a zero can win over a positive of metric zero: lower index first).
    if let Some(k2) = cfg.topk2.filter(|&k2| k2 < cfg.topk) {
        for g in 0..n {
            let value = |a: usize| if pos[g * a_n + a] { metric[g * a_n + a] } else { 0.0 };
            order.clear();
            order.extend(0..a_n);
            let k = k2.min(a_n);
            if k == 0 {
                continue;
            }
            order.select_nth_unstable_by(k - 1, |&i, &j| value(j).total_cmp(&value(i)).then(i.cmp(&j)));
            let keep: Vec<usize> = order[..k].to_vec();
            for a in 0..a_n {
                if pos[g * a_n + a] && !keep.contains(&a) {
                    pos[g * a_n + a] = false;
                }
            }
        }
    }
    pos
}

/// Writes one image's targets into `out` (image `b`): for each positive anchor its GT (the first positive one), the
/// GT's class and box, and the normalised alignment (metric / the GT's largest metric × the GT's largest overlap,
/// the largest over the anchor's positive GTs).
fn targets(
    cfg: &AssignerConfig,
    overlaps: &[f64],
    metric: &[f64],
    pos: &[bool],
    image_gts: &[GtBox],
    b: usize,
    out: &mut Assignment,
) {
    let (n, a_n) = (image_gts.len(), out.anchors);
    // Normalised alignment: metric / max metric of the GT × max overlap of the GT, max over GTs.
    let mut pos_align = vec![0.0f64; n];
    let mut pos_ov = vec![0.0f64; n];
    for g in 0..n {
        for a in 0..a_n {
            let i = g * a_n + a;
            if pos[i] {
                pos_align[g] = pos_align[g].max(metric[i]);
                pos_ov[g] = pos_ov[g].max(overlaps[i]);
            }
        }
    }
    for a in 0..a_n {
        let Some(g) = (0..n).find(|&g| pos[g * a_n + a]) else { continue };
        let mut norm = 0.0f64;
        for h in 0..n {
            let i = h * a_n + a;
            if pos[i] {
                norm = norm.max(metric[i] * pos_ov[h] / (pos_align[h] + cfg.eps));
            }
        }
        let o = b * a_n + a;
        out.fg[o] = true;
        out.gt_idx[o] = g;
        out.label[o] = image_gts[g].class;
        out.score[o] = norm as f32;
        out.bbox[o] = image_gts[g].xyxy;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ciou_of_identical_boxes_is_one_and_of_far_boxes_negative() {
        let b = [10.0, 20.0, 50.0, 40.0];
        assert!((ciou_host(b, b) - 1.0).abs() < 1e-6);
        assert!(ciou_host(b, [200.0, 200.0, 210.0, 260.0]) < 0.0);
    }

    #[test]
    fn a_single_gt_takes_its_best_candidates() {
        // 8 anchors on a line, a GT covering anchors 2..=5; predictions equal the GT at anchors 3 and 4.
        let anchors: Vec<[f32; 2]> = (0..8).map(|i| [i as f32 * 8.0 + 4.0, 4.0]).collect();
        let gt = [16.0f32, 0.0, 48.0, 8.0];
        let mut pred = vec![0f32; 4 * 8];
        for a in 0..8 {
            let off = if a == 3 || a == 4 { 0.0 } else { 6.0 };
            pred[a] = gt[0] + off;
            pred[8 + a] = gt[1];
            pred[16 + a] = gt[2] + off;
            pred[24 + a] = gt[3];
        }
        let scores = vec![0.5f32; 8];
        let cfg = AssignerConfig { topk: 2, ..Default::default() };
        let r = assign(&cfg, &scores, &pred, &anchors, &[vec![GtBox { class: 0, xyxy: gt }]], 1);
        let fg: Vec<usize> = (0..8).filter(|&a| r.fg[a]).collect();
        assert_eq!(fg, vec![3, 4]);
        // Both perfect: normalised score = overlap max = 1.
        assert!((r.score[3] - 1.0).abs() < 1e-5);
    }
}
