//! Eval-mode affine + SiLU ([`affine_silu`]): `SiLU(x·scale[c] + shift[c])` in one sweep, with a backward (candle
//! builds the graph in inference too when the parameters are variables), and its composed candle version.

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::planes::{plane_affine_silu, plane_dz};
use super::{Elem, check_param, contiguous, fused_supported, min_planes, nchw, with_cpu_slice};
use crate::uninit::filled_vec;

const AFFINE_OP: &str = "affine_silu";

/// The fused op `(x, scale, shift) → SiLU(x·scale[c] + shift[c])`.
#[derive(Debug)]
struct AffineSilu;

impl AffineSilu {
    fn fwd<T: Elem>(x: &[T], scale: &[T], shift: &[T], c: usize, hw: usize) -> Vec<T> {
        // plane_affine_silu writes every element of its plane.
        filled_vec(x.len(), |y| {
            y.par_chunks_mut(hw)
                .with_min_len(min_planes(hw))
                .zip(x.par_chunks(hw))
                .enumerate()
                .for_each(|(i, (yp, xp))| plane_affine_silu(xp, yp, scale[i % c], shift[i % c]))
        })
    }

    fn bwd_typed<T: Elem>(x: &Tensor, scale: &Tensor, shift: &Tensor, grad: &Tensor) -> Result<[Tensor; 3]> {
        let (n, c, h, w) = x.dims4()?;
        let hw = h * w;
        let sc: Vec<T> = scale.to_vec1()?;
        let sh: Vec<T> = shift.to_vec1()?;
        let grad = grad.contiguous()?;
        let mut dx = Vec::with_capacity(x.elem_count());
        let sums: Vec<(f64, f64)> = with_cpu_slice::<T, _>(x, AFFINE_OP, "input", |xv| {
            with_cpu_slice::<T, _>(&grad, AFFINE_OP, "gradient", |gv| {
                dx.spare_capacity_mut()[..xv.len()]
                    .par_chunks_mut(hw)
                    .with_min_len(min_planes(hw))
                    .zip(xv.par_chunks(hw).zip(gv.par_chunks(hw)))
                    .enumerate()
                    .map(|(i, (o, (xp, gp)))| {
                        let ch = i % c;
                        plane_dz(xp, gp, o, sc[ch], sh[ch], T::zero(), sc[ch])
                    })
                    .collect()
            })
        })??;
        // SAFETY: plane_dz wrote every element of every plane (x has as many elements as dx's capacity).
        unsafe { dx.set_len(x.elem_count()) };
        let mut dscale = vec![T::zero(); c];
        let mut dshift = vec![T::zero(); c];
        for ch in 0..c {
            let (mut s0, mut s1) = (0f64, 0f64);
            for b in 0..n {
                s0 += sums[b * c + ch].0;
                s1 += sums[b * c + ch].1;
            }
            dshift[ch] = T::from_f64(s0);
            dscale[ch] = T::from_f64(s1);
        }
        let dev = Device::Cpu;
        Ok([
            Tensor::from_vec(dx, x.shape(), &dev)?,
            Tensor::from_vec(dscale, c, &dev)?,
            Tensor::from_vec(dshift, c, &dev)?,
        ])
    }
}

impl CustomOp3 for AffineSilu {
    fn name(&self) -> &'static str {
        AFFINE_OP
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, c, h, w) = nchw(l1.shape(), AFFINE_OP)?;
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(Self::fwd::<f32>(
                contiguous(s1, l1, AFFINE_OP, "input")?,
                contiguous(s2, l2, AFFINE_OP, "scale")?,
                contiguous(s3, l3, AFFINE_OP, "shift")?,
                c,
                h * w,
            )),
            CpuStorage::F64(_) => CpuStorage::F64(Self::fwd::<f64>(
                contiguous(s1, l1, AFFINE_OP, "input")?,
                contiguous(s2, l2, AFFINE_OP, "scale")?,
                contiguous(s3, l3, AFFINE_OP, "shift")?,
                c,
                h * w,
            )),
            _ => candle_core::bail!("{AFFINE_OP}: only f32 and f64 are supported"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        scale: &Tensor,
        shift: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let [dx, ds, db] = match x.dtype() {
            DType::F32 => Self::bwd_typed::<f32>(x, scale, shift, grad)?,
            DType::F64 => Self::bwd_typed::<f64>(x, scale, shift, grad)?,
            d => candle_core::bail!("{AFFINE_OP}: unsupported dtype {d:?}"),
        };
        Ok((Some(dx), Some(ds), Some(db)))
    }
}

/// Eval-mode `SiLU(x·scale[c] + shift[c])` for an NCHW `x` and `(C,)` `scale`/`shift` (BatchNorm with running
/// statistics folded into an affine map, followed by SiLU). Fused on f32/f64 CPU storage (with gradients for all
/// three inputs); [`affine_silu_composed`] elsewhere.
pub fn affine_silu(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    let (_, c, _, _) = nchw(x.shape(), AFFINE_OP)?;
    check_param(scale, c, x.dtype(), AFFINE_OP, "scale")?;
    check_param(shift, c, x.dtype(), AFFINE_OP, "shift")?;
    if !fused_supported(x) || x.elem_count() == 0 {
        return affine_silu_composed(x, scale, shift);
    }
    x.contiguous()?.apply_op3(&scale.contiguous()?, &shift.contiguous()?, AffineSilu)
}

/// The composed candle version of [`affine_silu`] (the reference, and the fallback off the CPU).
pub fn affine_silu_composed(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    let (_, c, _, _) = nchw(x.shape(), AFFINE_OP)?;
    x.broadcast_mul(&scale.reshape((1, c, 1, 1))?)?.broadcast_add(&shift.reshape((1, c, 1, 1))?)?.silu()
}
