//! The task-aligned assigner's overlaps in one kernel: the CIoU of every (GT, prediction) pair of a batch
//! ([`ciou_pairs`]), Ultralytics' `bbox_iou(..., CIoU=True)` with eps 1e-7 and the GT's and the prediction's
//! heights clamped to eps. Composed from candle's ops (sluice-model's `ciou_parts`) it is about forty passes over
//! the `(B, M, A)` pairs and two arctangents of twenty-odd launches each; here it is one pass that reads the boxes
//! and writes the overlaps. Each step is the composed ops' own f32 operation in their order (`cuda::` uses the
//! `_rn` intrinsics so nothing is contracted), so the CPU twin and the kernel give the composed CPU values bit for
//! bit. No gradient: the assigner's boxes are detached.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::norm::contiguous;

#[cfg(feature = "cuda")]
mod cuda;

/// The CUDA C source of the kernel (compiled by NVRTC at run time).
pub const CUDA_SOURCE: &str = include_str!("iou/kernels.cu");

const OP: &str = "ciou_pairs";
/// Ultralytics' eps of `bbox_iou`.
const EPS: f64 = 1e-7;

/// The constants as the composed ops convert them from f64: eps, 1 + eps, 4/π².
fn constants() -> (f32, f32, f32) {
    (EPS as f32, (1.0 + EPS) as f32, (4.0 / std::f64::consts::PI.powi(2)) as f32)
}

/// `v · mul + add` as candle's affine computes it on the CPU (two roundings).
fn aff(v: f32, mul: f32, add: f32) -> f32 {
    v * mul + add
}

/// candle's `maximum` on the CPU.
fn mx(a: f32, b: f32) -> f32 {
    if a < b { b } else { a }
}

/// candle's `minimum` on the CPU.
fn mn(a: f32, b: f32) -> f32 {
    if a > b { b } else { a }
}

/// Cephes `atanf` in the steps of sluice-model's composed `ops::atan`.
fn atan_c(x: f32) -> f32 {
    let a = x.abs();
    let big = a > 2.414_213_562_373_095_f64 as f32;
    let mid = a > 0.414_213_562_373_095_f64 as f32;
    let a_big = if big { a } else { 1.0 };
    let t_big = -(1.0 / a_big);
    let t_mid = aff(a, 1.0, -1.0) / aff(a, 1.0, 1.0);
    let t = if big {
        t_big
    } else if mid {
        t_mid
    } else {
        a
    };
    let off = if big {
        std::f64::consts::FRAC_PI_2 as f32
    } else if mid {
        std::f64::consts::FRAC_PI_4 as f32
    } else {
        0.0
    };
    let z = t * t;
    let mut poly = aff(z, 8.053_744_495_38e-2_f64 as f32, 0.0);
    poly = aff(poly, 1.0, -1.387_768_560_32e-1_f64 as f32);
    poly *= z;
    poly = aff(poly, 1.0, 1.997_771_064_78e-1_f64 as f32);
    poly *= z;
    poly = aff(poly, 1.0, -3.333_294_915_39e-1_f64 as f32);
    let r = (off + (poly * z) * t) + t;
    r * if x < 0.0 { -1.0 } else { 1.0 }
}

/// The CIoU of GT box `g` and predicted box `p` (x1 y1 x2 y2), in the composed ops' steps.
fn ciou_pair(g: [f32; 4], p: [f32; 4], (eps, one_eps, four_pi2): (f32, f32, f32)) -> f32 {
    let [x1a, y1a, x2a, y2a] = g;
    let [x1b, y1b, x2b, y2b] = p;
    let w1 = x2a - x1a;
    let h1 = mx(y2a - y1a, eps);
    let w2 = x2b - x1b;
    let h2 = mx(y2b - y1b, eps);
    let iw = mx(mn(x2a, x2b) - mx(x1a, x1b), 0.0);
    let ih = mx(mn(y2a, y2b) - mx(y1a, y1b), 0.0);
    let inter = iw * ih;
    let union = aff((w1 * h1 + w2 * h2) - inter, 1.0, eps);
    let iou = inter / union;
    let cw = mx(x2a, x2b) - mn(x1a, x1b);
    let ch = mx(y2a, y2b) - mn(y1a, y1b);
    let c2 = aff(cw * cw + ch * ch, 1.0, eps);
    let dx = ((x1b + x2b) - x1a) - x2a;
    let dy = ((y1b + y2b) - y1a) - y2a;
    let rho2 = aff(dx * dx + dy * dy, 0.25, 0.0);
    let dv = atan_c(w2 / h2) - atan_c(w1 / h1);
    let v = aff(dv * dv, four_pi2, 0.0);
    let alpha = v / aff(v - iou, 1.0, one_eps);
    iou - (rho2 / c2 + v * alpha)
}

/// The op: `(gt (B, M, 4), pred (B, 4, A)) → (B, M, A)`.
struct CiouPairs;

/// `(B, M, A)` of the two inputs' shapes, or an error naming the op.
fn dims(gt: &Shape, pred: &Shape) -> Result<(usize, usize, usize)> {
    match (gt.dims(), pred.dims()) {
        (&[b, m, 4], &[b2, 4, a]) if b == b2 => Ok((b, m, a)),
        (g, p) => {
            candle_core::bail!("{OP}: expected GT boxes (B, M, 4) and predictions (B, 4, A), got {g:?} and {p:?}")
        }
    }
}

impl CustomOp2 for CiouPairs {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, m, a) = dims(l1.shape(), l2.shape())?;
        let gt = contiguous::<f32>(s1, l1, OP, "GT boxes")?;
        let pred = contiguous::<f32>(s2, l2, OP, "predictions")?;
        let c = constants();
        let mut out = vec![0f32; b * m * a];
        out.par_chunks_mut(a.max(1)).enumerate().for_each(|(bm, row)| {
            let g = [gt[bm * 4], gt[bm * 4 + 1], gt[bm * 4 + 2], gt[bm * 4 + 3]];
            let p = &pred[(bm / m.max(1)) * 4 * a..];
            for (i, o) in row.iter_mut().enumerate() {
                *o = ciou_pair(g, [p[i], p[a + i], p[2 * a + i], p[3 * a + i]], c);
            }
        });
        Ok((CpuStorage::F32(out), Shape::from((b, m, a))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, m, a) = dims(l1.shape(), l2.shape())?;
        let out = cuda::ciou_pairs((s1, l1), (s2, l2), (b, m, a), constants())?;
        Ok((out, Shape::from((b, m, a))))
    }
}

/// The CIoU of every pair of GT box `gt` `(B, M, 4)` and predicted box `pred` `(B, 4, A)` of the same image, both
/// x1 y1 x2 y2 in f32: `(B, M, A)`, not tracked (the inputs are detached). On a CUDA device one kernel, elsewhere
/// its CPU twin (also the CUDA kernel's stand-in while the op ledger models a CUDA device); the values of the
/// composed `ciou_parts` on the CPU, bit for bit.
pub fn ciou_pairs(gt: &Tensor, pred: &Tensor) -> Result<Tensor> {
    if gt.dtype() != DType::F32 || pred.dtype() != DType::F32 {
        candle_core::bail!("{OP}: boxes must be f32, got {:?} and {:?}", gt.dtype(), pred.dtype());
    }
    dims(gt.shape(), pred.shape())?;
    gt.detach().contiguous()?.apply_op2_no_bwd(&pred.detach().contiguous()?, &CiouPairs)
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use super::ciou_pairs;

    /// Two images, two GT boxes each, three predictions each, against values computed by hand: a box with itself,
    /// the overlap of two 2×2 squares offset by (1, 1) (IoU 1/7, enclosing diagonal² 18, centres' distance² 2,
    /// the same aspect: 1/7 − 2/18), and the GTs of one image never against another image's predictions.
    #[test]
    fn overlaps_of_each_image_against_hand_computed_values() {
        let dev = Device::Cpu;
        let gt = Tensor::new(&[[[0f32, 0., 2., 2.], [10., 10., 14., 12.]], [[1., 1., 3., 3.], [0., 0., 2., 2.]]], &dev)
            .expect("gt");
        // (B, A, 4) rows, then (B, 4, A).
        let rows = [
            [[0f32, 0., 2., 2.], [1., 1., 3., 3.], [10., 10., 14., 12.]],
            [[0., 0., 2., 2.], [50., 50., 52., 52.], [1., 1., 3., 3.]],
        ];
        let pred = Tensor::new(&rows, &dev).and_then(|t| t.permute((0, 2, 1))?.contiguous()).expect("pred");
        let out = ciou_pairs(&gt, &pred).and_then(|t| t.to_vec3::<f32>()).expect("ciou");
        let offset = (1.0 / 7.0 - 2.0 / 18.0) as f32;
        let close = |got: f32, want: f32| (got - want).abs() < 1e-6;
        assert!(close(out[0][0][0], 1.0) && close(out[0][0][1], offset), "{:?}", out[0][0]);
        assert!(close(out[0][1][2], 1.0), "{:?}", out[0][1]);
        assert!(close(out[1][0][0], offset) && close(out[1][0][2], 1.0) && close(out[1][1][0], 1.0), "{:?}", out[1]);
        // Disjoint boxes: IoU 0 and a distance penalty, so below 0.
        assert!(out[1][0][1] < 0.0 && out[0][0][2] < 0.0);
    }

    #[test]
    fn shapes_and_dtypes_that_do_not_fit_are_errors_naming_the_op() {
        let dev = Device::Cpu;
        let gt = Tensor::zeros((2, 3, 4), candle_core::DType::F32, &dev).expect("gt");
        let pred = Tensor::zeros((1, 4, 5), candle_core::DType::F32, &dev).expect("pred");
        let e = ciou_pairs(&gt, &pred).expect_err("batch sizes differ");
        assert!(e.to_string().contains("ciou_pairs"), "{e}");
        let e = ciou_pairs(&gt.to_dtype(candle_core::DType::F64).expect("f64"), &pred).expect_err("f64");
        assert!(e.to_string().contains("f32"), "{e}");
    }
}
