//! Tensor operations built from candle primitives with correct forward *and* backward passes, working around
//! candle 0.11 defects this model hits (each is pinned by a gradient-check test in `tests/gradcheck.rs`):
//!
//! * `max_pool2d` has no padding, and its backward bails out when kernel != stride (and scales ties wrongly);
//!   [`max_pool2d_same`] is `sluice_kernels`' −inf-padded pool with an argmax backward.
//! * `upsample_nearest2d`'s backward *overwrites* the input's gradient instead of accumulating it, so a tensor
//!   feeding both an upsample and a concat gets a wrong gradient; [`upsample_nearest2x`] is `sluice_kernels`'
//!   upsample, whose backward sums each 2×2 block and accumulates.
//! * `candle_nn::ops::softmax_last_dim` has no backward; [`softmax`] is composed of `exp`/`sum`/`div`.
//! * `candle_nn::loss::binary_cross_entropy_with_logit` computes `log(sigmoid(x))` and overflows for large
//!   logits; [`bce_with_logits`] is the stable `max(x,0) − x·z + log(1 + e^{−|x|})`.
//! * candle has no `atan` (needed by CIoU); [`atan`] is Cephes' single-precision polynomial with range
//!   reduction, built from differentiable ops.

use candle_core::{DType, Result, Tensor};

/// `v` in `x`'s dtype, on its device, broadcast to its shape (not tracked): a view of one cached scalar, so a
/// constant operand costs no allocation and no fill on a device. The value is `v` converted as a scalar operand is
/// (the same as a fill of `v`).
pub(crate) fn full_like(x: &Tensor, v: f64) -> Result<Tensor> {
    candle_core::scalar::cached_scalar((DType::F64, v), x.dtype(), x.device())?.broadcast_as(x.shape())
}

/// `MaxPool2d(kernel_size = k, stride = 1, padding = k / 2)` as in PyTorch (the padding is −inf, so it never
/// wins the max). `k` must be odd. The fused kernel of [`sluice_kernels::pool::max_pool2d_same`]: each output's
/// gradient goes to its window's first maximum and accumulates (the composed shifted-maximum form off the CPU).
pub fn max_pool2d_same(x: &Tensor, k: usize) -> Result<Tensor> {
    sluice_kernels::pool::max_pool2d_same(x, k)
}

/// Nearest-neighbour upsampling by 2 in H and W (`nn.Upsample(scale_factor=2, mode="nearest")`) whose gradient
/// accumulates like any other op's ([`sluice_kernels::pool::upsample_nearest2x`]: a fused kernel on the CPU,
/// reshape + broadcast elsewhere).
pub fn upsample_nearest2x(x: &Tensor) -> Result<Tensor> {
    sluice_kernels::pool::upsample_nearest2x(x)
}

/// Softmax along `dim`, differentiable (the max subtracted for stability is detached; it cancels exactly).
pub fn softmax(x: &Tensor, dim: usize) -> Result<Tensor> {
    let max = x.max_keepdim(dim)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let s = e.sum_keepdim(dim)?;
    e.broadcast_div(&s)
}

/// Log-softmax along `dim`, differentiable and stable.
pub fn log_softmax(x: &Tensor, dim: usize) -> Result<Tensor> {
    let max = x.max_keepdim(dim)?.detach();
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(dim)?.log()?;
    shifted.broadcast_sub(&lse)
}

/// The negative log-softmax of `x` along `dim` read at each of `idx` (gather's indices, size 1 along `dim`):
/// `ln Σ e^x − x[i]`, the same values to the bit as `log_softmax(x, dim).gather(i, dim).neg()` and the same
/// gradients, without writing the log-softmax over `x`'s size or reducing its gradient (the DFL's cross entropy
/// at its two bins).
pub fn nll_at(x: &Tensor, dim: usize, idx: &[&Tensor]) -> Result<Vec<Tensor>> {
    SoftmaxParts::new(x, dim)?.nll_at(idx)
}

/// The softmax of `x` along `dim` kept in parts, for a caller that reads it twice: the DFL head's bins give both the
/// decoded distances ([`SoftmaxParts::expectation`]) and the cross entropy at the target bins
/// ([`SoftmaxParts::nll_at`]), from one max, one shift, one exponential and one sum over the logits.
#[derive(Debug, Clone)]
pub struct SoftmaxParts {
    dim: usize,
    /// `x` minus its (detached) maximum along `dim`.
    shifted: Tensor,
    /// `e^shifted`.
    exp: Tensor,
    /// `Σ e^shifted` along `dim`, kept.
    sum: Tensor,
}

impl SoftmaxParts {
    /// The parts of `x`'s softmax along `dim`.
    pub fn new(x: &Tensor, dim: usize) -> Result<Self> {
        let max = x.max_keepdim(dim)?.detach();
        let shifted = x.broadcast_sub(&max)?;
        let exp = shifted.exp()?;
        let sum = exp.sum_keepdim(dim)?;
        Ok(Self { dim, shifted, exp, sum })
    }

    /// [`nll_at`]: `ln Σ e^x − x[i]` for each of `idx`.
    pub fn nll_at(&self, idx: &[&Tensor]) -> Result<Vec<Tensor>> {
        let lse = self.sum.log()?;
        idx.iter().map(|i| lse.broadcast_sub(&self.shifted.gather(i, self.dim)?)).collect()
    }

    /// The softmax's expectation of the index along `dim` (`Σ k·e_k / Σ e_k`, `dim` removed): the DFL decode, with
    /// one division after the sum where the decode from the probabilities divides every bin (equal up to rounding).
    pub fn expectation(&self) -> Result<Tensor> {
        let n = self.exp.dim(self.dim)?;
        let mut shape = vec![1; self.exp.rank()];
        shape[self.dim] = n;
        let k = Tensor::arange(0u32, n as u32, self.exp.device())?.to_dtype(self.exp.dtype())?.reshape(shape)?;
        self.exp.broadcast_mul(&k)?.sum(self.dim)?.div(&self.sum.squeeze(self.dim)?)
    }
}

/// Element-wise binary cross-entropy with logits, `max(x,0) − x·z + log(1 + e^{−|x|})` (PyTorch's
/// `BCEWithLogitsLoss(reduction="none")`), finite for any logit; the targets `z` get no gradient.
pub fn bce_with_logits(x: &Tensor, z: &Tensor) -> Result<Tensor> {
    sluice_kernels::loss::bce_with_logits(x, z)
}

/// The sum of [`bce_with_logits`] of `x` `(B, C, A)` against one-hot targets (`weight[b, a]` at class
/// `label[b, a]`, 0 elsewhere) where the caller holds `p = σ(x)`: on a device it reads the probabilities instead of
/// recomputing `ln(1 + e^{−|x|})`, the targets' product by one gather, and its gradient is one op
/// (`sluice_kernels::loss::bce_with_logits_sum_one_hot_given_probs`).
pub fn bce_with_logits_sum_one_hot(x: &Tensor, label: &Tensor, weight: &Tensor, p: &Tensor) -> Result<Tensor> {
    sluice_kernels::loss::bce_with_logits_sum_one_hot(x, label, weight, p)
}

/// Element-wise arctangent (Cephes `atanf`: range reduction to |t| ≤ tan(π/8) and a degree-9 odd polynomial,
/// about 1 ulp in float32), differentiable everywhere.
pub fn atan(x: &Tensor) -> Result<Tensor> {
    const TAN_3PI_8: f64 = 2.414_213_562_373_095;
    const TAN_PI_8: f64 = 0.414_213_562_373_095;
    let a = x.abs()?;
    let ones = full_like(x, 1.0)?;
    let big = a.gt(TAN_3PI_8)?;
    let mid = a.gt(TAN_PI_8)?;
    // Only feed safe values to each branch so the unselected branch never produces inf/NaN gradients.
    let a_big = big.where_cond(&a, &ones)?;
    let t_big = a_big.recip()?.neg()?;
    let t_mid = ((&a - 1.0)? / (&a + 1.0)?)?;
    let t = big.where_cond(&t_big, &mid.where_cond(&t_mid, &a)?)?;
    let off = big.where_cond(
        &full_like(x, std::f64::consts::FRAC_PI_2)?,
        &mid.where_cond(&full_like(x, std::f64::consts::FRAC_PI_4)?, &full_like(x, 0.0)?)?,
    )?;
    let z = t.sqr()?;
    let poly = ((((((&z * 8.053_744_495_38e-2)? - 1.387_768_560_32e-1)? * &z)? + 1.997_771_064_78e-1)? * &z)?
        - 3.333_294_915_39e-1)?;
    let r = ((off + (&poly * &z)?.mul(&t)?)? + &t)?;
    let sign = x.lt(0.0)?.where_cond(&full_like(x, -1.0)?, &ones)?;
    r * sign
}

/// Distribution focal loss decode: `(B, 4·reg_max, A)` bin logits → `(B, 4, A)` expected distances in bins.
pub fn dfl_decode(raw_boxes: &Tensor, reg_max: usize) -> Result<Tensor> {
    sluice_kernels::dfl::dfl_decode(raw_boxes, reg_max)
}

/// Depthwise convolution, stride 1, zero padding `pad` (`nn.Conv2d(c, c, k, 1, pad, groups=c)` without bias):
/// `x` is `(B, C, H, W)`, `w` is `(C, 1, k, k)` ([`sluice_kernels::depthwise::depthwise_conv2d`]: one pass per
/// plane on the CPU with its backward; the sum of the k² shifted views elsewhere).
pub fn depthwise_conv2d(x: &Tensor, w: &Tensor, pad: usize) -> Result<Tensor> {
    sluice_kernels::depthwise::depthwise_conv2d(x, w, pad)
}

/// Sigmoid that is differentiable (`candle_nn::ops::sigmoid` with its custom backward).
pub fn sigmoid(x: &Tensor) -> Result<Tensor> {
    candle_nn::ops::sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn atan_matches_std_over_a_wide_range() {
        let v: Vec<f32> = (-400..=400).map(|i| (i as f32 / 20.0).powi(3) / 10.0).collect();
        let x = Tensor::new(v.as_slice(), &Device::Cpu).unwrap();
        let y: Vec<f32> = atan(&x).unwrap().to_vec1().unwrap();
        for (a, b) in v.iter().zip(&y) {
            assert!((a.atan() - b).abs() < 3e-7, "atan({a}) = {b}, std {}", a.atan());
        }
    }

    #[test]
    fn bce_is_finite_for_huge_logits_and_matches_the_formula() {
        let x = Tensor::new(&[-200f32, -3.0, 0.0, 2.5, 200.0], &Device::Cpu).unwrap();
        let z = Tensor::new(&[1f32, 0.0, 1.0, 0.3, 0.0], &Device::Cpu).unwrap();
        let l: Vec<f32> = bce_with_logits(&x, &z).unwrap().to_vec1().unwrap();
        let xs = [-200f64, -3.0, 0.0, 2.5, 200.0];
        let zs = [1f64, 0.0, 1.0, 0.3, 0.0];
        for i in 0..5 {
            let s = 1.0 / (1.0 + (-xs[i]).exp());
            let reference = if xs[i].abs() > 50.0 {
                // The limit: |x| times the wrong-side weight.
                if xs[i] > 0.0 { xs[i] * (1.0 - zs[i]) } else { -xs[i] * zs[i] }
            } else {
                -(zs[i] * s.ln() + (1.0 - zs[i]) * (1.0 - s).ln())
            };
            assert!((l[i] as f64 - reference).abs() < 1e-5, "{i}: {} vs {reference}", l[i]);
        }
    }

    #[test]
    fn max_pool_paths_agree_and_ignore_padding() {
        let dev = Device::Cpu;
        let x = (Tensor::randn(0f32, 1.0, (2, 3, 7, 6), &dev).unwrap() - 5.0).unwrap();
        let native = max_pool2d_same(&x, 5).unwrap();
        let var = candle_core::Var::from_tensor(&x).unwrap();
        let composed = max_pool2d_same(var.as_tensor(), 5).unwrap();
        let d = (native - composed).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert_eq!(d, 0.0);
        // Every output is one of the inputs in its window (all negative: zero padding would show up as 0).
        let m = max_pool2d_same(&x, 5).unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(m < 0.0);
    }

    #[test]
    fn upsample_paths_agree() {
        let dev = Device::Cpu;
        let x = Tensor::randn(0f64, 1.0, (1, 2, 3, 4), &dev).unwrap();
        let a = upsample_nearest2x(&x).unwrap();
        let var = candle_core::Var::from_tensor(&x).unwrap();
        let b = upsample_nearest2x(var.as_tensor()).unwrap();
        assert_eq!(a.dims(), &[1, 2, 6, 8]);
        let d = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f64>().unwrap();
        assert_eq!(d, 0.0);
        assert_eq!(x.dtype(), DType::F64);
    }

    #[test]
    fn nll_at_is_the_gathered_log_softmax_to_the_bit_with_its_gradients() {
        let d = &Device::Cpu;
        // The dense loss's layout (B, 4, 16, A) along dim 2 and the host loss's (F, 4, 16) along the last dim.
        for (shape, dim) in [(vec![2usize, 4, 16, 37], 2usize), (vec![5, 4, 16], 2)] {
            let x = candle_core::Var::from_tensor(&(Tensor::randn(0f32, 3.0, shape.as_slice(), d).unwrap())).unwrap();
            let mut ishape = shape.clone();
            ishape[dim] = 1;
            let n: usize = ishape.iter().product();
            let left: Vec<u32> = (0..n as u32).map(|i| i * 7 % 15).collect();
            let tl = Tensor::from_vec(left.clone(), ishape.as_slice(), d).unwrap();
            let tr = Tensor::from_vec(left.iter().map(|v| v + 1).collect::<Vec<_>>(), ishape.as_slice(), d).unwrap();
            let w = Tensor::randn(0f32, 1.0, ishape.as_slice(), d).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
            };
            let got = nll_at(x.as_tensor(), dim, &[&tl, &tr]).unwrap();
            let logp = log_softmax(x.as_tensor(), dim).unwrap();
            let want = [&tl, &tr].map(|i| logp.gather(i, dim).unwrap().neg().unwrap());
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(bits(g), bits(w), "{shape:?}: values");
            }
            let loss =
                |ce: &[Tensor]| (ce[0].mul(&w).unwrap() + ce[1].affine(0.3, 0.0).unwrap()).unwrap().sum_all().unwrap();
            let g1 = loss(&got).backward().unwrap();
            let g2 = loss(&want).backward().unwrap();
            let (g1, g2) = (g1.get(x.as_tensor()).unwrap(), g2.get(x.as_tensor()).unwrap());
            assert_eq!(bits(g1), bits(g2), "{shape:?}: gradients");
        }
    }

    #[test]
    fn the_softmax_expectation_is_the_dfl_decode() {
        let d = &Device::Cpu;
        let x = (Tensor::randn(0f32, 3.0, (2, 64, 50), d).unwrap() * 1.0).unwrap();
        let parts = SoftmaxParts::new(&x.reshape((2, 4, 16, 50)).unwrap(), 2).unwrap();
        let got: Vec<f32> = parts.expectation().unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let want: Vec<f32> =
            sluice_kernels::dfl::dfl_decode_composed(&x, 16).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got.len(), 2 * 4 * 50);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 2e-6 * w.abs().max(1.0), "{g} against {w}");
        }
    }
}
