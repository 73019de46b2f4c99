//! The eval-mode BatchNorm as a per-channel affine map ([`batch_norm_eval_affine`]) and folded into the preceding
//! convolution's weight ([`fold_batch_norm`]), in Ultralytics' operation order.

use candle_core::{DType, Result, Tensor};

use super::{Elem, check_param, fused_supported, with_cpu_slice};
use crate::uninit::filled_vec;

/// The eval-mode BatchNorm as a per-channel affine map `x·scale + shift` from its parameters `[γ, β, running
/// mean, running variance]`: `scale = γ / √(var + eps)`, `shift = β − γ·mean / √(var + eps)`, in the operation
/// order of Ultralytics' `fuse_conv_and_bn` (so folded weights agree with it to the last bit the dtype allows).
/// Composed from candle ops, so it runs on any device and is differentiable.
pub fn batch_norm_eval_affine(bn: [&Tensor; 4], eps: f64) -> Result<(Tensor, Tensor)> {
    let [gamma, beta, mean, var] = bn;
    let std = (var + eps)?.sqrt()?;
    let scale = gamma.div(&std)?;
    let shift = (beta - (gamma * mean)?.div(&std)?)?;
    Ok((scale, shift))
}

/// A convolution weight `w` (`o×…`, any trailing shape) with the eval-mode BatchNorm `bn` that follows it folded
/// in: `(w·scale[o], shift)` of [`batch_norm_eval_affine`], the Conv+BN folding of inference.
///
/// On contiguous CPU f32/f64 tensors this is one plain pass over the weight with the same per-element operations
/// (the composed form is eight candle ops, a broadcast multiply among them, and every eval forward of an unfused
/// model runs it once per conv). The result is then a new, untracked tensor: no gradient flows through it, as
/// none does through an inference forward. Elsewhere it is composed (and differentiable).
pub fn fold_batch_norm(w: &Tensor, bn: [&Tensor; 4], eps: f64) -> Result<(Tensor, Tensor)> {
    const OP: &str = "fold-batch-norm";
    let o = w.dims().first().copied().unwrap_or(0);
    for (p, what) in bn.iter().zip(["weight", "bias", "running mean", "running variance"]) {
        check_param(p, o, w.dtype(), OP, what)?;
    }
    let all_cpu = fused_supported(w) && bn.iter().all(|p| p.device().is_cpu());
    let contiguous = w.is_contiguous() && bn.iter().all(|p| p.is_contiguous());
    if !(all_cpu && contiguous) || o == 0 {
        let (scale, shift) = batch_norm_eval_affine(bn, eps)?;
        let mut dims = vec![1; w.rank()];
        dims[0] = o;
        return Ok((w.broadcast_mul(&scale.reshape(dims)?)?, shift));
    }
    match w.dtype() {
        DType::F32 => fold_typed::<f32>(w, bn, eps as f32, f32::sqrt, OP),
        DType::F64 => fold_typed::<f64>(w, bn, eps, f64::sqrt, OP),
        d => candle_core::bail!("{OP}: unsupported dtype {d:?}"),
    }
}

/// [`fold_batch_norm`] on the CPU for one dtype.
fn fold_typed<T: Elem>(w: &Tensor, bn: [&Tensor; 4], eps: T, sqrt: fn(T) -> T, op: &str) -> Result<(Tensor, Tensor)> {
    // The four parameters are `o` values each: copied out (a CPU copy, no device sync).
    let [g, b, m, v] = bn.map(|p| p.to_vec1::<T>());
    let (g, b, m, v) = (g?, b?, m?, v?);
    let o = g.len();
    let (scale, shift): (Vec<T>, Vec<T>) = (0..o)
        .map(|c| {
            let std = sqrt(v[c] + eps);
            (g[c] / std, b[c] - (g[c] * m[c]) / std)
        })
        .unzip();
    let per = w.elem_count() / o;
    let folded = with_cpu_slice::<T, _>(w, op, "conv weight", |wv| {
        // Every element is written: one output row per channel, each element once.
        filled_vec(wv.len(), |dst| {
            for ((d, src), &a) in dst.chunks_mut(per).zip(wv.chunks(per)).zip(&scale) {
                for (d, &x) in d.iter_mut().zip(src) {
                    d.write(x * a);
                }
            }
        })
    })?;
    Ok((Tensor::from_vec(folded, w.shape(), w.device())?, Tensor::from_vec(shift, o, w.device())?))
}

#[cfg(test)]
mod tests {
    use candle_core::Device;

    use super::*;

    #[test]
    fn folding_on_the_cpu_matches_the_composed_ops() {
        // Same operations in the same order: equal to the bit in f32, and for f64 against an f64 reference.
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1.0, (5, 3, 3, 3), &dev).unwrap();
        let bn: Vec<Tensor> = [(1.0, 0.3), (0.0, 0.5), (0.2, 1.0)]
            .iter()
            .map(|&(m, s)| Tensor::randn(m as f32, s as f32, 5, &dev).unwrap())
            .chain([Tensor::rand(0.01f32, 2.0, 5, &dev).unwrap()])
            .collect();
        let bn = [&bn[0], &bn[1], &bn[2], &bn[3]];
        let (fw, fb) = fold_batch_norm(&w, bn, 1e-3).unwrap();
        let (scale, shift) = batch_norm_eval_affine(bn, 1e-3).unwrap();
        let want_w = w.broadcast_mul(&scale.reshape((5, 1, 1, 1)).unwrap()).unwrap();
        assert_eq!(
            fw.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want_w.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        assert_eq!(fb.to_vec1::<f32>().unwrap(), shift.to_vec1::<f32>().unwrap());
        assert_eq!(fw.dims(), w.dims());
        // A 1-D weight (any trailing shape) and f64.
        let w64 = w.to_dtype(DType::F64).unwrap().reshape((5, 27)).unwrap();
        let bn64: Vec<Tensor> = bn.iter().map(|t| t.to_dtype(DType::F64).unwrap()).collect();
        let bn64 = [&bn64[0], &bn64[1], &bn64[2], &bn64[3]];
        let (fw, _) = fold_batch_norm(&w64, bn64, 1e-3).unwrap();
        let (scale, _) = batch_norm_eval_affine(bn64, 1e-3).unwrap();
        let want = w64.broadcast_mul(&scale.reshape((5, 1)).unwrap()).unwrap();
        assert_eq!(fw.to_vec2::<f64>().unwrap(), want.to_vec2::<f64>().unwrap());
        // Bad shapes are errors that name the parameter.
        let short = Tensor::zeros(4, DType::F32, &dev).unwrap();
        let err = fold_batch_norm(&w, [&short, bn[1], bn[2], bn[3]], 1e-3).unwrap_err().to_string();
        assert!(err.contains("weight"), "{err}");
    }
}
