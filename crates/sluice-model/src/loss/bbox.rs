//! Differentiable CIoU of box pairs (Ultralytics `bbox_iou(..., xywh=False, CIoU=True)`, eps 1e-7; the α term is
//! detached as in Ultralytics), built on `ops::atan`.

use candle_core::{Result, Tensor};

use crate::ops;

/// CIoU of `(N, 4)` xyxy boxes `b1` (predictions) and `b2` (targets), `(N)`.
pub fn ciou(b1: &Tensor, b2: &Tensor) -> Result<Tensor> {
    let col = |t: &Tensor, i: usize| t.narrow(1, i, 1).and_then(|c| c.squeeze(1));
    let a = [col(b1, 0)?, col(b1, 1)?, col(b1, 2)?, col(b1, 3)?];
    let b = [col(b2, 0)?, col(b2, 1)?, col(b2, 2)?, col(b2, 3)?];
    ciou_parts(&a, &b)
}

/// CIoU of boxes given as their `x1, y1, x2, y2` component tensors, broadcast against each other (e.g. GTs
/// `(B, M, 1)` against predictions `(B, 1, A)` → `(B, M, A)`); `b1`'s height is clamped, as in Ultralytics.
pub fn ciou_parts(b1: &[Tensor; 4], b2: &[Tensor; 4]) -> Result<Tensor> {
    let eps = 1e-7;
    let [x1a, y1a, x2a, y2a] = b1;
    let [x1b, y1b, x2b, y2b] = b2;
    let w1 = (x2a - x1a)?;
    let h1 = (y2a - y1a)?.maximum(eps)?;
    let w2 = (x2b - x1b)?;
    let h2 = (y2b - y1b)?.maximum(eps)?;
    let iw = (x2a.broadcast_minimum(x2b)? - x1a.broadcast_maximum(x1b)?)?.maximum(0.0)?;
    let ih = (y2a.broadcast_minimum(y2b)? - y1a.broadcast_maximum(y1b)?)?.maximum(0.0)?;
    let inter = (iw * ih)?;
    let union = ((&w1 * &h1)?.broadcast_add(&(&w2 * &h2)?)? - &inter)?.affine(1.0, eps)?;
    let iou = (inter / union)?;
    let cw = (x2a.broadcast_maximum(x2b)? - x1a.broadcast_minimum(x1b)?)?;
    let ch = (y2a.broadcast_maximum(y2b)? - y1a.broadcast_minimum(y1b)?)?;
    let c2 = (cw.sqr()? + ch.sqr()?)?.affine(1.0, eps)?;
    // ((x1b + x2b) − x1a) − x2a, in this order (the host formula's rounding).
    let dx = (x1b + x2b)?.broadcast_sub(x1a)?.broadcast_sub(x2a)?;
    let dy = (y1b + y2b)?.broadcast_sub(y1a)?.broadcast_sub(y2a)?;
    let rho2 = ((dx.sqr()? + dy.sqr()?)? * 0.25)?;
    let dv = ops::atan(&(&w2 / &h2)?)?.broadcast_sub(&ops::atan(&(&w1 / &h1)?)?)?;
    let v = (dv.sqr()? * (4.0 / std::f64::consts::PI.powi(2)))?;
    let alpha = (&v / ((&v - &iou)? + (1.0 + eps))?)?.detach();
    iou - ((rho2 / c2)? + (v * alpha)?)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::assigner::ciou_host;
    use candle_core::Device;

    #[test]
    fn matches_the_host_formula() {
        // ops::atan is float32-accurate (about 1e-7 relative), hence the tolerance.
        let a = [[10.0f64, 20.0, 50.0, 40.0], [0.0, 0.0, 5.0, 30.0], [3.0, 3.0, 4.0, 4.0]];
        let b = [[12.0f64, 18.0, 47.0, 45.0], [100.0, 100.0, 120.0, 101.0], [3.0, 3.0, 4.0, 4.0]];
        let ta = Tensor::new(&a, &Device::Cpu).unwrap();
        let tb = Tensor::new(&b, &Device::Cpu).unwrap();
        let got: Vec<f64> = ciou(&ta, &tb).unwrap().to_vec1().unwrap();
        for i in 0..3 {
            assert!((got[i] - ciou_host(a[i], b[i])).abs() < 1e-6, "{i}: {} vs {}", got[i], ciou_host(a[i], b[i]));
        }
    }

    /// The assigner's one-kernel overlaps (`sluice_kernels::iou::ciou_pairs`, opt-in on a device) give these
    /// composed ops' values to the bit: random pairs at pixel scale and the edge cases (identical, disjoint, nested,
    /// zero-width and zero-height boxes, both arctangent range reductions, negative coordinates).
    #[test]
    fn the_one_kernel_overlaps_are_the_composed_ones_to_the_bit() {
        let (b, m, a) = (3usize, 5usize, 97usize);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut boxes = |n: usize| -> Vec<[f32; 4]> {
            (0..n)
                .map(|_| {
                    let (x, y) = (next() * 640.0 - 20.0, next() * 640.0 - 20.0);
                    let (w, h) = (next() * next() * 300.0, next() * next() * 300.0);
                    [x, y, x + w, y + h]
                })
                .collect()
        };
        let mut gt = boxes(b * m);
        let mut pred = boxes(b * a);
        let special = [
            [10.0, 10.0, 60.0, 40.0],
            [100.0, 100.0, 100.0, 130.0],
            [5.0, 5.0, 45.0, 5.0],
            [-30.0, -10.0, 2.0, 700.0],
            [0.0, 0.0, 640.0, 1.0],
        ];
        gt[..5].copy_from_slice(&special);
        pred[..5].copy_from_slice(&special);
        pred[5..10].copy_from_slice(&[
            special[1],
            special[0],
            [20.0, 15.0, 30.0, 25.0],
            [300.0, 300.0, 310.0, 900.0],
            [0.0, 0.0, 1.0, 640.0],
        ]);
        let dev = Device::Cpu;
        let gt_t = Tensor::from_vec(gt.concat(), (b, m, 4), &dev).unwrap();
        let pred_rows = Tensor::from_vec(pred.concat(), (b, a, 4), &dev).unwrap();
        let pred_t = pred_rows.permute((0, 2, 1)).unwrap().contiguous().unwrap(); // (B, 4, A)
        let g = [0, 1, 2, 3].map(|i| gt_t.narrow(2, i, 1).unwrap()); // (B, M, 1)
        let p = [0, 1, 2, 3].map(|i| pred_t.narrow(1, i, 1).unwrap()); // (B, 1, A)
        let composed: Vec<f32> = ciou_parts(&g, &p).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let fused: Vec<f32> =
            sluice_kernels::iou::ciou_pairs(&gt_t, &pred_t).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(composed.len(), b * m * a);
        for (i, (c, f)) in composed.iter().zip(&fused).enumerate() {
            assert_eq!(c.to_bits(), f.to_bits(), "pair {i}: composed {c}, one kernel {f}");
        }
        // And against the host formula in f64 (Ultralytics'), so the pairs are not trivially equal.
        let mut worst = 0f64;
        for (i, &f) in fused.iter().enumerate() {
            let (bm, ai) = (i / a, i % a);
            let h = ciou_host(gt[bm].map(f64::from), pred[(bm / m) * a + ai].map(f64::from));
            worst = worst.max((f64::from(f) - h).abs());
        }
        assert!(worst < 1e-5, "worst difference from the f64 formula {worst}");
        assert!(fused.iter().any(|&v| v > 0.5) && fused.iter().any(|&v| v < -0.5));
    }
}
