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
}
