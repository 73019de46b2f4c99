//! Non-maximum suppression of YOLO head outputs, matched to Ultralytics' `non_max_suppression` (8.4) and
//! torchvision's CPU `nms` kernel operation for operation: confidence filter (strict `>` in float32), single- or
//! multi-label candidates, top `max_nms` by score, greedy suppression in stable descending score order with
//! float32 IoU compared `> iou_thres` in float64, at most `max_det` kept.
//!
//! Two per-class modes: [`NmsMode::Exact`] runs each class on its own boxes (what `torchvision.ops.batched_nms`
//! does on the CPU for large inputs), [`NmsMode::ClassOffset`] reproduces Ultralytics' trick of shifting every
//! box by `class * max_wh` in float32 before one class-blind NMS, including the IoU roundings that shift causes.
//! Unlike Ultralytics there is no time limit: every image is processed completely. NaN or infinite inputs are
//! an error, never a panic.
//!
//! Speed: each candidate is compared only with the boxes already kept in its own class (exactly equivalent to
//! the suppression loop), and processing stops once `max_det` boxes are kept (the output is in score order).

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
    fn at(&self, row: usize, anchor: usize) -> f32 {
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

/// One candidate: box in original and in suppression coordinates, score, class, anchor.
#[derive(Debug, Clone, Copy)]
struct Cand {
    bbox: [f32; 4],
    score: f32,
    class: u32,
    anchor: u32,
}

/// Reusable buffers of [`Nms::run`]; keep one per worker thread to avoid allocating per image.
#[derive(Debug, Default)]
pub struct NmsScratch {
    best: Vec<f32>,
    arg: Vec<u32>,
    keys: Vec<u64>,
    cands: Vec<Cand>,
    order: Vec<u32>,
    kept: Vec<Vec<[f32; 5]>>,
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
    /// score order, to `out` and, when given, the anchor index of each to `anchors`.
    pub fn run(
        &self,
        pred: &PredView<'_>,
        image: usize,
        scratch: &mut NmsScratch,
        out: &mut Vec<Detection>,
        mut anchors: Option<&mut Vec<usize>>,
    ) -> Result<()> {
        out.clear();
        if let Some(a) = anchors.as_deref_mut() {
            a.clear();
        }
        let p = &self.params;
        if !(p.iou_thres.is_finite() && p.conf_thres.is_finite()) {
            return Err(Error::Invalid { what: "NMS thresholds", reason: format!("{p:?}") });
        }
        let nc = pred.num_classes;
        let na = pred.num_anchors;
        let conf = p.conf_thres as f32;
        self.check_scores(pred, image)?;
        self.candidates(pred, conf, scratch);
        // Boxes of candidates must be finite.
        scratch.cands.clear();
        for &key in &scratch.keys {
            let (anchor, class) = ((key / nc as u64) as usize, (key % nc as u64) as usize);
            let mut b = [0f32; 4];
            for (r, v) in b.iter_mut().enumerate() {
                *v = pred.at(r, anchor);
                if !v.is_finite() {
                    return Err(Error::NonFinite { image, anchor, row: r, value: *v });
                }
            }
            // Ultralytics' xywh2xyxy: xy -+ wh / 2 in float32.
            let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
            scratch.cands.push(Cand {
                bbox: [b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh],
                score: pred.at(4 + class, anchor),
                class: class as u32,
                anchor: anchor as u32,
            });
        }
        debug_assert!(na <= u32::MAX as usize);
        // Stable descending score order (torch's stable sort; -0.0 and 0.0 are equal there).
        let cands = &scratch.cands;
        scratch.order.clear();
        scratch.order.extend(0..cands.len() as u32);
        scratch.order.sort_by(|&i, &j| (cands[j as usize].score + 0.0).total_cmp(&(cands[i as usize].score + 0.0)));
        scratch.order.truncate(p.max_nms);
        self.suppress(scratch, nc, out, anchors);
        Ok(())
    }

    fn check_scores(&self, pred: &PredView<'_>, image: usize) -> Result<()> {
        let nc = pred.num_classes;
        let na = pred.num_anchors;
        let bad = |row: usize, anchor: usize, value: f32| Error::NonFinite { image, anchor, row, value };
        match pred.layout {
            Layout::ChannelsFirst => {
                let scores = &pred.data[4 * na..];
                if scores.iter().any(|v| !v.is_finite()) {
                    let i = scores.iter().position(|v| !v.is_finite()).unwrap_or(0);
                    return Err(bad(4 + i / na, i % na, scores[i]));
                }
            }
            Layout::AnchorsFirst => {
                for a in 0..na {
                    for r in 4..4 + nc {
                        let v = pred.at(r, a);
                        if !v.is_finite() {
                            return Err(bad(r, a, v));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Fills `scratch.keys` with `anchor * nc + class` of every candidate, in Ultralytics' order (anchor, then
    /// class), before the `max_nms` cut.
    fn candidates(&self, pred: &PredView<'_>, conf: f32, scratch: &mut NmsScratch) {
        let nc = pred.num_classes;
        let na = pred.num_anchors;
        scratch.keys.clear();
        let multi = self.params.multi_label && nc > 1;
        match (pred.layout, multi) {
            (Layout::ChannelsFirst, true) => {
                for c in 0..nc {
                    let row = &pred.data[(4 + c) * na..(5 + c) * na];
                    for (a, &s) in row.iter().enumerate() {
                        if s > conf {
                            scratch.keys.push((a * nc + c) as u64);
                        }
                    }
                }
                scratch.keys.sort_unstable();
            }
            (Layout::ChannelsFirst, false) => {
                // Row-wise running max keeps memory access sequential; strict `>` keeps the first maximum.
                scratch.best.clear();
                scratch.best.extend_from_slice(&pred.data[4 * na..5 * na]);
                scratch.arg.clear();
                scratch.arg.resize(na, 0);
                for c in 1..nc {
                    let row = &pred.data[(4 + c) * na..(5 + c) * na];
                    for ((b, g), &s) in scratch.best.iter_mut().zip(scratch.arg.iter_mut()).zip(row) {
                        if s > *b {
                            *b = s;
                            *g = c as u32;
                        }
                    }
                }
                for (a, (&b, &g)) in scratch.best.iter().zip(&scratch.arg).enumerate() {
                    if b > conf {
                        scratch.keys.push((a * nc) as u64 + u64::from(g));
                    }
                }
            }
            (Layout::AnchorsFirst, _) => {
                let stride = 4 + nc;
                for a in 0..na {
                    let row = &pred.data[a * stride + 4..(a + 1) * stride];
                    if multi {
                        for (c, &s) in row.iter().enumerate() {
                            if s > conf {
                                scratch.keys.push((a * nc + c) as u64);
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
                            scratch.keys.push((a * nc + g) as u64);
                        }
                    }
                }
            }
        }
    }

    /// Greedy suppression over `scratch.order`.
    fn suppress(
        &self,
        scratch: &mut NmsScratch,
        nc: usize,
        out: &mut Vec<Detection>,
        anchors: Option<&mut Vec<usize>>,
    ) {
        let p = &self.params;
        let cands = &scratch.cands;
        let order = &scratch.order;
        // Suppression coordinates and grouping.
        let offset = match (p.agnostic, p.mode) {
            (false, NmsMode::ClassOffset { max_wh }) => Some(max_wh),
            _ => None,
        };
        // With the class offset, boxes of different classes can only interact when the candidates span at
        // least `max_wh` pixels; otherwise comparing within the class is exact, else compare with every kept box.
        let per_class = if p.agnostic {
            false
        } else if let Some(w) = offset {
            let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
            for &i in order {
                let b = &cands[i as usize].bbox;
                lo = lo.min(f64::from(b[0])).min(f64::from(b[1]));
                hi = hi.max(f64::from(b[2])).max(f64::from(b[3]));
            }
            hi - lo < f64::from(w)
        } else {
            true
        };
        let groups = if per_class { nc } else { 1 };
        if scratch.kept.len() < groups {
            scratch.kept.resize_with(groups, Vec::new);
        }
        for k in &mut scratch.kept[..groups] {
            k.clear();
        }
        let thr = p.iou_thres;
        let mut anchors = anchors;
        for &i in order {
            if out.len() >= p.max_det {
                break;
            }
            let c = &cands[i as usize];
            let mut b = c.bbox;
            if let Some(w) = offset {
                let off = c.class as f32 * w;
                for v in &mut b {
                    *v += off;
                }
            }
            let area = (b[2] - b[0]) * (b[3] - b[1]);
            let g = if per_class { c.class as usize } else { 0 };
            let suppressed = scratch.kept[g].iter().any(|k| {
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
            out.push(Detection {
                bbox: BoxXyxy::new(c.bbox[0], c.bbox[1], c.bbox[2], c.bbox[3]),
                score: c.score,
                class: c.class,
            });
            if let Some(a) = anchors.as_deref_mut() {
                a.push(c.anchor as usize);
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

impl PostProcess for Nms {
    type Input = PredBatch;

    fn process(&self, input: &PredBatch, out: &mut Vec<Vec<Detection>>) -> sluice_core::Result<()> {
        let mut scratch = NmsScratch::default();
        Ok(self.run_batch(input, &mut scratch, out)?)
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
    fn single_label_suppresses_within_class() {
        let p = NmsParams { multi_label: false, ..NmsParams::default() };
        let (out, idx) = run(p, &rows()).unwrap();
        // Anchor 0 (class 0, 0.9) kills anchor 1 (class 0, 0.8); anchor 3 is class 1 and survives.
        assert_eq!(idx, vec![0, 3]);
        assert_eq!(out[0].bbox, BoxXyxy::new(40.0, 40.0, 60.0, 60.0));
        assert_eq!((out[1].class, out[1].score), (1, 0.6));
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
        Nms::default().process(&batch, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], out[1]);
        assert_eq!(out[0].len(), 2);
    }
}
