//! Non-maximum suppression of YOLO head outputs, matched to Ultralytics' `non_max_suppression` (8.4) and
//! torchvision's CPU `nms` kernel operation for operation: confidence filter (strict `>` in float32), single- or
//! multi-label candidates, top `max_nms` by score, greedy suppression in stable descending score order with
//! float32 IoU compared `> iou_thres` in float64, at most `max_det` kept.
//!
//! Two per-class modes: [`NmsMode::Exact`] runs each class on its own boxes (what `torchvision.ops.batched_nms`
//! does on the CPU for large inputs), [`NmsMode::ClassOffset`] reproduces Ultralytics' trick of shifting every
//! box by `class * max_wh` in float32 before one class-blind NMS, including the IoU roundings that shift causes.
//! Unlike Ultralytics there is no time limit: every image is processed completely. A NaN or infinite value
//! anywhere in the prediction is an error naming the image, anchor and row, never a panic.
//!
//! Speed: one sequential pass over the class rows (branch-free running max, or a chunked threshold test for
//! multi-label), candidates sorted by integer keys, boxes read only for the candidates that are reached, each
//! compared only with the boxes already kept in its own class (exactly equivalent to the suppression loop), and
//! processing stops once `max_det` boxes are kept (the output is in score order).

use sluice_core::{BoxXyxy, Detection, PostProcess};

use crate::error::{Error, Result};

/// Memory layout of one image's prediction with `4 + nc` rows (`cx, cy, w, h`, then class scores) over `A`
/// anchors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// `(4 + nc, A)`: row-major rows of anchors, the Ultralytics / candle head layout.
    #[default]
    ChannelsFirst,
    /// `(A, 4 + nc)`: one contiguous row per anchor (e.g. after a device-side top-k gather).
    AnchorsFirst,
}

/// How classes are kept apart during suppression.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum NmsMode {
    /// Exact per-class NMS (torchvision `batched_nms`).
    #[default]
    Exact,
    /// Ultralytics' float32 class-offset trick with the given `max_wh` (7680 in Ultralytics).
    ClassOffset {
        /// Offset per class index, in pixels.
        max_wh: f32,
    },
    /// No suppression: the candidates above `conf_thres` in descending score order, up to `max_det`. This is
    /// Ultralytics' `nms=False` path for an end-to-end head (YOLO26), whose one-to-one top-k output holds one row
    /// per object already.
    None,
}

/// NMS settings. [`NmsParams::default`] is what Ultralytics' `DetectionValidator` uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NmsParams {
    /// Candidates need a class score `> conf_thres` (compared in float32, like a torch tensor with a scalar).
    pub conf_thres: f64,
    /// A box is suppressed when its IoU with a kept box is `> iou_thres` (float32 IoU compared in float64).
    pub iou_thres: f64,
    /// Most detections kept per image.
    pub max_det: usize,
    /// Most candidates entering suppression (the highest scores).
    pub max_nms: usize,
    /// Every (anchor, class) pair above the threshold is a candidate, not just the anchor's best class.
    pub multi_label: bool,
    /// Suppress across classes.
    pub agnostic: bool,
    /// Per-class mode (ignored when `agnostic`).
    pub mode: NmsMode,
}

impl Default for NmsParams {
    fn default() -> Self {
        Self {
            conf_thres: 0.001,
            iou_thres: 0.7,
            max_det: 300,
            max_nms: 30_000,
            multi_label: true,
            agnostic: false,
            mode: NmsMode::Exact,
        }
    }
}

impl NmsParams {
    /// Exactly what Ultralytics' `DetectionValidator.postprocess` runs (8.4): conf 0.001, IoU 0.7, `max_det` 300,
    /// `max_nms` 30000, `multi_label=True`, not agnostic, and the float32 class-offset trick with `max_wh` 7680
    /// (matched to `nms_ref_img0_multi.npy`). [`NmsParams::default`] differs only in using exact per-class NMS.
    pub fn ultralytics_val() -> Self {
        Self { mode: NmsMode::ClassOffset { max_wh: 7680.0 }, ..Self::default() }
    }
}

/// A borrowed prediction of one image.
#[derive(Debug, Clone, Copy)]
pub struct PredView<'a> {
    data: &'a [f32],
    num_classes: usize,
    num_anchors: usize,
    layout: Layout,
}

impl<'a> PredView<'a> {
    /// Wraps `data` of `(4 + num_classes) * num_anchors` values in `layout`.
    pub fn new(data: &'a [f32], num_classes: usize, num_anchors: usize, layout: Layout) -> Result<Self> {
        let need = (4 + num_classes).checked_mul(num_anchors);
        if need != Some(data.len()) || num_classes == 0 {
            return Err(Error::Invalid {
                what: "prediction shape",
                reason: format!(
                    "{} values for {num_classes} classes x {num_anchors} anchors (need (4 + nc) x A, nc >= 1)",
                    data.len()
                ),
            });
        }
        Ok(Self { data, num_classes, num_anchors, layout })
    }

    /// Number of classes.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Number of anchors.
    pub fn num_anchors(&self) -> usize {
        self.num_anchors
    }

    #[inline]
    pub(crate) fn at(&self, row: usize, anchor: usize) -> f32 {
        match self.layout {
            Layout::ChannelsFirst => self.data[row * self.num_anchors + anchor],
            Layout::AnchorsFirst => self.data[anchor * (4 + self.num_classes) + row],
        }
    }
}

/// An owned batch of predictions `(B, 4 + nc, A)` (or `(B, A, 4 + nc)`): the input of [`Nms`] as a
/// [`PostProcess`] stage.
#[derive(Debug, Clone, Default)]
pub struct PredBatch {
    /// The values, image after image.
    pub data: Vec<f32>,
    /// Number of images.
    pub batch: usize,
    /// Number of classes.
    pub num_classes: usize,
    /// Number of anchors per image.
    pub num_anchors: usize,
    /// Layout of each image.
    pub layout: Layout,
}

impl PredBatch {
    /// The view of image `b`.
    pub fn image(&self, b: usize) -> Result<PredView<'_>> {
        let per = (4 + self.num_classes) * self.num_anchors;
        if self.data.len() != per * self.batch || b >= self.batch {
            return Err(Error::Invalid {
                what: "prediction batch",
                reason: format!(
                    "image {b} of {} with {} values ({} classes x {} anchors)",
                    self.batch,
                    self.data.len(),
                    self.num_classes,
                    self.num_anchors
                ),
            });
        }
        PredView::new(&self.data[b * per..(b + 1) * per], self.num_classes, self.num_anchors, self.layout)
    }
}

/// Reusable buffers of [`Nms::run`]; keep one per worker thread to avoid allocating per image.
#[derive(Debug, Default)]
pub struct NmsScratch {
    /// Candidates as (`anchor * nc + class`, score), in Ultralytics' order (anchor, then class).
    keys: Vec<(u64, f32)>,
    /// `(descending score key << 32) | position in keys`, sorted.
    order: Vec<u64>,
    /// Kept boxes per group: suppression coordinates and area.
    kept: Vec<Vec<[f32; 5]>>,
}

/// A u32 whose ascending order is the descending order of the (finite) float `s`; -0.0 and 0.0 are equal.
#[inline]
pub(crate) fn desc_key(s: f32) -> u32 {
    let b = (s + 0.0).to_bits();
    let asc = if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 };
    !asc
}

/// Box extent of all anchors: `(min of x1/y1, max of x2/y2)` in float64.
pub(crate) struct Extent {
    lo: f64,
    hi: f64,
}

/// Non-maximum suppression with fixed parameters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nms {
    /// The settings.
    pub params: NmsParams,
}

impl Nms {
    /// NMS with `params`.
    pub fn new(params: NmsParams) -> Self {
        Self { params }
    }

    /// Runs NMS on one image (`image` only names it in errors). Writes the kept detections, in descending
    /// score order, to `out` and, when given, the anchor index of each to `anchors`. Any NaN or infinite value
    /// in the prediction is an error.
    pub fn run(
        &self,
        pred: &PredView<'_>,
        image: usize,
        scratch: &mut NmsScratch,
        out: &mut Vec<Detection>,
        mut anchors: Option<&mut Vec<usize>>,
    ) -> Result<()> {
        begin_image(&self.params, out, anchors.as_deref_mut())?;
        let p = &self.params;
        let nc = pred.num_classes;
        let extent = check_boxes(pred, image)?;
        let multi = p.multi_label && nc > 1;
        let all_finite = candidates(pred, p.conf_thres as f32, multi, scratch);
        if !all_finite {
            return Err(first_non_finite(pred, image));
        }
        if scratch.keys.len() > u32::MAX as usize {
            return Err(Error::Invalid { what: "prediction", reason: "more than 2^32 candidates".into() });
        }
        // Stable descending score order: ties keep the candidate order (torch's stable sort).
        scratch.order.clear();
        for (pos, &(_, score)) in scratch.keys.iter().enumerate() {
            scratch.order.push((u64::from(desc_key(score)) << 32) | pos as u64);
        }
        scratch.order.sort_unstable();
        scratch.order.truncate(p.max_nms);
        self.suppress(pred, &extent, scratch, out, anchors);
        Ok(())
    }

    /// Greedy suppression over `scratch.order`.
    fn suppress(
        &self,
        pred: &PredView<'_>,
        extent: &Extent,
        scratch: &mut NmsScratch,
        out: &mut Vec<Detection>,
        mut anchors: Option<&mut Vec<usize>>,
    ) {
        let p = &self.params;
        let nc = pred.num_classes;
        let offset = match (p.agnostic, p.mode) {
            (false, NmsMode::ClassOffset { max_wh }) => Some(max_wh),
            _ => None,
        };
        // With the class offset, boxes of different classes can only overlap when the boxes span at least
        // `max_wh` pixels; otherwise comparing within the class is exact, else compare with every kept box.
        let per_class = match (p.agnostic, offset) {
            (true, _) => false,
            (false, Some(w)) => extent.hi - extent.lo < f64::from(w),
            (false, None) => true,
        };
        let groups = if per_class { nc } else { 1 };
        if scratch.kept.len() < groups {
            scratch.kept.resize_with(groups, Vec::new);
        }
        for k in &mut scratch.kept[..groups] {
            k.clear();
        }
        let thr = p.iou_thres;
        for &o in &scratch.order {
            if out.len() >= p.max_det {
                break;
            }
            let (key, score) = scratch.keys[(o & 0xffff_ffff) as usize];
            let (a, c) = ((key / nc as u64) as usize, (key % nc as u64) as usize);
            // Ultralytics' xywh2xyxy: xy -+ wh / 2 in float32.
            let (cx, cy, hw, hh) = (pred.at(0, a), pred.at(1, a), pred.at(2, a) / 2.0, pred.at(3, a) / 2.0);
            let bbox = [cx - hw, cy - hh, cx + hw, cy + hh];
            let mut b = bbox;
            if let Some(w) = offset {
                let off = c as f32 * w;
                for v in &mut b {
                    *v += off;
                }
            }
            let area = (b[2] - b[0]) * (b[3] - b[1]);
            let g = if per_class { c } else { 0 };
            let suppressed = p.mode != NmsMode::None
                && scratch.kept[g].iter().any(|k| {
                    let w = (k[2].min(b[2]) - k[0].max(b[0])).max(0.0);
                    let h = (k[3].min(b[3]) - k[1].max(b[1])).max(0.0);
                    let inter = w * h;
                    let ovr = inter / (k[4] + area - inter);
                    f64::from(ovr) > thr
                });
            if suppressed {
                continue;
            }
            scratch.kept[g].push([b[0], b[1], b[2], b[3], area]);
            out.push(Detection { bbox: BoxXyxy::new(bbox[0], bbox[1], bbox[2], bbox[3]), score, class: c as u32 });
            if let Some(v) = anchors.as_deref_mut() {
                v.push(a);
            }
        }
    }

    /// Runs NMS on every image of `batch` into `out[b]`.
    pub fn run_batch(&self, batch: &PredBatch, scratch: &mut NmsScratch, out: &mut Vec<Vec<Detection>>) -> Result<()> {
        out.resize_with(batch.batch, Vec::new);
        out.truncate(batch.batch);
        for (b, dets) in out.iter_mut().enumerate() {
            self.run(&batch.image(b)?, b, scratch, dets, None)?;
        }
        Ok(())
    }
}

/// The start of one image's NMS (shared by [`Nms`] and [`crate::MaskNms`]): empties the outputs and checks that the
/// thresholds are finite.
pub(crate) fn begin_image(p: &NmsParams, out: &mut Vec<Detection>, anchors: Option<&mut Vec<usize>>) -> Result<()> {
    out.clear();
    if let Some(a) = anchors {
        a.clear();
    }
    if !(p.iou_thres.is_finite() && p.conf_thres.is_finite()) {
        return Err(Error::Invalid { what: "NMS thresholds", reason: format!("{p:?}") });
    }
    Ok(())
}

/// Checks that every box value is finite and returns the extent of all boxes (as xyxy).
pub(crate) fn check_boxes(pred: &PredView<'_>, image: usize) -> Result<Extent> {
    let na = pred.num_anchors;
    let (mut lo, mut hi, mut finite) = (f32::INFINITY, f32::NEG_INFINITY, true);
    let mut visit = |cx: f32, cy: f32, w: f32, h: f32| {
        finite &= cx.is_finite() & cy.is_finite() & w.is_finite() & h.is_finite();
        let (hw, hh) = (w / 2.0, h / 2.0);
        lo = lo.min(cx - hw).min(cy - hh);
        hi = hi.max(cx + hw).max(cy + hh);
    };
    match pred.layout {
        Layout::ChannelsFirst => {
            let d = pred.data;
            let (x, rest) = d[..4 * na].split_at(na);
            let (y, rest) = rest.split_at(na);
            let (w, h) = rest.split_at(na);
            for (((&cx, &cy), &w), &h) in x.iter().zip(y).zip(w).zip(h) {
                visit(cx, cy, w, h);
            }
        }
        Layout::AnchorsFirst => {
            for row in pred.data.chunks_exact(4 + pred.num_classes) {
                visit(row[0], row[1], row[2], row[3]);
            }
        }
    }
    if !finite {
        return Err(first_non_finite(pred, image));
    }
    Ok(Extent { lo: f64::from(lo), hi: f64::from(hi) })
}

/// The error naming the first non-finite value (row-major over rows, then anchors).
pub(crate) fn first_non_finite(pred: &PredView<'_>, image: usize) -> Error {
    for row in 0..4 + pred.num_classes {
        for anchor in 0..pred.num_anchors {
            let value = pred.at(row, anchor);
            if !value.is_finite() {
                return Error::NonFinite { image, anchor, row, value };
            }
        }
    }
    Error::Invalid { what: "prediction", reason: format!("image {image}: non-finite value") }
}

/// Fills `scratch.keys` with `anchor * nc + class` of every candidate, in Ultralytics' order (anchor, then
/// class), before the `max_nms` cut. Returns whether every class score was finite.
fn candidates(pred: &PredView<'_>, conf: f32, multi: bool, scratch: &mut NmsScratch) -> bool {
    let nc = pred.num_classes;
    let na = pred.num_anchors;
    scratch.keys.clear();
    let mut finite = true;
    match pred.layout {
        Layout::ChannelsFirst => {
            // Every (anchor, class) above the threshold, found with a branch-free test per chunk of a row
            // (most chunks hold none). For single-label, an anchor's best class is among its pairs above the
            // threshold whenever its maximum is, so the per-anchor argmax only needs those pairs.
            const CHUNK: usize = 32;
            for c in 0..nc {
                let row = &pred.data[(4 + c) * na..(5 + c) * na];
                for (ci, chunk) in row.chunks(CHUNK).enumerate() {
                    let (mut any, mut ok) = (false, true);
                    for &s in chunk {
                        any |= s > conf;
                        ok &= s.is_finite();
                    }
                    finite &= ok;
                    if any {
                        for (j, &s) in chunk.iter().enumerate() {
                            if s > conf {
                                scratch.keys.push((((ci * CHUNK + j) * nc + c) as u64, s));
                            }
                        }
                    }
                }
            }
            scratch.keys.sort_unstable_by_key(|k| k.0);
            if !multi {
                // Keep the first maximum of each anchor (class order), like torch's `max(1)`.
                let n = nc as u64;
                let mut w = 0;
                for r in 0..scratch.keys.len() {
                    let (key, s) = scratch.keys[r];
                    if w > 0 && scratch.keys[w - 1].0 / n == key / n {
                        if s > scratch.keys[w - 1].1 {
                            scratch.keys[w - 1] = (key, s);
                        }
                    } else {
                        scratch.keys[w] = (key, s);
                        w += 1;
                    }
                }
                scratch.keys.truncate(w);
            }
        }
        Layout::AnchorsFirst => {
            let stride = 4 + nc;
            for a in 0..na {
                let row = &pred.data[a * stride + 4..(a + 1) * stride];
                finite &= row.iter().fold(true, |ok, s| ok & s.is_finite());
                if multi {
                    for (c, &s) in row.iter().enumerate() {
                        if s > conf {
                            scratch.keys.push(((a * nc + c) as u64, s));
                        }
                    }
                } else {
                    let (mut g, mut b) = (0usize, row[0]);
                    for (c, &s) in row.iter().enumerate().skip(1) {
                        if s > b {
                            b = s;
                            g = c;
                        }
                    }
                    if b > conf {
                        scratch.keys.push(((a * nc + g) as u64, b));
                    }
                }
            }
        }
    }
    finite
}

impl PostProcess for Nms {
    type Input = PredBatch;
    type Scratch = NmsScratch;

    fn process(
        &self,
        input: &PredBatch,
        scratch: &mut NmsScratch,
        out: &mut Vec<Vec<Detection>>,
    ) -> sluice_core::Result<()> {
        Ok(self.run_batch(input, scratch, out)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(4 + nc, A)` data from per-anchor rows `[cx, cy, w, h, scores...]`.
    fn channels_first(rows: &[Vec<f32>]) -> Vec<f32> {
        let (a, r) = (rows.len(), rows[0].len());
        (0..r).flat_map(|i| (0..a).map(move |j| rows[j][i])).collect()
    }

    fn run(params: NmsParams, rows: &[Vec<f32>]) -> Result<(Vec<Detection>, Vec<usize>)> {
        let nc = rows[0].len() - 4;
        let data = channels_first(rows);
        let view = PredView::new(&data, nc, rows.len(), Layout::ChannelsFirst)?;
        let (mut out, mut idx) = (Vec::new(), Vec::new());
        Nms::new(params).run(&view, 0, &mut NmsScratch::default(), &mut out, Some(&mut idx))?;
        // The anchors-first layout gives the same answer.
        let flat: Vec<f32> = rows.concat();
        let view2 = PredView::new(&flat, nc, rows.len(), Layout::AnchorsFirst)?;
        let (mut out2, mut idx2) = (Vec::new(), Vec::new());
        Nms::new(params).run(&view2, 0, &mut NmsScratch::default(), &mut out2, Some(&mut idx2))?;
        assert_eq!((&out, &idx), (&out2, &idx2));
        Ok((out, idx))
    }

    fn rows() -> Vec<Vec<f32>> {
        vec![
            vec![50.0, 50.0, 20.0, 20.0, 0.9, 0.1],
            vec![51.0, 50.0, 20.0, 20.0, 0.8, 0.7], // overlaps anchor 0 (IoU ~0.9)
            vec![150.0, 50.0, 20.0, 20.0, 0.0005, 0.0002], // below the confidence threshold
            vec![52.0, 51.0, 20.0, 20.0, 0.2, 0.6],
        ]
    }

    #[test]
    fn without_suppression_every_row_above_conf_is_kept_in_score_order() {
        // Two overlapping boxes of one class (IoU 0.81) and one below conf: NMS keeps one, `None` keeps both.
        let rows = vec![
            vec![50.0, 50.0, 20.0, 20.0, 0.6, 0.0],
            vec![51.0, 51.0, 20.0, 20.0, 0.0, 0.9],
            vec![50.0, 50.0, 20.0, 20.0, 0.0, 0.0005],
        ];
        let p = NmsParams { multi_label: false, ..NmsParams::ultralytics_val() };
        let (kept, _) = run(NmsParams { iou_thres: 0.5, ..p }, &rows).unwrap();
        assert_eq!(kept.len(), 2, "different classes survive NMS");
        let same = vec![rows[0].clone(), vec![51.0, 51.0, 20.0, 20.0, 0.9, 0.0], rows[2].clone()];
        assert_eq!(run(NmsParams { iou_thres: 0.5, ..p }, &same).unwrap().1, vec![1]);
        let (kept, idx) = run(NmsParams { mode: NmsMode::None, iou_thres: 0.5, ..p }, &same).unwrap();
        assert_eq!(idx, vec![1, 0]);
        assert_eq!(kept.iter().map(|d| d.score).collect::<Vec<_>>(), vec![0.9, 0.6]);
        let (kept, _) = run(NmsParams { mode: NmsMode::None, max_det: 1, ..p }, &same).unwrap();
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn single_label_suppresses_within_class() {
        let p = NmsParams { multi_label: false, ..NmsParams::default() };
        let (out, idx) = run(p, &rows()).unwrap();
        // Anchor 0 (class 0, 0.9) kills anchor 1 (class 0, 0.8); anchor 3 is class 1 and survives.
        assert_eq!(idx, vec![0, 3]);
        assert_eq!(out[0].bbox, BoxXyxy::new(40.0, 40.0, 60.0, 60.0));
        assert_eq!((out[1].class, out[1].score), (1, 0.6));
    }

    #[test]
    fn single_label_takes_the_first_of_tied_best_classes() {
        let r = vec![vec![50.0, 50.0, 20.0, 20.0, 0.1, 0.6, 0.6], vec![90.0, 50.0, 20.0, 20.0, 0.0005, 0.0001, 0.0]];
        let (out, idx) = run(NmsParams { multi_label: false, ..NmsParams::default() }, &r).unwrap();
        assert_eq!((idx, out[0].class, out[0].score), (vec![0], 1, 0.6));
    }

    #[test]
    fn multi_label_and_agnostic_and_max_det() {
        let (out, idx) = run(NmsParams::default(), &rows()).unwrap();
        let got: Vec<(usize, u32)> = idx.iter().zip(&out).map(|(&a, d)| (a, d.class)).collect();
        // Class 0: 0 (0.9) kills 1 (0.8) and 3 (0.2); class 1: 1 (0.7) kills 3 (0.6) and 0 (0.1).
        assert_eq!(got, vec![(0, 0), (1, 1)]);
        let (out, _) = run(NmsParams { agnostic: true, ..NmsParams::default() }, &rows()).unwrap();
        assert_eq!(out.len(), 1);
        let (out, _) = run(NmsParams { max_det: 1, ..NmsParams::default() }, &rows()).unwrap();
        assert_eq!(out.len(), 1);
        let (out, _) = run(NmsParams { max_nms: 1, iou_thres: 0.99, ..NmsParams::default() }, &rows()).unwrap();
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn offset_mode_equals_exact_on_small_boxes() {
        for multi_label in [false, true] {
            let e = run(NmsParams { multi_label, ..NmsParams::default() }, &rows()).unwrap();
            let o = run(
                NmsParams { multi_label, mode: NmsMode::ClassOffset { max_wh: 7680.0 }, ..NmsParams::default() },
                &rows(),
            )
            .unwrap();
            assert_eq!(e.1, o.1);
        }
    }

    #[test]
    fn offset_mode_with_huge_boxes_compares_across_classes() {
        // Two boxes wider than max_wh in different classes overlap after the offset: class-offset NMS
        // suppresses one of them, exact per-class NMS keeps both.
        let r = vec![vec![5000.0, 5000.0, 9000.0, 9000.0, 0.9, 0.0], vec![5010.0, 5000.0, 9000.0, 9000.0, 0.0, 0.8]];
        let exact = run(NmsParams::default(), &r).unwrap();
        assert_eq!(exact.0.len(), 2);
        let off = run(NmsParams { mode: NmsMode::ClassOffset { max_wh: 100.0 }, ..NmsParams::default() }, &r).unwrap();
        assert_eq!(off.0.len(), 1);
    }

    #[test]
    fn nan_is_an_error_not_a_panic() {
        let mut r = rows();
        r[3][5] = f32::NAN;
        let e = run(NmsParams::default(), &r).unwrap_err();
        assert!(matches!(e, Error::NonFinite { anchor: 3, row: 5, .. }), "{e}");
        let mut r = rows();
        r[1][2] = f32::NAN;
        let e = run(NmsParams::default(), &r).unwrap_err();
        assert!(e.to_string().contains("anchor 1, row 2"), "{e}");
        assert!(PredView::new(&[0.0; 9], 1, 2, Layout::ChannelsFirst).is_err());
    }

    #[test]
    fn post_process_fills_every_image() {
        let one = channels_first(&rows());
        let batch = PredBatch {
            data: [one.clone(), one].concat(),
            batch: 2,
            num_classes: 2,
            num_anchors: 4,
            layout: Layout::ChannelsFirst,
        };
        let mut out = vec![Vec::new(); 5];
        Nms::default().process(&batch, &mut NmsScratch::default(), &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], out[1]);
        assert_eq!(out[0].len(), 2);
    }
}
