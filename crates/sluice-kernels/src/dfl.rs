//! YOLOv8's DFL box decode as one candle custom op: for each anchor and each of the 4 box sides, the expected bin
//! `Σ_k k·softmax(x)_k` over the `reg_max` bins of the head's box output `(B, 4·reg_max, A)` → `(B, 4, A)`.
//!
//! Composed from candle ops it is a max, a subtract, an exp, a sum, a divide, a multiply by the bin index and a
//! second sum over a strided middle dimension, each a pass over the `(B, 4, reg_max, A)` tensor with its own
//! buffer, and as many again backward. Here the forward is one sweep over the bins (a running max, then the
//! exponentials' sum and index-weighted sum), and the backward one more: `∂y/∂x_k = p_k·(k − y)` with
//! `p = softmax(x)`, recomputed from the input instead of stored. Both work along the anchors (the contiguous
//! dimension), so the loops vectorise; the plane loops are compiled for AVX-512/AVX2 too and picked at run time.
//! Other devices and dtypes use [`dfl_decode_composed`], also the tests' reference.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use crate::norm::{Elem, contiguous, fused_supported, with_cpu_slice};

const DFL_OP: &str = "dfl_decode";

/// `(b, 4·reg_max, a)` of the op's input, or an error naming the op.
fn dims(shape: &Shape, reg_max: usize) -> Result<(usize, usize)> {
    match shape.dims() {
        &[b, c, a] if reg_max > 0 && c == 4 * reg_max => Ok((b, a)),
        d => candle_core::bail!("{DFL_OP}: expected (B, 4 x {reg_max}, A), got {d:?}"),
    }
}

/// Per anchor of one side (`x`: `r` rows of `a`): the bins' maximum into `m` and `Σ e^(x−m)` into `s`; with
/// `y` given, `Σ k·e^(x−m) / Σ e^(x−m)` into it.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn side_stats<T: Elem>(x: &[T], a: usize, m: &mut [T], s: &mut [T], y: Option<&mut [T]>) {
    m.copy_from_slice(&x[..a]);
    for row in x.chunks_exact(a).skip(1) {
        for (mi, &v) in m.iter_mut().zip(row) {
            *mi = if v > *mi { v } else { *mi };
        }
    }
    s.fill(T::zero());
    match y {
        Some(y) => {
            y.fill(T::zero());
            for (k, row) in x.chunks_exact(a).enumerate() {
                let kf = T::from_f64(k as f64);
                for ((yi, si), (&v, &mi)) in y.iter_mut().zip(s.iter_mut()).zip(row.iter().zip(m.iter())) {
                    let e = (v - mi).exp_fast();
                    *si += e;
                    *yi += kf * e;
                }
            }
            for (yi, &si) in y.iter_mut().zip(s.iter()) {
                *yi /= si;
            }
        }
        None => {
            for row in x.chunks_exact(a) {
                for (si, (&v, &mi)) in s.iter_mut().zip(row.iter().zip(m.iter())) {
                    *si += (v - mi).exp_fast();
                }
            }
        }
    }
}

/// The gradient of one side: `dx_k = g·p_k·(k − y)`, `p_k = e^(x_k−m)/s`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn side_grad<T: Elem>(x: &[T], a: usize, m: &[T], s: &[T], y: &[T], g: &[T], dx: &mut [T]) {
    for (k, (row, drow)) in x.chunks_exact(a).zip(dx.chunks_exact_mut(a)).enumerate() {
        let kf = T::from_f64(k as f64);
        for (i, (d, &v)) in drow.iter_mut().zip(row).enumerate() {
            *d = g[i] * ((v - m[i]).exp_fast() / s[i]) * (kf - y[i]);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct DflDecode {
    reg_max: usize,
}

impl DflDecode {
    fn fwd<T: Elem>(&self, x: &[T], a: usize) -> Vec<T> {
        let side = self.reg_max * a;
        let mut y = vec![T::zero(); x.len() / self.reg_max];
        y.par_chunks_mut(a).zip(x.par_chunks(side)).for_each_init(
            || (vec![T::zero(); a], vec![T::zero(); a]),
            |(m, s), (ys, xs)| side_stats(xs, a, m, s, Some(ys)),
        );
        y
    }

    fn bwd_typed<T: Elem>(&self, x: &Tensor, y: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let (_, a) = dims(x.shape(), self.reg_max)?;
        let side = self.reg_max * a;
        let (y, grad) = (y.contiguous()?, grad.contiguous()?);
        let mut dx = vec![T::zero(); x.elem_count()];
        with_cpu_slice::<T, _>(x, DFL_OP, "input", |xv| {
            with_cpu_slice::<T, _>(&y, DFL_OP, "output", |yv| {
                with_cpu_slice::<T, _>(&grad, DFL_OP, "gradient", |gv| {
                    dx.par_chunks_mut(side)
                        .zip(xv.par_chunks(side))
                        .zip(yv.par_chunks(a).zip(gv.par_chunks(a)))
                        .for_each_init(
                            || (vec![T::zero(); a], vec![T::zero(); a]),
                            |(m, s), ((ds, xs), (ys, gs))| {
                                side_stats(xs, a, m, s, None);
                                side_grad(xs, a, m, s, ys, gs, ds);
                            },
                        )
                })
            })
        })???;
        Tensor::from_vec(dx, x.shape(), &Device::Cpu)
    }
}

impl CustomOp1 for DflDecode {
    fn name(&self) -> &'static str {
        DFL_OP
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, a) = dims(l.shape(), self.reg_max)?;
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(self.fwd::<f32>(contiguous(s, l, DFL_OP, "input")?, a)),
            CpuStorage::F64(_) => CpuStorage::F64(self.fwd::<f64>(contiguous(s, l, DFL_OP, "input")?, a)),
            _ => candle_core::bail!("{DFL_OP}: only f32 and f64 are supported"),
        };
        Ok((out, Shape::from((b, 4, a))))
    }

    fn bwd(&self, x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, res, grad)?,
            DType::F64 => self.bwd_typed::<f64>(x, res, grad)?,
            d => candle_core::bail!("{DFL_OP}: unsupported dtype {d:?}"),
        }))
    }
}

/// `(B, 4·reg_max, A)` bin logits → `(B, 4, A)` expected bins (distances in grid units), differentiable. Fused on
/// f32/f64 CPU storage; [`dfl_decode_composed`] elsewhere.
pub fn dfl_decode(x: &Tensor, reg_max: usize) -> Result<Tensor> {
    let (_, a) = dims(x.shape(), reg_max)?;
    if !fused_supported(x) || a == 0 {
        return dfl_decode_composed(x, reg_max);
    }
    x.contiguous()?.apply_op1(DflDecode { reg_max })
}

/// The same from candle's ops: softmax over the bins (max-shifted), times the bin index, summed.
pub fn dfl_decode_composed(x: &Tensor, reg_max: usize) -> Result<Tensor> {
    let (b, a) = dims(x.shape(), reg_max)?;
    let x = x.reshape((b, 4, reg_max, a))?;
    let max = x.max_keepdim(2)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(2)?)?;
    let proj = Tensor::arange(0u32, reg_max as u32, x.device())?.to_dtype(x.dtype())?.reshape((1, 1, reg_max, 1))?;
    p.broadcast_mul(&proj)?.sum(2)
}
