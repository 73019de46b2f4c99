//! The same assigner and loss as [`super::assigner`] / [`super::DetectionLoss::compute`], written as tensor ops on
//! the padded per-image targets table (`(B, M)` classes, `(B, M, 4)` pixel boxes, `(B, M)` mask), so that on a GPU
//! nothing leaves the device: no copy of the scores and boxes to the host, no per-image loop, and the loss items
//! stay a `(3,)` tensor until the caller reads them.
//!
//! Differences from the host path, by construction:
//! - Top-k per GT is taken level by level (each at most 6400 anchors at 640, under candle's CUDA argsort limit of
//!   8192 columns) and the per-level winners are merged: the same set as a top-k over all anchors.
//! - Ties: the host breaks equal metrics by the lower anchor index. candle's CPU argsort is stable, so the CPU
//!   twin does the same; its CUDA argsort (bitonic) does not promise an order among exactly equal metrics, as
//!   PyTorch's `topk` on a GPU does not either.
//! - The box and DFL losses run over every anchor with the target-score weight (0 off the foreground) instead of
//!   over the gathered foreground anchors: the same sums in another order.
//!
//! The tests run it on the CPU against the host assigner and loss.

use candle_core::{DType, Device, Tensor};
use sluice_core::Target;

use super::assigner::AssignerConfig;
use super::bbox::{ciou, ciou_parts};
use crate::config::REG_MAX;
use crate::error::{ModelError, Result};
use crate::ops;

/// The assigner's result as tensors on the predictions' device.
#[derive(Debug, Clone)]
pub struct DenseAssignment {
    /// `(B, A)`: 1 for a foreground anchor, else 0 (predictions' dtype).
    pub fg: Tensor,
    /// `(B, A)` u32: the assigned GT's index in its image's rows (0 off the foreground, as Ultralytics).
    pub gt_idx: Tensor,
    /// `(B, A)` u32: the assigned class (the class of GT row 0 off the foreground).
    pub label: Tensor,
    /// `(B, A)`: the target score (0 off the foreground).
    pub score: Tensor,
    /// `(B, A, 4)`: the assigned GT box in input pixels.
    pub bbox: Tensor,
}

/// The padded targets of a batch, on the predictions' device.
#[derive(Debug, Clone, Copy)]
pub struct DenseTargets<'a> {
    /// `(B, M)` class indices as floats.
    pub classes: &'a Tensor,
    /// `(B, M, 4)` `x1 y1 x2 y2` in input pixels.
    pub boxes: &'a Tensor,
    /// `(B, M)` 1 for a real row, 0 for padding.
    pub mask: &'a Tensor,
}

fn parts(t: &Tensor, dim: usize) -> Result<[Tensor; 4]> {
    Ok([t.narrow(dim, 0, 1)?, t.narrow(dim, 1, 1)?, t.narrow(dim, 2, 1)?, t.narrow(dim, 3, 1)?])
}

/// A `(.., k)` 0/1 mask of the `k` largest values along the last dim of `metric` `(B, M, A)`, level by level (see
/// the module docs). `levels` are the anchor counts per level, summing to `A`.
fn topk_mask(metric: &Tensor, k: usize, levels: &[usize]) -> Result<Tensor> {
    let (b, m, a) = metric.dims3()?;
    let rows = metric.reshape((b * m, a))?;
    let (mut idx, mut val) = (Vec::new(), Vec::new());
    let mut start = 0usize;
    for &len in levels {
        let kk = k.min(len);
        if kk == 0 {
            start += len;
            continue;
        }
        let level = rows.narrow(1, start, len)?.contiguous()?;
        let top = level.arg_sort_last_dim(false)?.narrow(1, 0, kk)?.contiguous()?;
        val.push(level.gather(&top, 1)?);
        idx.push(top.affine(1.0, start as f64)?);
        start += len;
    }
    let mask = Tensor::zeros((b * m, a), metric.dtype(), metric.device())?;
    if idx.is_empty() {
        return Ok(mask.reshape((b, m, a))?);
    }
    let (idx, val) = (Tensor::cat(&idx, 1)?, Tensor::cat(&val, 1)?.contiguous()?);
    let kk = k.min(val.dim(1)?);
    let best = val.arg_sort_last_dim(false)?.narrow(1, 0, kk)?.contiguous()?;
    let chosen = idx.gather(&best, 1)?.contiguous()?;
    let ones = Tensor::ones((b * m, kk), metric.dtype(), metric.device())?;
    Ok(mask.scatter_add(&chosen, &ones, 1)?.reshape((b, m, a))?)
}

/// The task-aligned assigner on tensors. `scores` `(B, nc, A)` are probabilities, `pred_px` `(B, 4, A)` boxes in
/// input pixels, `anchors_px` `(A, 2)` anchor centres in input pixels (all detached), `levels` the anchors per
/// level.
pub fn assign_dense(
    cfg: &AssignerConfig,
    scores: &Tensor,
    pred_px: &Tensor,
    anchors_px: &Tensor,
    gt: DenseTargets<'_>,
    levels: &[usize],
) -> Result<DenseAssignment> {
    let (b, nc, a) = scores.dims3()?;
    let m = gt.classes.dim(1)?;
    let dt = scores.dtype();
    let dev = scores.device();
    let mask_gt = gt.mask.to_dtype(dt)?.unsqueeze(2)?; // (B, M, 1)
    let g = parts(&gt.boxes.to_dtype(dt)?, 2)?; // 4 × (B, M, 1)
    // Candidates: anchor centres strictly inside the GT widened to `min_side`.
    let cx = ((&g[0] + &g[2])? * 0.5)?;
    let cy = ((&g[1] + &g[3])? * 0.5)?;
    let hw = ((&g[2] - &g[0])?.maximum(cfg.min_side)? * 0.5)?;
    let hh = ((&g[3] - &g[1])?.maximum(cfg.min_side)? * 0.5)?;
    let (x1, y1, x2, y2) = ((&cx - &hw)?, (&cy - &hh)?, (&cx + &hw)?, (&cy + &hh)?);
    let anc = anchors_px.to_dtype(dt)?.t()?.unsqueeze(0)?; // (1, 2, A)
    let (ax, ay) = (anc.narrow(1, 0, 1)?, anc.narrow(1, 1, 1)?); // (1, 1, A)
    let d = ax
        .broadcast_sub(&x1)?
        .minimum(&ay.broadcast_sub(&y1)?)?
        .minimum(&x2.broadcast_sub(&ax)?)?
        .minimum(&y2.broadcast_sub(&ay)?)?; // (B, M, A)
    let cand = d.gt(cfg.eps)?.to_dtype(dt)?.broadcast_mul(&mask_gt)?;
    // Overlaps and alignment metric.
    let cls = gt.classes.to_dtype(DType::F32)?.clamp(0.0, (nc.max(1) - 1) as f64)?.to_dtype(DType::U32)?;
    let s = scores.gather(&cls.unsqueeze(2)?.broadcast_as((b, m, a))?.contiguous()?, 1)?; // (B, M, A)
    let ciou = if cfg.fused_ciou && dt == DType::F32 {
        sluice_kernels::iou::ciou_pairs(&gt.boxes.to_dtype(dt)?, pred_px)?
    } else {
        ciou_parts(&g, &parts(pred_px, 1)?)? // 4 × (B, 1, A) against 4 × (B, M, 1)
    };
    let ov = ciou.maximum(0.0)?.mul(&cand)?;
    let metric = (s.powf(cfg.alpha)? * ov.powf(cfg.beta)?)?.mul(&cand)?;
    // Top-k per GT among all anchors, kept where a candidate.
    let pos = topk_mask(&metric, cfg.topk.min(a), levels)?.mul(&cand)?;
    // One GT per anchor: where several claim it, the one with the largest overlap (first on ties).
    let count = pos.sum_keepdim(1)?; // (B, 1, A)
    let best = ov.argmax_keepdim(1)?; // (B, 1, A) u32
    let rows = Tensor::arange(0u32, m as u32, dev)?.reshape((1, m, 1))?;
    let onehot = rows.broadcast_eq(&best)?.to_dtype(dt)?; // (B, M, A)
    let pos = count.gt(1.0)?.broadcast_as((b, m, a))?.contiguous()?.where_cond(&onehot, &pos)?;
    // Normalised alignment.
    let am = (&metric * &pos)?;
    let pos_align = am.max_keepdim(2)?; // (B, M, 1)
    let pos_ov = (&ov * &pos)?.max_keepdim(2)?;
    let norm = am.broadcast_mul(&pos_ov.broadcast_div(&pos_align.affine(1.0, cfg.eps)?)?)?;
    let score = norm.max(1)?; // (B, A)
    let fg = pos.max(1)?;
    let gt_idx = pos.argmax(1)?; // (B, A): the single positive row, or 0
    let label = cls.gather(&gt_idx, 1)?;
    let boxes = gt.boxes.to_dtype(dt)?;
    let bbox = boxes.gather(&gt_idx.unsqueeze(2)?.broadcast_as((b, a, 4))?.contiguous()?, 1)?;
    Ok(DenseAssignment { fg, gt_idx, label, score, bbox })
}

/// What `dense_loss` returns.
#[derive(Debug, Clone)]
pub struct DenseLoss {
    /// What to call `backward` on: `(box + cls + dfl) · batch size`, a scalar.
    pub total: Tensor,
    /// `(3,)` f32: box, cls, dfl after the gains (Ultralytics' `loss_items`), still on the device.
    pub items: Tensor,
    /// The assignment.
    pub assignment: DenseAssignment,
}

/// The padded per-image table of `targets` (boxes in input pixels) that [`DenseTargets`] borrows, for a batch of
/// `images` images, built on the host: `(B, M)` classes as floats, `(B, M, 4)` boxes, `(B, M)` mask, with `M` the
/// most boxes of one image (at least 1) and each image's rows in the order of `targets`. A target of an image
/// outside the batch is an error naming it.
pub fn padded_targets(targets: &[Target], images: usize, device: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    if let Some(t) = targets.iter().find(|t| t.image as usize >= images) {
        return Err(ModelError::BadInput(format!("a target of image {} in a batch of {images} images", t.image)));
    }
    let m = (0..images).map(|i| targets.iter().filter(|t| t.image as usize == i).count()).max().unwrap_or(0).max(1);
    let (mut c, mut bx, mut k, mut fill) =
        (vec![0f32; images * m], vec![0f32; images * m * 4], vec![0f32; images * m], vec![0; images]);
    for t in targets {
        let r = t.image as usize * m + fill[t.image as usize];
        fill[t.image as usize] += 1;
        c[r] = t.class as f32;
        bx[r * 4..r * 4 + 4].copy_from_slice(&[t.bbox.x1, t.bbox.y1, t.bbox.x2, t.bbox.y2]);
        k[r] = 1.0;
    }
    Ok((
        Tensor::from_vec(c, (images, m), device)?,
        Tensor::from_vec(bx, (images, m, 4), device)?,
        Tensor::from_vec(k, (images, m), device)?,
    ))
}

/// What the dense loss is computed with: the assigner's parameters, the gains and whether the class loss's sum
/// runs in one kernel ([`super::DetectionLoss::fused_bce`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DenseConfig<'a> {
    pub(crate) assigner: &'a AssignerConfig,
    pub(crate) gains: &'a super::LossGains,
    pub(crate) fused_bce: bool,
}

/// The loss terms from the head's tensors: `bins` the softmax parts of the `(B, 4, 16, A)` DFL logits (the same
/// parts decoded `pred_xyxy`), `raw_scores` `(B, nc, A)` class
/// logits, `pred_xyxy` `(B, 4, A)` decoded boxes in grid units, `anchors` `(A, 2)` grid units, `strides` `(A, 1)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dense_loss(
    DenseConfig { assigner: cfg, gains, fused_bce }: DenseConfig<'_>,
    bins: &ops::SoftmaxParts,
    raw_scores: &Tensor,
    pred_xyxy: &Tensor,
    anchors: &Tensor,
    strides: &Tensor,
    levels: &[usize],
    gt: DenseTargets<'_>,
) -> Result<DenseLoss> {
    let (b, _, a) = raw_scores.dims3()?;
    let stride_row = strides.t()?.unsqueeze(0)?; // (1, 1, A)
    let pred_px = pred_xyxy.detach().broadcast_mul(&stride_row)?;
    let anchors_px = anchors.broadcast_mul(strides)?;
    let probs = ops::sigmoid(&raw_scores.detach())?;
    let asg = assign_dense(cfg, &probs, &pred_px, &anchors_px, gt, levels)?;
    let weight = (&asg.score * &asg.fg)?; // (B, A)
    let tss = weight.sum_all()?.maximum(1.0)?;

    // Class loss: against the one-hot of the label times the target score.
    let cls = if fused_bce && raw_scores.dtype() == DType::F32 {
        sluice_kernels::loss::bce_with_logits_sum_one_hot_kernel(raw_scores, &asg.label, &weight, &probs)?
    } else {
        ops::bce_with_logits_sum_one_hot(raw_scores, &asg.label, &weight, &probs)?
    }
    .broadcast_div(&tss)?;

    // Box loss over every anchor, weighted (0 off the foreground).
    let w = weight.flatten_all()?; // (B·A)
    let pbox = pred_xyxy.permute((0, 2, 1))?.reshape((b * a, 4))?;
    let srow = strides.reshape((1, a, 1))?;
    let tbox = asg.bbox.broadcast_div(&srow)?.reshape((b * a, 4))?; // grid units
    let iou = ciou(&pbox, &tbox)?;
    let box_loss = (iou.affine(-1.0, 1.0)? * &w)?.sum_all()?.broadcast_div(&tss)?;

    // DFL: distances of the target box from the anchor, split between the two neighbouring bins.
    let anc = anchors.reshape((1, a, 2))?.broadcast_as((b, a, 2))?.reshape((b * a, 2))?;
    let t = parts(&tbox, 1)?;
    let (ax, ay) = (anc.narrow(1, 0, 1)?, anc.narrow(1, 1, 1)?);
    let dist = Tensor::cat(&[(&ax - &t[0])?, (&ay - &t[1])?, (&t[2] - &ax)?, (&t[3] - &ay)?], 1)?
        .clamp(0.0, REG_MAX as f64 - 1.0 - 0.01)?; // (B·A, 4)
    // The bins in the head's own layout, (B, 4, 16, A), where (B·A, 4, 16) would copy the logits.
    let dist = dist.reshape((b, a, 4))?.permute((0, 2, 1))?.contiguous()?; // (B, 4, A)
    let left = dist.floor()?;
    let wl = (left.affine(1.0, 1.0)? - &dist)?;
    let wr = wl.affine(-1.0, 1.0)?;
    let tl = left.to_dtype(DType::U32)?.unsqueeze(2)?;
    let tr = left.affine(1.0, 1.0)?.to_dtype(DType::U32)?.unsqueeze(2)?;
    let ce = bins.nll_at(&[&tl, &tr])?; // (B, 4, 1, A) each
    let per_anchor = ((ce[0].squeeze(2)? * wl)? + (ce[1].squeeze(2)? * wr)?)?.mean(1)?.flatten_all()?; // (B·A)
    let dfl_loss = (per_anchor * &w)?.sum_all()?.broadcast_div(&tss)?;

    let box_loss = (box_loss * gains.box_gain)?;
    let cls = (cls * gains.cls)?;
    let dfl_loss = (dfl_loss * gains.dfl)?;
    let items = Tensor::stack(&[&box_loss, &cls, &dfl_loss], 0)?.detach().to_dtype(DType::F32)?;
    let total = (((box_loss + cls)? + dfl_loss)? * b as f64)?;
    Ok(DenseLoss { total, items, assignment: asg })
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};
    use rand::Rng;
    use sluice_core::{BoxXyxy, Target};

    use crate::head::RawHead;
    use crate::loss::{DenseTargets, DetectionLoss};

    /// A random head on a 128-px canvas (grids 16², 8², 4²), random targets with overlapping boxes (so anchors
    /// are claimed by several GTs), and an image without targets.
    fn case(seed: u64) -> (RawHead, Vec<Target>, usize) {
        let mut rng = sluice_core::sample_rng(seed, 0, 0);
        let (b, nc) = (3usize, 5usize);
        let grids = [(16, 16), (8, 8), (4, 4)];
        let a: usize = grids.iter().map(|(h, w)| h * w).sum();
        let mut rand_t = |shape: (usize, usize, usize), lo: f32, hi: f32| {
            let v: Vec<f32> = (0..shape.0 * shape.1 * shape.2).map(|_| rng.random_range(lo..hi)).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).expect("tensor")
        };
        let boxes = rand_t((b, 64, a), -3.0, 3.0);
        let scores = rand_t((b, nc, a), -4.0, 2.0);
        let mut targets = Vec::new();
        for image in 0..b as u32 - 1 {
            for _ in 0..rng.random_range(1..7) {
                let (x, y) = (rng.random_range(0.0..90.0f32), rng.random_range(0.0..90.0f32));
                let (w, h) = (rng.random_range(4.0..60.0f32), rng.random_range(4.0..60.0f32));
                let bbox = BoxXyxy::new(x, y, (x + w).min(128.0), (y + h).min(128.0));
                targets.push(Target { image, class: rng.random_range(0..nc as u32), bbox });
            }
        }
        (RawHead { boxes, scores, grids, one2one: None }, targets, nc)
    }

    #[test]
    fn the_padded_table_holds_each_images_rows_in_order_and_names_a_stray_target() {
        let t = |image: u32, class: u32, x: f32| Target { image, class, bbox: BoxXyxy::new(x, 1.0, x + 2.0, 3.0) };
        let targets = [t(1, 4, 0.0), t(0, 2, 5.0), t(1, 7, 9.0)];
        let (c, b, k) = super::padded_targets(&targets, 3, &Device::Cpu).expect("table");
        assert_eq!(c.to_vec2::<f32>().expect("c"), [[2.0, 0.0], [4.0, 7.0], [0.0, 0.0]]);
        assert_eq!(k.to_vec2::<f32>().expect("k"), [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]]);
        assert_eq!(b.to_vec3::<f32>().expect("b")[1][1], [9.0, 1.0, 11.0, 3.0]);
        let e = super::padded_targets(&targets, 1, &Device::Cpu).expect_err("image 1 of 1");
        assert!(e.to_string().contains("image 1 in a batch of 1"), "{e}");
    }

    #[test]
    fn the_dense_assigner_and_loss_equal_the_host_ones_on_random_batches() {
        let mut multi = 0usize;
        for seed in 0..6 {
            let (raw, targets, nc) = case(seed);
            let loss = DetectionLoss::new(nc);
            let host = loss.compute(&raw, &targets).expect("host loss");
            let (c, b, k) = super::padded_targets(&targets, 3, &Device::Cpu).expect("table");
            let dense = loss.compute_dense(&raw, DenseTargets { classes: &c, boxes: &b, mask: &k }).expect("dense");
            let d = &dense.assignment;
            let fg: Vec<f32> = d.fg.flatten_all().and_then(|t| t.to_vec1()).expect("fg");
            let idx: Vec<u32> = d.gt_idx.flatten_all().and_then(|t| t.to_vec1()).expect("idx");
            let score: Vec<f32> = d.score.flatten_all().and_then(|t| t.to_vec1()).expect("score");
            let bbox: Vec<f32> = d.bbox.flatten_all().and_then(|t| t.to_vec1()).expect("bbox");
            let h = &host.assignment;
            for o in 0..fg.len() {
                assert_eq!(fg[o] == 1.0, h.fg[o], "seed {seed}: fg at {o}");
                if h.fg[o] {
                    assert_eq!(idx[o] as usize, h.gt_idx[o], "seed {seed}: gt at {o}");
                    assert!((score[o] - h.score[o]).abs() <= 1e-5, "seed {seed}: score at {o}");
                    assert_eq!(&bbox[o * 4..o * 4 + 4], &h.bbox[o], "seed {seed}: box at {o}");
                }
            }
            let items: Vec<f32> = dense.items.to_dtype(DType::F32).and_then(|t| t.to_vec1()).expect("items");
            for (kk, (&got, &want)) in items.iter().zip(&host.items).enumerate() {
                let rel = (f64::from(got) - want).abs() / want.abs().max(1e-9);
                assert!(rel <= 1e-5, "seed {seed}: item {kk}: {got} vs {want}");
            }
            // The opt-in one-kernel overlaps (`fused_ciou`): the same assignment and loss, to the bit.
            let mut fused = DetectionLoss::new(nc);
            fused.assigner.fused_ciou = true;
            let f = fused.compute_dense(&raw, DenseTargets { classes: &c, boxes: &b, mask: &k }).expect("fused");
            let bits = |t: &Tensor| -> Vec<u32> {
                let v: Vec<f32> = t.to_dtype(DType::F32).and_then(|t| t.flatten_all()?.to_vec1()).expect("values");
                v.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(bits(&f.items), bits(&dense.items), "seed {seed}: items with fused_ciou");
            assert_eq!(bits(&f.assignment.score), bits(&d.score), "seed {seed}: scores with fused_ciou");
            assert_eq!(bits(&f.assignment.fg), bits(&d.fg), "seed {seed}: foreground with fused_ciou");
            // The opt-in one-kernel class sum (`fused_bce`): the same sum in another order.
            let mut one = DetectionLoss::new(nc);
            one.fused_bce = true;
            let o = one.compute_dense(&raw, DenseTargets { classes: &c, boxes: &b, mask: &k }).expect("fused bce");
            let (oi, di): (Vec<f32>, Vec<f32>) =
                (o.items.to_vec1().expect("items"), dense.items.to_vec1().expect("items"));
            assert_eq!((oi[0], oi[2]), (di[0], di[2]), "seed {seed}: box and dfl with fused_bce");
            assert!((oi[1] - di[1]).abs() <= 1e-5 * di[1].abs(), "seed {seed}: cls {} against {}", oi[1], di[1]);
            // The case must exercise the one-GT-per-anchor rule: count GTs whose candidate sets overlap.
            multi += targets.windows(2).filter(|w| w[0].image == w[1].image).count();
        }
        assert!(multi > 0);
    }
}
