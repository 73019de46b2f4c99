//! Depthwise convolution, stride 1, zero padding `k / 2` (`nn.Conv2d(c, c, k, 1, k // 2, groups=c, bias=False)`,
//! YOLO11's DWConv and its attention's positional encoding), forward and backward.
//!
//! candle runs a grouped convolution as one convolution per group, and the composed form
//! ([`depthwise_conv2d_composed`]: the sum of the k² shifted views of the padded input, each scaled per channel)
//! sweeps the data 2k² times and allocates a tensor per tap. Here one pass per plane: for each tap, a row of the
//! output gains the tap times the shifted input row (a loop that vectorises). The input gradient is the same loop
//! with input and output swapped; the weight gradient sums, per channel and tap, the products of the output gradient
//! and the shifted input over the batch. Custom op on contiguous f32/f64 CPU storage, parallel over `(n, c)` planes
//! (the weight gradient over channels, each summed over the batch in order, so the result does not depend on
//! scheduling). On a CUDA device with the `cudnn` feature, the same op runs cuDNN's grouped convolution (group count
//! = channels) for the forward pass and both gradients; the composed version elsewhere.

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::norm::{Elem, contiguous, fused_supported, nchw, with_cpu_slice};

const OP: &str = "depthwise_conv2d";
/// Planes smaller than this many elements are grouped into one rayon task.
const MIN_TASK_ELEMS: usize = 16 * 1024;

fn min_planes(plane: usize) -> usize {
    MIN_TASK_ELEMS.div_ceil(plane.max(1)).max(1)
}

/// The columns `[lo, hi)` of an output row that tap offset `d` (in `−p..=p`) reads inside a row of width `w`.
#[inline(always)]
fn span(d: isize, w: usize) -> (usize, usize) {
    let lo = (-d).max(0) as usize;
    let hi = (w as isize - d.max(0)).max(0) as usize;
    (lo.min(w), hi.max(lo.min(w)))
}

/// `out += Σ taps` for one `h × w` plane (`acc` zeroed by the caller): `out[i][j] += w[dy][dx] · x[i+dy−p][j+dx−p]`.
fn plane_fwd<T: Elem>(x: &[T], taps: &[T], k: usize, h: usize, w: usize, out: &mut [T]) {
    let p = (k / 2) as isize;
    for dy in 0..k {
        let oy = dy as isize - p;
        for dx in 0..k {
            let ox = dx as isize - p;
            let t = taps[dy * k + dx];
            let (lo, hi) = span(ox, w);
            for i in 0..h {
                let si = i as isize + oy;
                if si < 0 || si >= h as isize {
                    continue;
                }
                let src = &x[si as usize * w..(si as usize + 1) * w];
                let dst = &mut out[i * w..(i + 1) * w];
                let shift = ox;
                for j in lo..hi {
                    dst[j] += t * src[(j as isize + shift) as usize];
                }
            }
        }
    }
}

/// The input gradient of one plane: `dx[i+dy−p][j+dx−p] += w[dy][dx] · g[i][j]`.
fn plane_dx<T: Elem>(g: &[T], taps: &[T], k: usize, h: usize, w: usize, dx_out: &mut [T]) {
    let p = (k / 2) as isize;
    for dy in 0..k {
        let oy = dy as isize - p;
        for dx in 0..k {
            let ox = dx as isize - p;
            let t = taps[dy * k + dx];
            let (lo, hi) = span(ox, w);
            for i in 0..h {
                let si = i as isize + oy;
                if si < 0 || si >= h as isize {
                    continue;
                }
                let src = &g[i * w..(i + 1) * w];
                let dst = &mut dx_out[si as usize * w..(si as usize + 1) * w];
                for j in lo..hi {
                    dst[(j as isize + ox) as usize] += t * src[j];
                }
            }
        }
    }
}

/// The weight gradient of one plane, added to `dw` (k² taps): `dw[dy][dx] += Σ g[i][j] · x[i+dy−p][j+dx−p]`.
fn plane_dw<T: Elem>(x: &[T], g: &[T], k: usize, h: usize, w: usize, dw: &mut [T]) {
    let p = (k / 2) as isize;
    for dy in 0..k {
        let oy = dy as isize - p;
        for dx in 0..k {
            let ox = dx as isize - p;
            let (lo, hi) = span(ox, w);
            let mut acc = T::zero();
            for i in 0..h {
                let si = i as isize + oy;
                if si < 0 || si >= h as isize {
                    continue;
                }
                let xs = &x[si as usize * w..(si as usize + 1) * w];
                let gs = &g[i * w..(i + 1) * w];
                let mut row = T::zero();
                for j in lo..hi {
                    row += gs[j] * xs[(j as isize + ox) as usize];
                }
                acc += row;
            }
            dw[dy * k + dx] += acc;
        }
    }
}

struct Depthwise {
    k: usize,
}

impl Depthwise {
    fn fwd<T: Elem>(&self, x: &[T], wt: &[T], c: usize, h: usize, w: usize) -> Vec<T> {
        let (plane, kk) = (h * w, self.k * self.k);
        let mut y = vec![T::zero(); x.len()];
        y.par_chunks_mut(plane).zip(x.par_chunks(plane)).enumerate().with_min_len(min_planes(plane)).for_each(
            |(pi, (yp, xp))| {
                let ch = pi % c;
                plane_fwd(xp, &wt[ch * kk..(ch + 1) * kk], self.k, h, w, yp);
            },
        );
        y
    }

    fn bwd_typed<T: Elem>(&self, x: &Tensor, wt: &Tensor, grad: &Tensor) -> Result<(Tensor, Tensor)> {
        let (n, c, h, w) = x.dims4()?;
        let (plane, kk, k) = (h * w, self.k * self.k, self.k);
        let grad = grad.contiguous()?;
        let mut dx = vec![T::zero(); x.elem_count()];
        let mut dw = vec![T::zero(); c * kk];
        with_cpu_slice::<T, _>(x, OP, "input", |xv| {
            with_cpu_slice::<T, _>(wt, OP, "weight", |wv| {
                with_cpu_slice::<T, _>(&grad, OP, "gradient", |gv| {
                    dx.par_chunks_mut(plane)
                        .zip(gv.par_chunks(plane))
                        .enumerate()
                        .with_min_len(min_planes(plane))
                        .for_each(|(pi, (dp, gp))| {
                            let ch = pi % c;
                            plane_dx(gp, &wv[ch * kk..(ch + 1) * kk], k, h, w, dp);
                        });
                    dw.par_chunks_mut(kk).enumerate().with_min_len(min_planes(n * plane)).for_each(|(ch, dwc)| {
                        for b in 0..n {
                            let o = (b * c + ch) * plane;
                            plane_dw(&xv[o..o + plane], &gv[o..o + plane], k, h, w, dwc);
                        }
                    });
                })
            })
        })???;
        Ok((Tensor::from_vec(dx, x.shape(), &Device::Cpu)?, Tensor::from_vec(dw, wt.shape(), &Device::Cpu)?))
    }
}

impl CustomOp2 for Depthwise {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, c, h, w) = nchw(l1.shape(), OP)?;
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(self.fwd::<f32>(
                contiguous(s1, l1, OP, "input")?,
                contiguous(s2, l2, OP, "weight")?,
                c,
                h,
                w,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(self.fwd::<f64>(
                contiguous(s1, l1, OP, "input")?,
                contiguous(s2, l2, OP, "weight")?,
                c,
                h,
                w,
            )),
            _ => candle_core::bail!("{OP}: f32 or f64 input and weight of one dtype"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let g = cuda_geom(l1.shape(), self.k)?;
        Ok((
            crate::conv::cudnn::run_groups(crate::conv::cudnn::Pass::Forward, (s1, l1), (s2, l2), &g, g.c)?,
            l1.shape().clone(),
        ))
    }

    fn bwd(&self, x: &Tensor, wt: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cudnn")]
        if x.device().is_cuda() {
            use crate::conv::cudnn::Pass;
            let grad = grad.contiguous()?;
            let dx = grad.apply_op2_no_bwd(wt, &DepthwiseCudnn { k: self.k, pass: Pass::BackwardData })?;
            let dw = x.apply_op2_no_bwd(&grad, &DepthwiseCudnn { k: self.k, pass: Pass::BackwardFilter })?;
            return Ok((Some(dx), Some(dw)));
        }
        let (dx, dw) = match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, wt, grad)?,
            DType::F64 => self.bwd_typed::<f64>(x, wt, grad)?,
            d => candle_core::bail!("{OP}: backward for {d:?}"),
        };
        Ok((Some(dx), Some(dw)))
    }
}

/// The geometry of the depthwise convolution of an input of `shape` as cuDNN sees it: `c` outputs from `c` inputs
/// in `c` groups, stride 1, padding `k / 2`.
#[cfg(feature = "cudnn")]
fn cuda_geom(shape: &Shape, k: usize) -> Result<crate::conv::Geom> {
    let (n, c, h, w) = shape.dims4()?;
    crate::conv::Geom::new((n, c, h, w), (c, c, k, k), 1, k / 2)
        .ok_or_else(|| candle_core::Error::Msg(format!("{OP}: a {k}×{k} kernel does not fit {:?}", shape.dims())))
}

/// A gradient pass of the depthwise convolution through cuDNN: the input gradient from `(dy, w)`, or the weight
/// gradient from `(x, dy)`. CUDA only: on the CPU, [`Depthwise`]'s backward computes both directly.
#[cfg(feature = "cudnn")]
struct DepthwiseCudnn {
    k: usize,
    pass: crate::conv::cudnn::Pass,
}

#[cfg(feature = "cudnn")]
impl CustomOp2 for DepthwiseCudnn {
    fn name(&self) -> &'static str {
        "depthwise_conv2d_backward_cudnn"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("{}: CUDA only", self.name())
    }

    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::conv::cudnn::{Pass, run_groups};
        // `dy` has the input's shape (stride 1, same padding): the first operand names the geometry either way.
        let g = cuda_geom(l1.shape(), self.k)?;
        let out = match self.pass {
            Pass::BackwardData => l1.shape().clone(),
            Pass::BackwardFilter => Shape::from((g.c, 1, self.k, self.k)),
            Pass::Forward => candle_core::bail!("{}: a gradient pass", self.name()),
        };
        Ok((run_groups(self.pass, (s1, l1), (s2, l2), &g, g.c)?, out))
    }
}

fn check(x: &Tensor, wt: &Tensor, pad: usize) -> Result<usize> {
    let (_, c, _, _) = nchw(x.shape(), OP)?;
    let (wc, one, k, k2) = wt.dims4()?;
    if wc != c || one != 1 || k != k2 || k != 2 * pad + 1 || wt.dtype() != x.dtype() {
        candle_core::bail!("{OP}: input {:?}, weight {:?} {:?}, pad {pad}", x.dims(), wt.dims(), wt.dtype());
    }
    Ok(k)
}

/// Depthwise convolution of `x` `(B, C, H, W)` with `w` `(C, 1, k, k)`, stride 1, zero padding `pad = k / 2`,
/// differentiable in both: the fused op on f32/f64 CPU tensors and (feature `cudnn`) on cuDNN's dtypes on CUDA,
/// [`depthwise_conv2d_composed`] elsewhere.
pub fn depthwise_conv2d(x: &Tensor, w: &Tensor, pad: usize) -> Result<Tensor> {
    let k = check(x, w, pad)?;
    let fused = fused_supported(x);
    #[cfg(feature = "cudnn")]
    let fused = fused || (x.device().is_cuda() && crate::conv::cudnn::supports(x.dtype()));
    if !fused || x.elem_count() == 0 {
        return depthwise_conv2d_composed(x, w, pad);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, Depthwise { k })
}

/// The composed candle version of [`depthwise_conv2d`] (the reference, and the path off the CPU): the sum of the
/// k² shifted views of the padded input, each scaled per channel.
pub fn depthwise_conv2d_composed(x: &Tensor, w: &Tensor, pad: usize) -> Result<Tensor> {
    let k = check(x, w, pad)?;
    let (_, c, h, wd) = x.dims4()?;
    let xp = x.pad_with_zeros(2, pad, pad)?.pad_with_zeros(3, pad, pad)?;
    let w = w.reshape((c, k * k))?;
    let mut acc: Option<Tensor> = None;
    for dy in 0..k {
        for dx in 0..k {
            let tap = w.narrow(1, dy * k + dx, 1)?.reshape((1, c, 1, 1))?;
            let term = xp.narrow(2, dy, h)?.narrow(3, dx, wd)?.broadcast_mul(&tap)?;
            acc = Some(match acc {
                Some(a) => (a + term)?,
                None => term,
            });
        }
    }
    acc.ok_or_else(|| candle_core::Error::Msg(format!("{OP}: empty kernel")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar::<f64>().unwrap()
    }

    #[test]
    fn fused_matches_the_composed_form_forward_and_backward() {
        for (n, c, h, w, k) in [(2, 3, 7, 5, 3), (1, 4, 1, 9, 3), (3, 2, 6, 6, 5), (1, 1, 2, 2, 3)] {
            let x = Tensor::randn(0f64, 1.0, (n, c, h, w), &Device::Cpu).unwrap();
            let wt = Tensor::randn(0f64, 1.0, (c, 1, k, k), &Device::Cpu).unwrap();
            let g = Tensor::randn(0f64, 1.0, (n, c, h, w), &Device::Cpu).unwrap();
            let (xv, wv) = (candle_core::Var::from_tensor(&x).unwrap(), candle_core::Var::from_tensor(&wt).unwrap());
            let y = depthwise_conv2d(xv.as_tensor(), wv.as_tensor(), k / 2).unwrap();
            let y_ref = depthwise_conv2d_composed(xv.as_tensor(), wv.as_tensor(), k / 2).unwrap();
            assert!(max_diff(&y, &y_ref) < 1e-12, "forward {n}x{c}x{h}x{w} k{k}");
            let gs = (y * &g).unwrap().sum_all().unwrap().backward().unwrap();
            let gs_ref = (y_ref * &g).unwrap().sum_all().unwrap().backward().unwrap();
            for (v, what) in [(&xv, "input"), (&wv, "weight")] {
                let a = gs.get(v.as_tensor()).unwrap();
                let b = gs_ref.get(v.as_tensor()).unwrap();
                assert!(max_diff(a, b) < 1e-11, "{what} gradient {n}x{c}x{h}x{w} k{k}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        let x = Tensor::zeros((1, 3, 4, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(depthwise_conv2d(&x, &Tensor::zeros((2, 1, 3, 3), DType::F32, &Device::Cpu).unwrap(), 1).is_err());
        assert!(depthwise_conv2d(&x, &Tensor::zeros((3, 1, 3, 3), DType::F32, &Device::Cpu).unwrap(), 2).is_err());
    }
}
