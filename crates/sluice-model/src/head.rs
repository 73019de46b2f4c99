//! The Detect head (box branch `cv2` with 4×reg_max DFL logits, class branch `cv3`: YOLOv8's legacy one or
//! YOLO11's depthwise one), anchors and the DFL box decode.

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::Init;

use crate::config::{Family, REG_MAX, STRIDES, YoloConfig};
use crate::layers::{Conv, Mode};
use crate::ops;
use crate::params::Params;

/// A plain `nn.Conv2d` 1×1 with bias (the last conv of each head branch).
#[derive(Debug, Clone)]
struct Conv2dBias {
    weight: Tensor,
    bias: Tensor,
}

impl Conv2dBias {
    fn new(p: &Params<'_>, c1: usize, c2: usize, bias_init: f64) -> Result<Self> {
        let weight = p.var("weight", (c2, c1, 1, 1), Params::conv_init(c1))?;
        // PyTorch draws the bias that `bias_init` then overwrites.
        p.skip_draws(c2);
        let bias = p.var("bias", c2, Init::Const(bias_init))?;
        Ok(Self { weight: weight.as_tensor().clone(), bias: bias.as_tensor().clone() })
    }

    /// The convolution in `x`'s dtype (half activations under mixed precision: the weight and bias are cast), the
    /// output in the weight's, so the head's outputs, the decode and the loss stay in the model's dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let (w, b) = (self.weight.to_dtype(dt)?, self.bias.to_dtype(dt)?);
        sluice_kernels::conv::conv2d_bias(x, &w, &b, 1, 0)?.to_dtype(self.weight.dtype())
    }

    /// A copy in `dtype` (detached: only fused, eval-only copies are cast).
    fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self { weight: self.weight.detach().to_dtype(dtype)?, bias: self.bias.detach().to_dtype(dtype)? })
    }
}

/// One branch: Conv 3×3 → Conv 3×3 → Conv2d 1×1 with bias.
#[derive(Debug, Clone)]
struct Branch {
    c0: Conv,
    c1: Conv,
    out: Conv2dBias,
}

impl Branch {
    fn new(p: &Params<'_>, cin: usize, hidden: usize, cout: usize, bias_init: f64) -> Result<Self> {
        Ok(Self {
            c0: Conv::new(&p.pp(0), cin, hidden, 3, 1)?,
            c1: Conv::new(&p.pp(1), hidden, hidden, 3, 1)?,
            out: Conv2dBias::new(&p.pp(2), hidden, cout, bias_init)?,
        })
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        self.out.forward(&self.c1.forward(&self.c0.forward(x, mode)?, mode)?)
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self { c0: self.c0.fused(dtype)?, c1: self.c1.fused(dtype)?, out: self.out.to_dtype(dtype)? })
    }
}

/// The class branch of YOLO11's head: DWConv 3×3 → Conv 1×1 → DWConv 3×3 → Conv 1×1 → Conv2d 1×1 with bias.
#[derive(Debug, Clone)]
struct DwBranch {
    dw0: Conv,
    pw0: Conv,
    dw1: Conv,
    pw1: Conv,
    out: Conv2dBias,
}

impl DwBranch {
    fn new(p: &Params<'_>, cin: usize, hidden: usize, cout: usize, bias_init: f64) -> Result<Self> {
        Ok(Self {
            dw0: Conv::depthwise(&p.pp(0).pp(0), cin, 3, true)?,
            pw0: Conv::new(&p.pp(0).pp(1), cin, hidden, 1, 1)?,
            dw1: Conv::depthwise(&p.pp(1).pp(0), hidden, 3, true)?,
            pw1: Conv::new(&p.pp(1).pp(1), hidden, hidden, 1, 1)?,
            out: Conv2dBias::new(&p.pp(2), hidden, cout, bias_init)?,
        })
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.pw0.forward(&self.dw0.forward(x, mode)?, mode)?;
        self.out.forward(&self.pw1.forward(&self.dw1.forward(&y, mode)?, mode)?)
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            dw0: self.dw0.fused(dtype)?,
            pw0: self.pw0.fused(dtype)?,
            dw1: self.dw1.fused(dtype)?,
            pw1: self.pw1.fused(dtype)?,
            out: self.out.to_dtype(dtype)?,
        })
    }
}

/// A class branch: YOLOv8's (legacy) or YOLO11's (depthwise).
#[derive(Debug, Clone)]
enum ClsBranch {
    Legacy(Branch),
    Depthwise(DwBranch),
}

impl ClsBranch {
    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        match self {
            ClsBranch::Legacy(b) => b.forward(x, mode),
            ClsBranch::Depthwise(b) => b.forward(x, mode),
        }
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(match self {
            ClsBranch::Legacy(b) => ClsBranch::Legacy(b.fused(dtype)?),
            ClsBranch::Depthwise(b) => ClsBranch::Depthwise(b.fused(dtype)?),
        })
    }
}

/// Raw head outputs, flattened over the three levels: `(B, 4·reg_max, A)` DFL logits and `(B, nc, A)` class logits.
#[derive(Debug, Clone)]
pub struct RawHead {
    /// DFL logits, side-major (l, t, r, b) × 16 bins.
    pub boxes: Tensor,
    /// Class logits (before the sigmoid).
    pub scores: Tensor,
    /// `(h, w)` of each level's grid.
    pub grids: [(usize, usize); 3],
    /// The one-to-one head's outputs on the same (detached) features, for an end-to-end model (YOLO26).
    pub one2one: Option<Box<RawHead>>,
}

impl RawHead {
    /// The outputs in `dtype` (a half-precision inference copy's outputs in f32 for the loss and the metrics).
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            boxes: self.boxes.to_dtype(dtype)?,
            scores: self.scores.to_dtype(dtype)?,
            grids: self.grids,
            one2one: self.one2one.as_ref().map(|o| o.to_dtype(dtype).map(Box::new)).transpose()?,
        })
    }
}

/// The Detect head: the box branches `cv2` and the class branches `cv3` (legacy in YOLOv8, depthwise in YOLO11 and
/// YOLO26), and in YOLO26 their one-to-one copies `one2one_cv2` / `one2one_cv3`.
#[derive(Debug, Clone)]
pub(crate) struct Detect {
    nc: usize,
    reg_max: usize,
    cv2: Vec<Branch>,
    cv3: Vec<ClsBranch>,
    one2one: Option<(Vec<Branch>, Vec<ClsBranch>)>,
}

/// The box and class branches of each level, for `nc` classes (`cv2` / `cv3` under `p`, with `prefix` before them).
fn branches(p: &Params<'_>, prefix: &str, cfg: &YoloConfig) -> Result<(Vec<Branch>, Vec<ClsBranch>)> {
    let ch = cfg.head_channels();
    let (c2, c3) = (cfg.box_hidden(), cfg.cls_hidden());
    let reg_max = cfg.family.reg_max();
    // Every level's box branch, then every level's class branch: PyTorch's construction order.
    let mut cv2 = Vec::new();
    for (i, &c) in ch.iter().enumerate() {
        cv2.push(Branch::new(&p.pp(format!("{prefix}cv2")).pp(i), c, c2, 4 * reg_max, 2.0)?);
    }
    let mut cv3 = Vec::new();
    for (i, (&c, &s)) in ch.iter().zip(STRIDES.iter()).enumerate() {
        // Ultralytics 8.4 `Detect.bias_init`: box bias 2.0, class bias log(5 / nc / (640 / s)^2).
        let cls_bias = (5.0 / cfg.nc as f64 / (640.0 / s as f64).powi(2)).ln();
        let q = p.pp(format!("{prefix}cv3")).pp(i);
        cv3.push(match cfg.family {
            Family::V8 => ClsBranch::Legacy(Branch::new(&q, c, c3, cfg.nc, cls_bias)?),
            Family::V11 | Family::V26 => ClsBranch::Depthwise(DwBranch::new(&q, c, c3, cfg.nc, cls_bias)?),
        });
    }
    Ok((cv2, cv3))
}

impl Detect {
    pub(crate) fn new(p: &Params<'_>, cfg: &YoloConfig) -> Result<Self> {
        let (cv2, cv3) = branches(p, "", cfg)?;
        // The DFL's 1x1 convolution draws its weights before they are set to 0..reg_max.
        if cfg.family.reg_max() > 1 {
            p.skip_draws(cfg.family.reg_max());
        }
        // Ultralytics deep-copies the one-to-many branches: no draws here, the model copies their values after.
        let one2one = if cfg.family.end2end() { Some(branches(&p.without_draws(), "one2one_", cfg)?) } else { None };
        Ok(Self { nc: cfg.nc, reg_max: cfg.family.reg_max(), cv2, cv3, one2one })
    }

    fn run(&self, cv2: &[Branch], cv3: &[ClsBranch], feats: &[Tensor; 3], mode: Mode) -> Result<RawHead> {
        let mut boxes = Vec::with_capacity(3);
        let mut scores = Vec::with_capacity(3);
        let mut grids = [(0, 0); 3];
        for i in 0..3 {
            let (b, _, h, w) = feats[i].dims4()?;
            grids[i] = (h, w);
            boxes.push(cv2[i].forward(&feats[i], mode)?.reshape((b, 4 * self.reg_max, h * w))?);
            scores.push(cv3[i].forward(&feats[i], mode)?.reshape((b, self.nc, h * w))?);
        }
        Ok(RawHead { boxes: Tensor::cat(&boxes, 2)?, scores: Tensor::cat(&scores, 2)?, grids, one2one: None })
    }

    /// The one-to-many branches (YOLOv8's and YOLO11's only head; YOLO26's default eval output and the branch its
    /// one-to-many loss trains), with the one-to-one branches' outputs beside them in train mode (for the
    /// end-to-end loss). An eval forward runs the one-to-many branches alone, as Ultralytics' fused model does.
    pub(crate) fn forward(&self, feats: &[Tensor; 3], mode: Mode) -> Result<RawHead> {
        let mut raw = self.run(&self.cv2, &self.cv3, feats, mode)?;
        if mode == Mode::Train {
            raw.one2one = self.forward_one2one(feats, mode)?.map(Box::new);
        }
        Ok(raw)
    }

    /// The one-to-one branches on the features, detached as Ultralytics detaches them (the one-to-one loss trains the
    /// branches, not the backbone); `None` without an end-to-end head.
    pub(crate) fn forward_one2one(&self, feats: &[Tensor; 3], mode: Mode) -> Result<Option<RawHead>> {
        let Some((cv2, cv3)) = &self.one2one else { return Ok(None) };
        let detached = [feats[0].detach(), feats[1].detach(), feats[2].detach()];
        self.run(cv2, cv3, &detached, mode).map(Some)
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        let fuse = |cv2: &[Branch], cv3: &[ClsBranch]| -> Result<(Vec<Branch>, Vec<ClsBranch>)> {
            Ok((
                cv2.iter().map(|b| b.fused(dtype)).collect::<Result<_>>()?,
                cv3.iter().map(|b| b.fused(dtype)).collect::<Result<_>>()?,
            ))
        };
        let (cv2, cv3) = fuse(&self.cv2, &self.cv3)?;
        let one2one = match &self.one2one {
            Some((a, b)) => Some(fuse(a, b)?),
            None => None,
        };
        Ok(Self { nc: self.nc, reg_max: self.reg_max, cv2, cv3, one2one })
    }

    /// The one-to-many branches in the evaluation graph, per level the box then the class branch's output.
    pub(crate) fn describe(
        &self,
        b: &mut crate::graph::Builder,
        prefix: &str,
        feats: [usize; 3],
    ) -> crate::error::Result<Vec<usize>> {
        let mut outs = Vec::with_capacity(6);
        for (i, &x) in feats.iter().enumerate() {
            let p = format!("{prefix}.cv2.{i}");
            let bx = &self.cv2[i];
            let h = b.conv(&format!("{p}.0"), &bx.c0, x)?;
            let h = b.conv(&format!("{p}.1"), &bx.c1, h)?;
            outs.push(b.conv_bias(&format!("{p}.2"), &bx.out.weight, &bx.out.bias, h)?);
            let p = format!("{prefix}.cv3.{i}");
            outs.push(match &self.cv3[i] {
                ClsBranch::Legacy(c) => {
                    let h = b.conv(&format!("{p}.0"), &c.c0, x)?;
                    let h = b.conv(&format!("{p}.1"), &c.c1, h)?;
                    b.conv_bias(&format!("{p}.2"), &c.out.weight, &c.out.bias, h)?
                }
                ClsBranch::Depthwise(c) => {
                    let h = b.conv(&format!("{p}.0.0"), &c.dw0, x)?;
                    let h = b.conv(&format!("{p}.0.1"), &c.pw0, h)?;
                    let h = b.conv(&format!("{p}.1.0"), &c.dw1, h)?;
                    let h = b.conv(&format!("{p}.1.1"), &c.pw1, h)?;
                    b.conv_bias(&format!("{p}.2"), &c.out.weight, &c.out.bias, h)?
                }
            });
        }
        Ok(outs)
    }

    /// Every Conv of the head with its Ultralytics name (`<prefix>.cv2.0.0`, …).
    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        let mut heads = vec![("", &self.cv2, &self.cv3)];
        if let Some((cv2, cv3)) = &self.one2one {
            heads.push(("one2one_", cv2, cv3));
        }
        for (pre, cv2, cv3) in heads {
            for (i, b) in cv2.iter().enumerate() {
                out.push((format!("{prefix}.{pre}cv2.{i}.0"), &b.c0));
                out.push((format!("{prefix}.{pre}cv2.{i}.1"), &b.c1));
            }
            for (i, b) in cv3.iter().enumerate() {
                match b {
                    ClsBranch::Legacy(b) => {
                        out.push((format!("{prefix}.{pre}cv3.{i}.0"), &b.c0));
                        out.push((format!("{prefix}.{pre}cv3.{i}.1"), &b.c1));
                    }
                    ClsBranch::Depthwise(b) => {
                        for (name, c) in [("0.0", &b.dw0), ("0.1", &b.pw0), ("1.0", &b.dw1), ("1.1", &b.pw1)] {
                            out.push((format!("{prefix}.{pre}cv3.{i}.{name}"), c));
                        }
                    }
                }
            }
        }
    }
}

/// Anchor centres `(A, 2)` in grid units ((x + 0.5, y + 0.5), each level row-major) and strides `(A, 1)`.
pub fn make_anchors(grids: &[(usize, usize); 3], dtype: DType, device: &Device) -> Result<(Tensor, Tensor)> {
    let mut pts = Vec::new();
    let mut strides = Vec::new();
    for (&(h, w), &s) in grids.iter().zip(STRIDES.iter()) {
        for y in 0..h {
            for x in 0..w {
                pts.push(x as f32 + 0.5);
                pts.push(y as f32 + 0.5);
                strides.push(s as f32);
            }
        }
    }
    let a = strides.len();
    Ok((
        Tensor::from_vec(pts, (a, 2), device)?.to_dtype(dtype)?,
        Tensor::from_vec(strides, (a, 1), device)?.to_dtype(dtype)?,
    ))
}

/// Decodes distances `(B, 4, A)` (l, t, r, b in grid units) around anchors `(A, 2)` to `(B, 4, A)` boxes
/// `x1, y1, x2, y2` in grid units.
pub fn dist2bbox_xyxy(dist: &Tensor, anchors: &Tensor) -> Result<Tensor> {
    let anc = anchors.t()?.unsqueeze(0)?; // (1, 2, A)
    let lt = dist.narrow(1, 0, 2)?;
    let rb = dist.narrow(1, 2, 2)?;
    let x1y1 = anc.broadcast_sub(&lt)?;
    let x2y2 = anc.broadcast_add(&rb)?;
    Tensor::cat(&[&x1y1, &x2y2], 1)
}

/// The distances `(B, 4, A)` in grid units of raw box outputs: the DFL expectation over 16 bins, or the outputs
/// themselves when the head has one bin (YOLO26).
pub fn box_distances(raw: &RawHead) -> Result<Tensor> {
    match raw.boxes.dim(1)? {
        4 => Ok(raw.boxes.clone()),
        _ => ops::dfl_decode(&raw.boxes, REG_MAX),
    }
}

/// The eval-mode output `y = cat(cx, cy, w, h (input pixels), sigmoid(class logits))`, `(B, 4 + nc, A)`.
pub fn decode(raw: &RawHead) -> Result<Tensor> {
    let (anchors, strides) = make_anchors(&raw.grids, raw.boxes.dtype(), raw.boxes.device())?;
    let dist = box_distances(raw)?;
    let xyxy = dist2bbox_xyxy(&dist, &anchors)?;
    let x1y1 = xyxy.narrow(1, 0, 2)?;
    let x2y2 = xyxy.narrow(1, 2, 2)?;
    let c = ((&x1y1 + &x2y2)? * 0.5)?;
    let wh = (&x2y2 - &x1y1)?;
    let s = strides.t()?.unsqueeze(0)?; // (1, 1, A)
    let dbox = Tensor::cat(&[&c, &wh], 1)?.broadcast_mul(&s)?;
    Tensor::cat(&[&dbox, &ops::sigmoid(&raw.scores)?], 1)
}

/// The end-to-end output of a one-to-one head (Ultralytics' `Detect.postprocess` with `max_det`, class-aware):
/// `(B, k, 6)` rows `x1, y1, x2, y2` (input pixels), score, class, with `k = min(max_det, anchors)`. The `k` anchors
/// with the highest best-class score are taken first (`sluice_kernels::topk::topk_last`), then the `k` highest (anchor, class) scores
/// among them, each ordered by score. Everything stays on the tensor's device: only the `(B, k, 6)` result is left
/// to read. On the CPU it equals [`end2end_topk_host`] bit for bit, ties included.
pub fn end2end_topk(raw: &RawHead, max_det: usize) -> Result<Tensor> {
    let (anchors, strides) = make_anchors(&raw.grids, raw.boxes.dtype(), raw.boxes.device())?;
    let xyxy = dist2bbox_xyxy(&box_distances(raw)?, &anchors)?.broadcast_mul(&strides.t()?.unsqueeze(0)?)?;
    let probs = ops::sigmoid(&raw.scores)?.contiguous()?; // (B, nc, A)
    let (b, nc, a) = probs.dims3()?;
    let k = max_det.min(a);
    let dev = probs.device();
    let (_, top) = sluice_kernels::topk::topk_last(&probs.max(1)?, k)?; // (B, k) anchors by best-class score
    let sel = probs.gather(&top.unsqueeze(1)?.broadcast_as((b, nc, k))?.contiguous()?, 2)?; // (B, nc, k)
    // Candidates in (rank, class) order: rank · nc + class.
    let flat = sel.transpose(1, 2)?.contiguous()?.reshape((b, k * nc))?;
    let (scores, fidx) = sluice_kernels::topk::topk_last(&flat, k)?;
    let ncs = Tensor::new(nc as u32, dev)?;
    let rank = fidx.broadcast_div(&ncs)?;
    let class = (&fidx - rank.broadcast_mul(&ncs)?)?;
    let anchor = top.gather(&rank, 1)?.contiguous()?; // (B, k)
    let boxes = xyxy.contiguous()?.gather(&anchor.unsqueeze(1)?.broadcast_as((b, 4, k))?.contiguous()?, 2)?;
    let dtype = raw.boxes.dtype();
    Tensor::cat(
        &[
            boxes.transpose(1, 2)?.to_dtype(dtype)?,
            scores.unsqueeze(2)?.to_dtype(dtype)?,
            class.unsqueeze(2)?.to_dtype(dtype)?,
        ],
        2,
    )?
    .contiguous()
}

/// The end-to-end output of a one-to-one head (Ultralytics' `Detect.postprocess` with `max_det`, class-aware):
/// `(B, k, 6)` rows `x1, y1, x2, y2` (input pixels), score, class, with `k = min(max_det, anchors)`. The `k` anchors
/// with the highest best-class score are taken first, then the `k` highest (anchor, class) scores among them, each
/// ordered by score with ties in index order. [`end2end_topk`] computes it on the tensor's device; this is the
/// host reference it is tested against (one read of `(B, 4 + nc, A)` per call).
pub fn end2end_topk_host(raw: &RawHead, max_det: usize) -> Result<Tensor> {
    let (anchors, strides) = make_anchors(&raw.grids, raw.boxes.dtype(), raw.boxes.device())?;
    let xyxy = dist2bbox_xyxy(&box_distances(raw)?, &anchors)?.broadcast_mul(&strides.t()?.unsqueeze(0)?)?;
    let probs = ops::sigmoid(&raw.scores)?;
    let (b, nc, a) = probs.dims3()?;
    // The selection runs on the host: on a device this is one blocking read per call, counted.
    sluice_core::syncs::record_if(!raw.scores.device().is_cpu(), sluice_core::syncs::Site::Other);
    let k = max_det.min(a);
    let boxes: Vec<Vec<Vec<f32>>> = xyxy.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.to_vec3()?;
    let probs: Vec<Vec<Vec<f32>>> = probs.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.to_vec3()?;
    let mut out = Vec::with_capacity(b * k * 6);
    for (bx, p) in boxes.iter().zip(&probs) {
        let best: Vec<f32> = (0..a).map(|j| (0..nc).map(|c| p[c][j]).fold(f32::NEG_INFINITY, f32::max)).collect();
        let mut top: Vec<usize> = (0..a).collect();
        top.sort_by(|&x, &y| best[y].total_cmp(&best[x]).then(x.cmp(&y)));
        top.truncate(k);
        let mut cand: Vec<(f32, usize)> = top
            .iter()
            .enumerate()
            .flat_map(|(r, &j)| (0..nc).map(move |c| (r, j, c)))
            .map(|(r, j, c)| (p[c][j], r * nc + c))
            .collect();
        cand.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        for &(score, flat) in cand.iter().take(k) {
            let (j, c) = (top[flat / nc], flat % nc);
            out.extend_from_slice(&[bx[0][j], bx[1][j], bx[2][j], bx[3][j], score, c as f32]);
        }
    }
    Tensor::from_vec(out, (b, k, 6), &Device::Cpu)?.to_dtype(raw.boxes.dtype())?.to_device(raw.boxes.device())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Deterministic values in `0..levels` (few levels: many exact ties).
    fn levels(n: usize, levels: u32, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) as u32 % levels) as f32
            })
            .collect()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
    }

    #[test]
    fn device_end2end_topk_equals_the_host_reference() {
        // 640 and 1280 px grids (8400 and 33,600 anchors), 80 and 3 classes, logits on a few levels so that scores
        // tie across anchors and classes; one-bin boxes (reg_max 1).
        for (side, nc) in [(640usize, 80usize), (1280, 3), (64, 2)] {
            let grids = [(side / 8, side / 8), (side / 16, side / 16), (side / 32, side / 32)];
            let a: usize = grids.iter().map(|(h, w)| h * w).sum();
            let d = &Device::Cpu;
            let boxes = Tensor::from_vec(levels(2 * 4 * a, 9, 1).iter().map(|v| v * 0.5).collect(), (2, 4, a), d);
            let scores = Tensor::from_vec(levels(2 * nc * a, 7, 2).iter().map(|v| v - 6.0).collect(), (2, nc, a), d);
            let raw = RawHead { boxes: boxes.unwrap(), scores: scores.unwrap(), grids, one2one: None };
            for max_det in [300, 7] {
                let dev = end2end_topk(&raw, max_det).unwrap();
                let host = end2end_topk_host(&raw, max_det).unwrap();
                assert_eq!(dev.dims(), host.dims());
                assert_eq!(bits(&dev), bits(&host), "{side} px, {nc} classes, max_det {max_det}");
            }
        }
    }
}
