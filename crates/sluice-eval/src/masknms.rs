//! Batched NMS by overlap bitmasks: the algorithm the device runs (`sluice_kernels::masknms`, feature `cuda`) and
//! its host twin here, step for step, so that the CPU machines check what the GPU computes.
//!
//! The steps, each one kernel on the device and one function here:
//! 1. [`candidate_keys`]: one `u64` per (anchor, class) slot of an image, `desc_key(score) << 32 | slot` for a
//!    candidate (score `> conf`; single-label: the anchor's first best class only) and `u64::MAX` otherwise. The
//!    keys are distinct, so any correct sort gives one order: descending score, ties by `anchor * nc + class`,
//!    which is exactly the stable order [`Nms`](crate::Nms) and Ultralytics use.
//! 2. Gather the candidates' keys (on the device into a segment of `max_nms` rounded up to a power of two; an image
//!    with more candidates sorts all its slots instead), sort them ascending (a bitonic sort on the device) and keep
//!    the first `min(candidates, max_nms)`.
//! 3. [`suppression_boxes`]: each kept candidate's xyxy box (Ultralytics' `xywh2xyxy` in float32), the box that
//!    suppression compares (shifted by `class * max_wh` in the class-offset mode), its area and its group (its
//!    class in the exact per-class mode, one group otherwise).
//! 4. [`overlap_masks`]: bit `j` of row `i` is set when `j > i`, both are in one group and their float32 IoU,
//!    compared in float64, is `> iou_thres`: torchvision's CUDA `nms` layout, 64 candidates per word.
//! 5. [`greedy_keep`]: walk the candidates in order, keep one unless a kept one's row has marked it, OR the kept
//!    row into the removed set, stop at `max_det`. This is the sequential greedy suppression of [`Nms`](crate::Nms)
//!    with the IoUs precomputed, so it keeps the same candidates, and only the kept rows leave the device.
//!
//! Every float operation is the one [`Nms`](crate::Nms) performs, in the same order (the device code uses the
//! `__f*_rn` intrinsics so that no multiply-add is contracted), so the twin and the device keep bit-identical boxes
//! and scores. [`MaskNms::run`] chains the steps on the host; the tests hold it equal to [`Nms::run`](crate::Nms::run)
//! on the Ultralytics fixture and on random inputs with ties.

use sluice_core::{BoxXyxy, Detection};

use crate::error::{Error, Result};
use crate::nms::{NmsMode, NmsParams, PredView, begin_image, check_boxes, desc_key, first_non_finite};

/// The key of a slot that is no candidate; it sorts after every candidate's key.
pub const NO_CANDIDATE: u64 = u64::MAX;

/// Bits per mask word (the device's `sluice_kernels::masknms::WORD`; this crate's host twin builds without it).
pub const WORD: usize = 64;

/// Reusable buffers of [`MaskNms::run`].
#[derive(Debug, Default)]
pub struct MaskScratch {
    keys: Vec<u64>,
    boxes: Vec<[f32; 4]>,
    sup: Vec<[f32; 5]>,
    groups: Vec<u32>,
    masks: Vec<u64>,
    removed: Vec<u64>,
    keep: Vec<u32>,
}

/// Step 1: the key of every (anchor, class) slot of one image into `keys` (`A * nc` of them, slot order). Returns
/// whether every class score was finite.
pub fn candidate_keys(pred: &PredView<'_>, conf: f32, multi: bool, keys: &mut Vec<u64>) -> bool {
    let (nc, na) = (pred.num_classes(), pred.num_anchors());
    keys.clear();
    keys.resize(na * nc, NO_CANDIDATE);
    let mut finite = true;
    for a in 0..na {
        let slots = &mut keys[a * nc..(a + 1) * nc];
        let key = |c: usize, s: f32| (u64::from(desc_key(s)) << 32) | (a * nc + c) as u64;
        let (mut best, mut best_s) = (0usize, pred.at(4, a));
        for (c, slot) in slots.iter_mut().enumerate() {
            let s = pred.at(4 + c, a);
            finite &= s.is_finite();
            if multi {
                if s > conf {
                    *slot = key(c, s);
                }
            } else if s > best_s {
                (best, best_s) = (c, s);
            }
        }
        if !multi && best_s > conf {
            slots[best] = key(best, best_s);
        }
    }
    finite
}

/// The offset per class of the class-offset mode, if suppression uses it.
fn class_offset(p: &NmsParams) -> Option<f32> {
    match (p.agnostic, p.mode) {
        (false, NmsMode::ClassOffset { max_wh }) => Some(max_wh),
        _ => None,
    }
}

/// Whether suppression compares boxes within their class only (the exact per-class mode).
fn per_class(p: &NmsParams) -> bool {
    !p.agnostic && p.mode == NmsMode::Exact
}

/// Step 3: for the first `n` sorted keys, the detection box, the suppression box with its area, and the group.
pub fn suppression_boxes(
    pred: &PredView<'_>,
    sorted: &[u64],
    p: &NmsParams,
    boxes: &mut Vec<[f32; 4]>,
    sup: &mut Vec<[f32; 5]>,
    groups: &mut Vec<u32>,
) {
    let nc = pred.num_classes() as u64;
    let offset = class_offset(p);
    let per_class = per_class(p);
    boxes.clear();
    sup.clear();
    groups.clear();
    for &key in sorted {
        let slot = key & 0xffff_ffff;
        let (a, c) = ((slot / nc) as usize, (slot % nc) as u32);
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
        boxes.push(bbox);
        sup.push([b[0], b[1], b[2], b[3], area]);
        groups.push(if per_class { c } else { 0 });
    }
}

/// The float32 IoU of an earlier candidate `k` and a later one `b` (suppression boxes with their areas), as
/// [`Nms`](crate::Nms) computes it.
#[inline]
pub fn iou(k: &[f32; 5], b: &[f32; 5]) -> f32 {
    let w = (k[2].min(b[2]) - k[0].max(b[0])).max(0.0);
    let h = (k[3].min(b[3]) - k[1].max(b[1])).max(0.0);
    let inter = w * h;
    inter / (k[4] + b[4] - inter)
}

/// Words per mask row for `n` candidates.
pub fn words(n: usize) -> usize {
    n.div_ceil(WORD)
}

/// Step 4: the overlap masks of `n = sup.len()` candidates, `n * words(n)` words, row after row. Words left of a
/// row's own block are never read and stay zero here.
pub fn overlap_masks(sup: &[[f32; 5]], groups: &[u32], iou_thres: f64, masks: &mut Vec<u64>) {
    let n = sup.len();
    let w = words(n);
    masks.clear();
    masks.resize(n * w, 0);
    for i in 0..n {
        let row = &mut masks[i * w..(i + 1) * w];
        for j in i + 1..n {
            if groups[j] == groups[i] && f64::from(iou(&sup[i], &sup[j])) > iou_thres {
                row[j / WORD] |= 1 << (j % WORD);
            }
        }
    }
}

/// Step 5: the positions kept by greedy suppression over the masks of `n` candidates, at most `max_det`.
pub fn greedy_keep(masks: &[u64], n: usize, max_det: usize, removed: &mut Vec<u64>, keep: &mut Vec<u32>) {
    let w = words(n);
    removed.clear();
    removed.resize(w, 0);
    keep.clear();
    for i in 0..n {
        if keep.len() >= max_det {
            break;
        }
        if removed[i / WORD] >> (i % WORD) & 1 == 1 {
            continue;
        }
        keep.push(i as u32);
        let row = &masks[i * w..(i + 1) * w];
        for (r, m) in removed.iter_mut().zip(row).skip(i / WORD) {
            *r |= m;
        }
    }
}

/// NMS by the device's steps, on the host.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaskNms {
    /// The settings.
    pub params: NmsParams,
}

impl MaskNms {
    /// Mask NMS with `params`.
    pub fn new(params: NmsParams) -> Self {
        Self { params }
    }

    /// Runs the five steps on one image, with [`Nms::run`](crate::Nms::run)'s contract: the kept detections in
    /// descending score order into `out`, their anchors into `anchors` when given, any non-finite value an error
    /// naming the image, anchor and row.
    pub fn run(
        &self,
        pred: &PredView<'_>,
        image: usize,
        scratch: &mut MaskScratch,
        out: &mut Vec<Detection>,
        mut anchors: Option<&mut Vec<usize>>,
    ) -> Result<()> {
        begin_image(&self.params, out, anchors.as_deref_mut())?;
        let p = &self.params;
        let nc = pred.num_classes();
        if (pred.num_anchors() as u64).saturating_mul(nc as u64) > u64::from(u32::MAX) {
            return Err(Error::Invalid { what: "prediction", reason: "more than 2^32 (anchor, class) slots".into() });
        }
        check_boxes(pred, image)?;
        let multi = p.multi_label && nc > 1;
        let s = scratch;
        if !candidate_keys(pred, p.conf_thres as f32, multi, &mut s.keys) {
            return Err(first_non_finite(pred, image));
        }
        s.keys.retain(|&k| k != NO_CANDIDATE);
        s.keys.sort_unstable();
        let n = s.keys.len().min(p.max_nms);
        suppression_boxes(pred, &s.keys[..n], p, &mut s.boxes, &mut s.sup, &mut s.groups);
        if p.mode == NmsMode::None {
            s.keep.clear();
            s.keep.extend((0..n.min(p.max_det)).map(|i| i as u32));
        } else {
            overlap_masks(&s.sup, &s.groups, p.iou_thres, &mut s.masks);
            greedy_keep(&s.masks, n, p.max_det, &mut s.removed, &mut s.keep);
        }
        for &i in &s.keep {
            let i = i as usize;
            let slot = (s.keys[i] & 0xffff_ffff) as usize;
            let (a, c) = (slot / nc, slot % nc);
            let b = s.boxes[i];
            out.push(Detection {
                bbox: BoxXyxy::new(b[0], b[1], b[2], b[3]),
                score: pred.at(4 + c, a),
                class: c as u32,
            });
            if let Some(v) = anchors.as_deref_mut() {
                v.push(a);
            }
        }
        Ok(())
    }
}

/// The shape of a [`KeptRows::pack`]ed batch.
#[cfg(feature = "candle")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptDims {
    /// Images.
    pub batch: usize,
    /// Rows per image (`max_det`).
    pub max_det: usize,
}

#[cfg(feature = "candle")]
impl KeptDims {
    /// Values in the packed vector: the rows, the anchors, the kept counts and the non-finite flags.
    pub fn len(&self) -> usize {
        self.batch * self.max_det * 7 + 2 * self.batch
    }

    /// Whether the packed vector is empty (no images).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(feature = "candle")]
impl KeptRows {
    /// The rows, anchors, kept counts and non-finite flags packed into one flat float32 tensor on their device
    /// (the integers are below 2^24, so exact): the one copy a batch's NMS needs, which can be made asynchronously
    /// (`sluice_transfer::Readback`).
    pub fn pack(&self) -> Result<(candle_core::Tensor, KeptDims)> {
        use candle_core::{DType, Tensor};
        let (batch, max_det, _) = self.rows.dims3().map_err(Error::Candle)?;
        let flat = |t: &Tensor| t.to_dtype(DType::F32).and_then(|t| t.flatten_all());
        let parts =
            || Tensor::cat(&[flat(&self.rows)?, flat(&self.anchors)?, flat(&self.kept)?, flat(&self.non_finite)?], 0);
        Ok((parts().map_err(Error::Candle)?, KeptDims { batch, max_det }))
    }

    /// The kept detections of every image and whether its predictions were all finite, in one read (a blocking
    /// copy off the CPU: for prediction, where the boxes are wanted at once).
    pub fn read(&self) -> Result<(Vec<Vec<Detection>>, Vec<bool>)> {
        let (packed, d) = self.pack()?;
        crate::shrink::with_host_slice(&packed, |v: &[f32]| {
            let (nr, na) = (d.batch * d.max_det * 6, d.batch * d.max_det);
            let (kept, finite) = (&v[nr + na..nr + na + d.batch], &v[nr + na + d.batch..]);
            let dets = (0..d.batch)
                .map(|b| {
                    let rows = &v[b * d.max_det * 6..][..kept[b] as usize * 6];
                    rows.chunks_exact(6)
                        .map(|r| Detection {
                            bbox: BoxXyxy::new(r[0], r[1], r[2], r[3]),
                            score: r[4],
                            class: r[5] as u32,
                        })
                        .collect()
                })
                .collect();
            (dets, finite.iter().map(|&x| x == 0.0).collect())
        })
    }
}

/// Fills `dst` (except `ids` and `targets`) from a packed [`KeptRows`] read back to the host: the rows as a
/// [`crate::PredBatch`] of `max_det` anchors-first rows `x1, y1, x2, y2, score, class` per image (what
/// [`ValPost::Kept`] reads), the anchors and the finiteness flags.
#[cfg(feature = "candle")]
pub fn unpack_kept(v: &[f32], d: KeptDims, dst: &mut crate::ValBatch) -> Result<()> {
    if v.len() != d.len() {
        return Err(Error::Invalid {
            what: "packed NMS rows",
            reason: format!("{} values for {d:?} (want {})", v.len(), d.len()),
        });
    }
    let (nr, na) = (d.batch * d.max_det * 6, d.batch * d.max_det);
    dst.preds.data.clear();
    dst.preds.data.extend_from_slice(&v[..nr]);
    dst.anchor_index.clear();
    dst.anchor_index.extend(v[nr..nr + na].iter().map(|&x| x as u32));
    dst.above_conf.clear();
    dst.all_finite.clear();
    dst.all_finite.extend(v[nr + na + d.batch..].iter().map(|&x| x == 0.0));
    (dst.preds.batch, dst.preds.num_classes, dst.preds.num_anchors) = (d.batch, 2, d.max_det);
    dst.preds.layout = crate::Layout::AnchorsFirst;
    dst.kept_rows = true;
    Ok(())
}

/// The validation workers' post-process: NMS on the host, or the rows an NMS on the device kept.
#[derive(Debug, Clone, Copy)]
pub enum ValPost {
    /// NMS of the (shrunk) predictions on the worker.
    Nms(crate::Nms),
    /// The device ran NMS (`nms_tensor`): each image holds `max_det` rows `x1, y1, x2, y2, score, class`
    /// (anchors first, `num_classes` 2), the kept ones first in score order, then zeros. A kept row's score is
    /// above the NMS `conf` it ran with, so the rows past the last are those at or below `conf` here.
    Kept {
        /// The NMS confidence threshold the device used.
        conf: f32,
    },
}

impl sluice_core::PostProcess for ValPost {
    type Input = crate::PredBatch;
    type Scratch = crate::NmsScratch;

    fn process(
        &self,
        input: &crate::PredBatch,
        scratch: &mut crate::NmsScratch,
        out: &mut Vec<Vec<Detection>>,
    ) -> sluice_core::Result<()> {
        let conf = match self {
            ValPost::Nms(nms) => return nms.process(input, scratch, out),
            ValPost::Kept { conf } => *conf,
        };
        let per = 6 * input.num_anchors;
        if input.num_classes != 2
            || input.layout != crate::Layout::AnchorsFirst
            || input.data.len() != per * input.batch
        {
            return Err(Error::Invalid {
                what: "kept NMS rows",
                reason: format!(
                    "{} values, {} images, {} rows of 4 + {} (want anchors-first rows of 6)",
                    input.data.len(),
                    input.batch,
                    input.num_anchors,
                    input.num_classes
                ),
            }
            .into());
        }
        out.resize_with(input.batch, Vec::new);
        out.truncate(input.batch);
        for (dets, image) in out.iter_mut().zip(input.data.chunks_exact(per.max(1))) {
            dets.clear();
            for r in image.chunks_exact(6).take_while(|r| r[4] > conf) {
                dets.push(Detection { bbox: BoxXyxy::new(r[0], r[1], r[2], r[3]), score: r[4], class: r[5] as u32 });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host twin's word is the kernels' (the mask layout both sides share).
    #[cfg(feature = "candle")]
    #[test]
    fn the_host_twin_uses_the_kernels_mask_words() {
        assert_eq!(WORD, sluice_kernels::masknms::WORD);
        for n in [1, 63, 64, 65, 300, 30000] {
            assert_eq!(words(n), sluice_kernels::masknms::words(n));
        }
    }
    use crate::{Layout, Nms, NmsScratch};

    /// A small deterministic generator (the tests need no `rand`).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    /// `(4 + nc, A)` predictions with heavy ties: scores on a grid of 8 values, boxes on a 4 px grid drawn from a
    /// few centres, so that equal scores, equal boxes and IoUs at the threshold all occur.
    fn tied(seed: u64, nc: usize, na: usize, big: bool) -> Vec<f32> {
        let mut r = Lcg(seed);
        let mut d = vec![0f32; (4 + nc) * na];
        for a in 0..na {
            let centre = (r.next() * 6.0).floor() * 24.0 + 40.0;
            let scale = if big { 9000.0 } else { 40.0 };
            d[a] = centre + (r.next() * 4.0).floor() * 4.0;
            d[na + a] = centre + (r.next() * 4.0).floor() * 4.0;
            d[2 * na + a] = ((r.next() * 4.0).floor() + 1.0) * scale / 4.0;
            d[3 * na + a] = ((r.next() * 4.0).floor() + 1.0) * scale / 4.0;
            for c in 0..nc {
                d[(4 + c) * na + a] = (r.next() * 8.0).floor() / 8.0 * 0.9 + 0.0005;
            }
        }
        d
    }

    fn both(params: NmsParams, data: &[f32], nc: usize, na: usize, layout: Layout) {
        let view = PredView::new(data, nc, na, layout).unwrap();
        let (mut a, mut ai) = (Vec::new(), Vec::new());
        Nms::new(params).run(&view, 0, &mut NmsScratch::default(), &mut a, Some(&mut ai)).unwrap();
        let (mut b, mut bi) = (Vec::new(), Vec::new());
        MaskNms::new(params).run(&view, 0, &mut MaskScratch::default(), &mut b, Some(&mut bi)).unwrap();
        assert_eq!(ai, bi, "{params:?} nc {nc} A {na}");
        assert_eq!(a, b, "{params:?} nc {nc} A {na}");
    }

    #[test]
    fn equals_the_cpu_nms_on_random_inputs_with_ties() {
        let modes = [NmsMode::Exact, NmsMode::ClassOffset { max_wh: 7680.0 }, NmsMode::ClassOffset { max_wh: 100.0 }];
        for seed in 0..6u64 {
            for (nc, na) in [(1, 50), (3, 200), (7, 333)] {
                let big = seed % 3 == 2;
                let data = tied(seed, nc, na, big);
                for mode in modes.into_iter().chain([NmsMode::None]) {
                    for multi_label in [false, true] {
                        for agnostic in [false, true] {
                            for (iou_thres, max_det, max_nms) in [(0.7, 300, 30_000), (0.5, 7, 40), (0.0, 300, 30_000)]
                            {
                                let p = NmsParams {
                                    conf_thres: 0.2,
                                    iou_thres,
                                    max_det,
                                    max_nms,
                                    multi_label,
                                    agnostic,
                                    mode,
                                };
                                both(p, &data, nc, na, Layout::ChannelsFirst);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn equals_the_cpu_nms_at_33600_anchors() {
        // 1280 px: 33,600 anchors, 80 classes (2.7 M slots); conf 0.85 leaves a few thousand candidates.
        let (nc, na) = (80, 33_600);
        let data = tied(11, nc, na, false);
        for mode in [NmsMode::Exact, NmsMode::ClassOffset { max_wh: 7680.0 }] {
            for multi_label in [false, true] {
                let p = NmsParams { conf_thres: 0.85, multi_label, mode, max_nms: 4000, ..NmsParams::default() };
                both(p, &data, nc, na, Layout::ChannelsFirst);
            }
        }
    }

    #[test]
    fn the_keys_sort_into_the_stable_score_order() {
        let data = tied(3, 4, 64, false);
        let view = PredView::new(&data, 4, 64, Layout::ChannelsFirst).unwrap();
        let mut keys = Vec::new();
        assert!(candidate_keys(&view, 0.2, true, &mut keys));
        keys.sort_unstable();
        let n = keys.partition_point(|&k| k != NO_CANDIDATE);
        let order: Vec<(f32, u64)> = keys[..n]
            .iter()
            .map(|k| {
                let slot = k & 0xffff_ffff;
                (view.at(4 + (slot % 4) as usize, (slot / 4) as usize), slot)
            })
            .collect();
        for w in order.windows(2) {
            assert!(w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1), "{w:?}");
        }
        assert!(keys[n..].iter().all(|&k| k == NO_CANDIDATE));
    }

    #[cfg(feature = "candle")]
    #[test]
    fn the_tensor_form_holds_each_images_rows_in_either_layout() {
        use candle_core::{Device, Tensor};
        let (nc, na) = (3, 120);
        let imgs: Vec<Vec<f32>> = (0..3).map(|s| tied(20 + s, nc, na, false)).collect();
        let mut bad = imgs[2].clone();
        bad[4 * na + 7] = f32::INFINITY;
        let all = [imgs[0].clone(), imgs[1].clone(), bad].concat();
        let y = Tensor::from_vec(all.clone(), (3, 4 + nc, na), &Device::Cpu).unwrap();
        let p = NmsParams { conf_thres: 0.2, max_det: 9, ..NmsParams::ultralytics_val() };
        let k = nms_tensor(&y, crate::Layout::ChannelsFirst, &p).unwrap();
        let rows = k.rows.to_vec3::<f32>().unwrap();
        let kept = k.kept.to_vec1::<u32>().unwrap();
        assert_eq!(k.non_finite.to_vec1::<u32>().unwrap(), vec![0, 0, 1]);
        for i in 0..2 {
            let view = PredView::new(&imgs[i], nc, na, crate::Layout::ChannelsFirst).unwrap();
            let mut out = Vec::new();
            MaskNms::new(p).run(&view, i, &mut MaskScratch::default(), &mut out, None).unwrap();
            assert_eq!(kept[i] as usize, out.len());
            for (r, d) in rows[i].iter().zip(out.iter().map(Some).chain(std::iter::repeat(None))) {
                let want =
                    d.map_or([0.0; 6], |d| [d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2, d.score, d.class as f32]);
                assert_eq!(r[..], want[..]);
            }
        }
        assert_eq!(kept[2], 0);
        // Anchors first: the same rows.
        let t = y.transpose(1, 2).unwrap().contiguous().unwrap();
        let k2 = nms_tensor(&t, crate::Layout::AnchorsFirst, &p).unwrap();
        assert_eq!(k2.rows.to_vec3::<f32>().unwrap(), rows);
        assert_eq!(k2.anchors.to_vec2::<u32>().unwrap(), k.anchors.to_vec2::<u32>().unwrap());
    }

    #[test]
    fn non_finite_values_are_errors_naming_the_anchor() {
        let mut data = tied(1, 3, 10, false);
        data[5 * 10 + 4] = f32::NAN;
        let view = PredView::new(&data, 3, 10, Layout::ChannelsFirst).unwrap();
        let e = MaskNms::default().run(&view, 2, &mut MaskScratch::default(), &mut Vec::new(), None).unwrap_err();
        assert!(matches!(e, Error::NonFinite { image: 2, anchor: 4, row: 5, .. }), "{e}");
    }
}

/// The output of [`nms_tensor`], on the input's device: everything a batch's NMS leaves, for one copy to the host.
#[cfg(feature = "candle")]
#[derive(Debug, Clone)]
pub struct KeptRows {
    /// `(B, max_det, 6)` f32: `x1, y1, x2, y2, score, class` of the kept detections in score order, zeros after
    /// the last.
    pub rows: candle_core::Tensor,
    /// `(B, max_det)` u32: the anchor of each kept row (its column in the input), zeros after the last.
    pub anchors: candle_core::Tensor,
    /// `(B,)` u32: kept rows per image.
    pub kept: candle_core::Tensor,
    /// `(B,)` u32: 1 where the image has a NaN or infinite box or score (its NMS is void: the host names it).
    pub non_finite: candle_core::Tensor,
}

/// Batched NMS of a `(B, 4 + nc, A)` (channels first) or `(B, A, 4 + nc)` (anchors first) f32 tensor on its own
/// device: the kernels on a CUDA device (feature `cuda`), the host twin ([`MaskNms`]) on the CPU, with the same
/// results bit for bit. Nothing is read back: the output stays where the input is.
#[cfg(feature = "candle")]
pub fn nms_tensor(y: &candle_core::Tensor, layout: crate::Layout, p: &NmsParams) -> Result<KeptRows> {
    use candle_core::{Device, Tensor};
    let (b, r, c) = y.dims3().map_err(Error::Candle)?;
    let (nc, na) = match layout {
        crate::Layout::ChannelsFirst => (r.saturating_sub(4), c),
        crate::Layout::AnchorsFirst => (c.saturating_sub(4), r),
    };
    if p.max_det == 0 {
        return Err(Error::Invalid { what: "NMS max_det", reason: "0: batched NMS keeps at least one row".into() });
    }
    if nc == 0 || y.dtype() != candle_core::DType::F32 {
        return Err(Error::Invalid {
            what: "NMS input",
            reason: format!("{:?} {:?}: need f32 with 4 + nc rows, nc >= 1", y.dims(), y.dtype()),
        });
    }
    if (na as u64).saturating_mul(nc as u64) >= u64::from(u32::MAX) {
        return Err(Error::Invalid { what: "NMS input", reason: "more than 2^32 (anchor, class) slots".into() });
    }
    match y.device() {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => {
            let params = sluice_kernels::masknms::Params {
                nc,
                na,
                channels_first: layout == crate::Layout::ChannelsFirst,
                conf_thres: p.conf_thres as f32,
                iou_thres: p.iou_thres,
                max_nms: p.max_nms,
                max_det: p.max_det,
                multi_label: p.multi_label,
                class_offset: class_offset(p),
                per_class: per_class(p),
                suppress: p.mode != NmsMode::None,
            };
            let k = sluice_kernels::masknms::run(y, &params).map_err(Error::Candle)?;
            Ok(KeptRows { rows: k.rows, anchors: k.anchors, kept: k.kept, non_finite: k.non_finite })
        }
        Device::Cpu => {
            let data = y.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(Error::Candle)?;
            let per = (4 + nc) * na;
            let (mut rows, mut anchors) = (vec![0f32; b * p.max_det * 6], vec![0u32; b * p.max_det]);
            let (mut kept, mut bad) = (vec![0u32; b], vec![0u32; b]);
            let (mut scratch, mut out, mut idx) = (MaskScratch::default(), Vec::new(), Vec::new());
            for i in 0..b {
                let view = PredView::new(&data[i * per..(i + 1) * per], nc, na, layout)?;
                match MaskNms::new(*p).run(&view, i, &mut scratch, &mut out, Some(&mut idx)) {
                    Ok(()) => {}
                    Err(Error::NonFinite { .. }) => {
                        bad[i] = 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
                kept[i] = out.len() as u32;
                for (k, (d, &a)) in out.iter().zip(&idx).enumerate() {
                    let o = &mut rows[(i * p.max_det + k) * 6..][..6];
                    o.copy_from_slice(&[d.bbox.x1, d.bbox.y1, d.bbox.x2, d.bbox.y2, d.score, d.class as f32]);
                    anchors[i * p.max_det + k] = a as u32;
                }
            }
            let cpu = &Device::Cpu;
            let tensors = || -> candle_core::Result<KeptRows> {
                Ok(KeptRows {
                    rows: Tensor::from_vec(rows, (b, p.max_det, 6), cpu)?,
                    anchors: Tensor::from_vec(anchors, (b, p.max_det), cpu)?,
                    kept: Tensor::from_vec(kept, b, cpu)?,
                    non_finite: Tensor::from_vec(bad, b, cpu)?,
                })
            };
            tensors().map_err(Error::Candle)
        }
        d => Err(Error::Invalid {
            what: "NMS device",
            reason: format!("{d:?}: batched NMS runs on the CPU, or on CUDA in a build with the `cuda` feature"),
        }),
    }
}
