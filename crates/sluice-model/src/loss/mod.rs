//! Ultralytics' `v8DetectionLoss`: BCE-with-logits class loss normalised by the target-score sum, CIoU box loss
//! and DFL loss weighted by the target scores, gains box 7.5 / cls 0.5 / dfl 1.5, times the batch size.
//! [`DetectionLoss::compute`] reads sluice-core's per-batch [`Target`] table on the host and runs the assigner
//! there, from one copy of the detached predictions per batch (the CPU path). [`DetectionLoss::compute_dense`]
//! does the same in tensor ops on the padded targets table ([`dense`]), so on a GPU nothing leaves the device.

pub mod assigner;
pub mod bbox;
pub mod dense;

use candle_core::{DType, Tensor};
use sluice_core::Target;

use crate::config::REG_MAX;
use crate::error::{ModelError, Result};
use crate::head::{RawHead, dist2bbox_xyxy, make_anchors};
use crate::ops;
pub use assigner::{AssignerConfig, Assignment, GtBox};
pub use dense::{DenseAssignment, DenseLoss, DenseTargets, padded_targets};

/// Loss gains (Ultralytics hyper-parameters `box`, `cls`, `dfl`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossGains {
    /// CIoU box loss gain.
    pub box_gain: f64,
    /// Class loss gain.
    pub cls: f64,
    /// DFL loss gain.
    pub dfl: f64,
}

impl Default for LossGains {
    fn default() -> Self {
        Self { box_gain: 7.5, cls: 0.5, dfl: 1.5 }
    }
}

/// The v8 detection loss.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectionLoss {
    /// Number of classes.
    pub nc: usize,
    /// Gains.
    pub gains: LossGains,
    /// Assigner parameters.
    pub assigner: AssignerConfig,
    /// The one-to-many weight of an end-to-end model's loss (the one-to-one head gets `1 − w`); see
    /// [`DetectionLoss::set_epoch`].
    pub o2m_weight: f64,
    /// The tensor loss (`dense`) sums the class loss in one kernel (`sluice_kernels::loss::
    /// bce_with_logits_sum_one_hot_kernel`) instead of composed ops: the opt-in device path `fused_bce`. The host
    /// loss ignores it.
    pub fused_bce: bool,
}

/// One evaluation of the loss.
#[derive(Debug, Clone)]
pub struct LossOutput {
    /// What to call `backward` on: `(box + cls + dfl) · batch size`, a scalar.
    pub total: Tensor,
    /// `(box, cls, dfl)` after the gains, before the batch-size factor (Ultralytics' `loss_items`).
    pub items: [f64; 3],
    /// The assigner's result.
    pub assignment: Assignment,
}

impl DetectionLoss {
    /// The loss for `nc` classes with Ultralytics' default gains and assigner.
    pub fn new(nc: usize) -> Self {
        Self { nc, gains: LossGains::default(), assigner: AssignerConfig::default(), o2m_weight: 0.8, fused_bce: false }
    }

    /// Groups a batch's targets per image as assigner GT boxes; rows with an image index ≥ `batch` or a class
    /// ≥ `nc` are errors naming the row.
    pub fn group_targets(&self, targets: &[Target], batch: usize) -> Result<Vec<Vec<GtBox>>> {
        let mut gts = vec![Vec::new(); batch];
        for (i, t) in targets.iter().enumerate() {
            let img = t.image as usize;
            if img >= batch || t.class as usize >= self.nc {
                return Err(ModelError::BadInput(format!(
                    "target row {i}: image {} class {} outside a batch of {batch} with {} classes",
                    t.image, t.class, self.nc
                )));
            }
            gts[img].push(GtBox { class: t.class as usize, xyxy: [t.bbox.x1, t.bbox.y1, t.bbox.x2, t.bbox.y2] });
        }
        Ok(gts)
    }

    /// `(B, nc, A)` of a train-mode head output that fits this loss, or an error naming both shapes.
    fn check_head(&self, raw: &RawHead) -> Result<(usize, usize, usize)> {
        let (b, c, a) = raw.boxes.dims3()?;
        let (_, nc, a2) = raw.scores.dims3()?;
        if (c != 4 * REG_MAX && c != 4) || nc != self.nc || a2 != a {
            return Err(ModelError::BadInput(format!(
                "head outputs {:?} / {:?} do not fit a loss with {} classes",
                raw.boxes.dims(),
                raw.scores.dims(),
                self.nc
            )));
        }
        Ok((b, nc, a))
    }

    /// The same loss from the padded targets table, every step a tensor op on the head's device ([`dense`]);
    /// the loss items stay on the device.
    pub fn compute_dense(&self, raw: &RawHead, gt: DenseTargets<'_>) -> Result<DenseLoss> {
        self.check_head(raw)?;
        if raw.one2one.is_some() || raw.boxes.dim(1)? != 4 * REG_MAX {
            return Err(ModelError::BadInput(
                "the dense (device) loss covers heads with 16 DFL bins and no one-to-one branch; an end-to-end \
                 model (YOLO26) trains with the host loss"
                    .into(),
            ));
        }
        let (anchors, strides) = make_anchors(&raw.grids, raw.boxes.dtype(), raw.boxes.device())?;
        // The bins' softmax once, for the decoded boxes and the DFL's cross entropy.
        let (b, _, a) = raw.boxes.dims3()?;
        let bins = ops::SoftmaxParts::new(&raw.boxes.reshape((b, 4, REG_MAX, a))?, 2)?;
        let pred_xyxy = dist2bbox_xyxy(&bins.expectation()?, &anchors)?;
        let levels = raw.grids.map(|(h, w)| h * w);
        let cfg = dense::DenseConfig { assigner: &self.assigner, gains: &self.gains, fused_bce: self.fused_bce };
        dense::dense_loss(cfg, &bins, &raw.scores, &pred_xyxy, &anchors, &strides, &levels, gt)
    }

    /// Computes the loss of the train-mode head outputs against the batch's targets (boxes in input pixels).
    pub fn compute(&self, raw: &RawHead, targets: &[Target]) -> Result<LossOutput> {
        let Some(one2one) = &raw.one2one else { return self.compute_one(raw, targets, &self.assigner) };
        // Ultralytics' E2ELoss: the one-to-many head with the usual assigner, the one-to-one head with top-k 7 then
        // the single best anchor per object, mixed with the epoch's weight; the items are the one-to-one loss's.
        let o2m = self.compute_one(raw, targets, &self.assigner)?;
        let o2o_cfg = AssignerConfig { topk: 7, topk2: Some(1), ..self.assigner };
        let o2o = self.compute_one(one2one, targets, &o2o_cfg)?;
        let w = self.o2m_weight;
        let total = ((o2m.total * w)? + (o2o.total * (1.0 - w).max(0.0))?)?;
        Ok(LossOutput { total, items: o2o.items, assignment: o2o.assignment })
    }

    /// The one-to-many weight of the end-to-end loss after `epoch` finished epochs of `epochs` (Ultralytics'
    /// `E2ELoss.decay`): 0.8 at the start, falling linearly to 0.1 at the last epoch.
    pub fn o2m_weight_at(epoch: usize, epochs: usize) -> f64 {
        let x = epoch as f64 / (epochs.saturating_sub(1).max(1)) as f64;
        (1.0 - x).max(0.0) * (0.8 - 0.1) + 0.1
    }

    /// Sets the end-to-end weights for the epoch about to run (0-based, `epoch` epochs finished before it).
    pub fn set_epoch(&mut self, epoch: usize, epochs: usize) {
        self.o2m_weight = Self::o2m_weight_at(epoch, epochs);
    }

    fn compute_one(&self, raw: &RawHead, targets: &[Target], assigner: &AssignerConfig) -> Result<LossOutput> {
        let (b, nc, a) = self.check_head(raw)?;
        let reg_max = raw.boxes.dim(1)? / 4;
        let gts = self.group_targets(targets, b)?;
        let dev = raw.boxes.device().clone();
        let dtype = raw.boxes.dtype();
        let (anchors, strides) = make_anchors(&raw.grids, dtype, &dev)?;
        let dist = crate::head::box_distances(raw)?; // (B, 4, A) grid units
        let pred_xyxy = dist2bbox_xyxy(&dist, &anchors)?; // (B, 4, A) grid units

        // Host side: one copy of the detached predictions for the assigner (on a GPU, a blocking read: counted).
        let on_device = !raw.scores.device().is_cpu();
        sluice_core::syncs::record_if(on_device, sluice_core::syncs::Site::Assigner);
        let stride_row = strides.t()?.unsqueeze(0)?; // (1, 1, A)
        let pred_px = pred_xyxy.detach().broadcast_mul(&stride_row)?;
        let scores_host: Vec<f32> =
            ops::sigmoid(&raw.scores.detach())?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let pred_host: Vec<f32> = pred_px.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let anchors_grid: Vec<f32> = anchors.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let strides_host: Vec<f32> = strides.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let anchors_px: Vec<[f32; 2]> = (0..a)
            .map(|i| [anchors_grid[2 * i] * strides_host[i], anchors_grid[2 * i + 1] * strides_host[i]])
            .collect();
        let asg = assigner::assign(assigner, &scores_host, &pred_host, &anchors_px, &gts, self.nc);
        let tss = asg.score_sum().max(1.0);

        // Class loss over all anchors and classes.
        let mut ts = vec![0f32; b * nc * a];
        for bi in 0..b {
            for ai in 0..a {
                let o = bi * a + ai;
                if asg.fg[o] {
                    ts[(bi * nc + asg.label[o]) * a + ai] = asg.score[o];
                }
            }
        }
        let ts = Tensor::from_vec(ts, (b, nc, a), &dev)?.to_dtype(dtype)?;
        let cls = (ops::bce_with_logits(&raw.scores, &ts)?.sum_all()? / tss)?;

        // Box and DFL losses over the foreground anchors.
        let fg_idx: Vec<u32> = (0..b * a).filter(|&o| asg.fg[o]).map(|o| o as u32).collect();
        let (box_loss, dfl_loss) = if fg_idx.is_empty() {
            let zero = raw.boxes.sum_all()?.affine(0.0, 0.0)?;
            (zero.clone(), zero)
        } else {
            let f = fg_idx.len();
            let mut tbox = Vec::with_capacity(4 * f);
            let mut weight = Vec::with_capacity(f);
            let mut tl = Vec::with_capacity(4 * f);
            let mut wl = Vec::with_capacity(4 * f);
            for &o in &fg_idx {
                let o = o as usize;
                let ai = o % a;
                let s = strides_host[ai];
                let bx = asg.bbox[o].map(|v| v / s);
                tbox.extend_from_slice(&bx);
                weight.push(asg.score[o]);
                let (ax, ay) = (anchors_grid[2 * ai], anchors_grid[2 * ai + 1]);
                for d in [ax - bx[0], ay - bx[1], bx[2] - ax, bx[3] - ay] {
                    let d = d.clamp(0.0, REG_MAX as f32 - 1.0 - 0.01);
                    let left = d.floor();
                    tl.push(left as u32);
                    wl.push(left + 1.0 - d);
                }
            }
            let tbox = Tensor::from_vec(tbox, (f, 4), &dev)?.to_dtype(dtype)?;
            let weight = Tensor::from_vec(weight, f, &dev)?.to_dtype(dtype)?;
            let idx = Tensor::from_vec(fg_idx.clone(), f, &dev)?;
            let pbox = pred_xyxy.permute((0, 2, 1))?.reshape((b * a, 4))?.index_select(&idx, 0)?;
            let iou = bbox::ciou(&pbox, &tbox)?; // (F)
            let box_loss = ((iou.affine(-1.0, 1.0)? * &weight)?.sum_all()? / tss)?;
            if reg_max == 1 {
                let l1_loss = l1_term(raw, &dist, &idx, (&fg_idx, &asg), (&anchors_grid, &strides_host), &weight, tss)?;
                return self.finish(box_loss, cls, l1_loss, b, on_device, asg);
            }
            (box_loss, dfl_term(raw, &idx, (tl, wl), &weight, tss)?)
        };
        self.finish(box_loss, cls, dfl_loss, b, on_device, asg)
    }

    /// The gains, the items (one read) and the total of a loss's three terms.
    fn finish(
        &self,
        box_loss: Tensor,
        cls: Tensor,
        dfl_loss: Tensor,
        b: usize,
        on_device: bool,
        asg: Assignment,
    ) -> Result<LossOutput> {
        let box_loss = (box_loss * self.gains.box_gain)?;
        let cls = (cls * self.gains.cls)?;
        let dfl_loss = (dfl_loss * self.gains.dfl)?;
        sluice_core::syncs::record_if(on_device, sluice_core::syncs::Site::LossItems);
        let items = [
            box_loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
            cls.to_dtype(DType::F64)?.to_scalar::<f64>()?,
            dfl_loss.to_dtype(DType::F64)?.to_scalar::<f64>()?,
        ];
        let total = (((box_loss + cls)? + dfl_loss)? * b as f64)?;
        Ok(LossOutput { total, items, assignment: asg })
    }
}

/// The DFL term (Ultralytics' `DFLoss`): the cross entropy of each side's distribution at the two bins around its
/// target distance, weighted by the distance to each (`tl`: the left bins, `wl`: their weights, 4 per anchor), per
/// foreground anchor (`idx`), weighted by the target score and over the score sum `tss`.
fn dfl_term(raw: &RawHead, idx: &Tensor, (tl, wl): (Vec<u32>, Vec<f32>), weight: &Tensor, tss: f64) -> Result<Tensor> {
    let (dev, dtype) = (raw.boxes.device(), raw.boxes.dtype());
    let (b, a, f) = (raw.boxes.dim(0)?, raw.boxes.dim(2)?, idx.dim(0)?);
    let pdist = raw.boxes.permute((0, 2, 1))?.reshape((b * a, 4, REG_MAX))?;
    let tr: Vec<u32> = tl.iter().map(|v| v + 1).collect();
    let tl_t = Tensor::from_vec(tl, (f, 4, 1), dev)?;
    let tr_t = Tensor::from_vec(tr, (f, 4, 1), dev)?;
    let wl_t = Tensor::from_vec(wl, (f, 4), dev)?.to_dtype(dtype)?;
    let wr_t = wl_t.affine(-1.0, 1.0)?;
    let ce = ops::nll_at(&pdist.index_select(idx, 0)?, 2, &[&tl_t, &tr_t])?; // (F, 4, 1) each
    let per_anchor = ((ce[0].squeeze(2)? * wl_t)? + (ce[1].squeeze(2)? * wr_t)?)?.mean(1)?; // (F)
    Ok(((per_anchor * weight)?.sum_all()? / tss)?)
}

/// The box term of a one-bin head (YOLO26, no DFL): the L1 distance of the four side distances in units of the
/// input's width (x sides) and height (y sides), per foreground anchor, weighted by the target score and over the
/// score sum `tss`.
fn l1_term(
    raw: &RawHead,
    dist: &Tensor,
    idx: &Tensor,
    (fg_idx, asg): (&[u32], &assigner::Assignment),
    (anchors_grid, strides_host): (&[f32], &[f32]),
    weight: &Tensor,
    tss: f64,
) -> Result<Tensor> {
    let (dev, dtype) = (raw.boxes.device(), raw.boxes.dtype());
    let (b, a, f) = (dist.dim(0)?, dist.dim(2)?, fg_idx.len());
    let (h_px, w_px) = ((raw.grids[0].0 * 8) as f32, (raw.grids[0].1 * 8) as f32);
    let mut target = Vec::with_capacity(4 * f);
    let mut scale = Vec::with_capacity(4 * f);
    for &o in fg_idx {
        let ai = o as usize % a;
        let s = strides_host[ai];
        let bx = asg.bbox[o as usize].map(|v| v / s);
        let (ax, ay) = (anchors_grid[2 * ai], anchors_grid[2 * ai + 1]);
        let sc = [s / w_px, s / h_px, s / w_px, s / h_px];
        for (k, d) in [ax - bx[0], ay - bx[1], bx[2] - ax, bx[3] - ay].into_iter().enumerate() {
            target.push(d * sc[k]);
            scale.push(sc[k]);
        }
    }
    let target = Tensor::from_vec(target, (f, 4), dev)?.to_dtype(dtype)?;
    let scale = Tensor::from_vec(scale, (f, 4), dev)?.to_dtype(dtype)?;
    let pd = dist.permute((0, 2, 1))?.reshape((b * a, 4))?.index_select(idx, 0)?;
    let l1 = (pd * scale)?.sub(&target)?.abs()?.mean(1)?; // (F)
    Ok(((l1 * weight)?.sum_all()? / tss)?)
}
