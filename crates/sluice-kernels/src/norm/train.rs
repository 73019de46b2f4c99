//! Training-mode BatchNorm + SiLU ([`batch_norm_silu_train`]): the fused op with batch statistics, its backward, and
//! the composed candle version it is checked against and falls back to. With the `cuda` feature, CUDA tensors (f32,
//! or f16 / bf16 activations with f32 parameters) run the device kernels of `norm/cuda.rs`.

use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

#[cfg(feature = "cuda")]
use super::cuda;
use super::planes::{plane_affine_silu, plane_dx, plane_dz, plane_moments};
use super::{Elem, check_param, contiguous, min_planes, nchw, with_cpu_slice};
use crate::uninit::filled_vec;

/// Per-channel statistics of one forward pass, saved for the backward pass and returned to the caller.
#[derive(Debug, Clone)]
struct Stats {
    mean: Vec<f64>,
    var: Vec<f64>,
    inv_std: Vec<f64>,
}

/// The fused op: `(x, γ, β) → SiLU(γ·(x − mean)/√(var + eps) + β)` with batch statistics over N, H, W.
#[derive(Debug)]
struct BnSiluTrain {
    eps: f64,
    stats: Arc<OnceLock<Stats>>,
    /// The statistics of a forward on a CUDA device, kept there.
    #[cfg(feature = "cuda")]
    device_stats: Arc<OnceLock<cuda::DeviceStats>>,
}

const BN_OP: &str = "batch_norm_silu_train";

impl BnSiluTrain {
    fn fwd<T: Elem>(&self, x: &[T], gamma: &[T], beta: &[T], dims: (usize, usize, usize)) -> Result<Vec<T>> {
        let (n, c, hw) = dims;
        let count = (n * hw) as f64;
        if count == 0.0 {
            candle_core::bail!("{BN_OP}: empty batch (N·H·W = 0)");
        }
        // Sweep 1: per-plane moments about the channel's first value, combined per channel.
        let moments: Vec<(f64, f64)> = x
            .par_chunks(hw)
            .with_min_len(min_planes(hw))
            .enumerate()
            .map(|(i, p)| plane_moments(p, x[(i % c) * hw]))
            .collect();
        let mut mean = vec![0f64; c];
        let mut var = vec![0f64; c];
        for ch in 0..c {
            let (mut s1, mut s2) = (0f64, 0f64);
            for b in 0..n {
                let (a, q) = moments[b * c + ch];
                s1 += a;
                s2 += q;
            }
            let d = s1 / count;
            mean[ch] = x[ch * hw].to_f64() + d;
            var[ch] = (s2 / count - d * d).max(0.0);
        }
        let inv_std: Vec<f64> = var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect();
        // Sweep 2: z = x·a + b with a = γ/σ, b = β − mean·a; y = SiLU(z).
        let ab: Vec<(T, T)> = (0..c)
            .map(|ch| {
                let a = gamma[ch].to_f64() * inv_std[ch];
                (T::from_f64(a), T::from_f64(beta[ch].to_f64() - mean[ch] * a))
            })
            .collect();
        // plane_affine_silu writes every element of its plane.
        let y = filled_vec(x.len(), |y| {
            y.par_chunks_mut(hw).with_min_len(min_planes(hw)).zip(x.par_chunks(hw)).enumerate().for_each(
                |(i, (yp, xp))| {
                    let (a, b) = ab[i % c];
                    plane_affine_silu(xp, yp, a, b);
                },
            )
        });
        // A second forward through the same op value would be a caller bug; keep the first statistics then.
        let _ = self.stats.set(Stats { mean, var, inv_std });
        Ok(y)
    }

    /// `(dx, dγ, dβ)` for one dtype.
    fn bwd_typed<T: Elem>(&self, x: &Tensor, gamma: &Tensor, beta: &Tensor, grad: &Tensor) -> Result<[Tensor; 3]> {
        let Some(st) = self.stats.get() else {
            candle_core::bail!("{BN_OP}: backward before forward");
        };
        let (n, c, h, w) = x.dims4()?;
        let hw = h * w;
        let count = (n * hw) as f64;
        let gamma_v: Vec<T> = gamma.to_vec1()?;
        let beta_v: Vec<T> = beta.to_vec1()?;
        let grad = grad.contiguous()?;
        let mut dx = Vec::with_capacity(x.elem_count());
        // Per channel: z = x·a + b; x̂ = (x − mean)·inv_std.
        let abm: Vec<(T, T, T)> = (0..c)
            .map(|ch| {
                let a = gamma_v[ch].to_f64() * st.inv_std[ch];
                (T::from_f64(a), T::from_f64(beta_v[ch].to_f64() - st.mean[ch] * a), T::from_f64(st.mean[ch]))
            })
            .collect();
        // Sweep 1: dz into dx, per-plane (Σdz, Σdz·(x − mean)).
        let sums: Vec<(f64, f64)> = with_cpu_slice::<T, _>(x, BN_OP, "input", |xv| {
            with_cpu_slice::<T, _>(&grad, BN_OP, "gradient", |gv| {
                dx.spare_capacity_mut()[..xv.len()]
                    .par_chunks_mut(hw)
                    .with_min_len(min_planes(hw))
                    .zip(xv.par_chunks(hw).zip(gv.par_chunks(hw)))
                    .enumerate()
                    .map(|(i, (o, (xp, gp)))| {
                        let (a, b, m) = abm[i % c];
                        plane_dz(xp, gp, o, a, b, m, T::one())
                    })
                    .collect()
            })
        })??;
        // SAFETY: plane_dz wrote every element of every plane (x has as many elements as dx's capacity).
        unsafe { dx.set_len(x.elem_count()) };
        let mut dgamma = vec![T::zero(); c];
        let mut dbeta = vec![T::zero(); c];
        // dx = γ·inv_std·(dz − Σdz/N − x̂·Σ(dz·x̂)/N).
        let mut coef = vec![(T::zero(), T::zero(), T::zero(), T::zero()); c];
        for ch in 0..c {
            let (mut s0, mut s1) = (0f64, 0f64);
            for b in 0..n {
                let (p, q) = sums[b * c + ch];
                s0 += p;
                s1 += q;
            }
            let inv = st.inv_std[ch];
            let sdzx = s1 * inv;
            dbeta[ch] = T::from_f64(s0);
            dgamma[ch] = T::from_f64(sdzx);
            let k = gamma_v[ch].to_f64() * inv;
            // dx = k·dz − k·s0/N − k·inv·sdzx/N·(x − mean)
            coef[ch] = (
                T::from_f64(k),
                T::from_f64(k * s0 / count),
                T::from_f64(k * inv * sdzx / count),
                T::from_f64(st.mean[ch]),
            );
        }
        // Sweep 2: dz → dx in place.
        with_cpu_slice::<T, _>(x, BN_OP, "input", |xv| {
            dx.par_chunks_mut(hw)
                .with_min_len(min_planes(hw))
                .zip(xv.par_chunks(hw))
                .enumerate()
                .for_each(|(i, (o, xp))| plane_dx(xp, o, coef[i % c]))
        })?;
        let dev = Device::Cpu;
        Ok([
            Tensor::from_vec(dx, x.shape(), &dev)?,
            Tensor::from_vec(dgamma, c, &dev)?,
            Tensor::from_vec(dbeta, c, &dev)?,
        ])
    }
}

/// The ledger's names of the CUDA path's backward and of the statistics buffer it hands the caller.
const BN_BWD_LEDGER: &str = "custom-bwd:batch_norm_silu_train";
const BN_STATS_LEDGER: &str = "custom:batch_norm_stats";

impl CustomOp3 for BnSiluTrain {
    fn name(&self) -> &'static str {
        BN_OP
    }

    /// The CUDA path: partial statistics, their reduction, the normalisation (`cuda::forward`).
    fn ledger_launches(&self) -> u64 {
        3
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
        let (n, c, h, w) = nchw(l1.shape(), BN_OP)?;
        let dims = (n, c, h * w);
        let out = match s1 {
            CpuStorage::F32(_) => CpuStorage::F32(self.fwd::<f32>(
                contiguous(s1, l1, BN_OP, "input")?,
                contiguous(s2, l2, BN_OP, "gamma")?,
                contiguous(s3, l3, BN_OP, "beta")?,
                dims,
            )?),
            CpuStorage::F64(_) => CpuStorage::F64(self.fwd::<f64>(
                contiguous(s1, l1, BN_OP, "input")?,
                contiguous(s2, l2, BN_OP, "gamma")?,
                contiguous(s3, l3, BN_OP, "beta")?,
                dims,
            )?),
            // Mixed precision: half activations, f32 parameters; the f32 kernel between conversions (the CUDA
            // kernel also computes in f32).
            CpuStorage::F16(_) => {
                let x: Vec<f32> = contiguous::<half::f16>(s1, l1, BN_OP, "input")?.iter().map(|v| v.to_f32()).collect();
                let y =
                    self.fwd::<f32>(&x, contiguous(s2, l2, BN_OP, "gamma")?, contiguous(s3, l3, BN_OP, "beta")?, dims)?;
                CpuStorage::F16(y.into_iter().map(half::f16::from_f32).collect())
            }
            CpuStorage::BF16(_) => {
                let x: Vec<f32> =
                    contiguous::<half::bf16>(s1, l1, BN_OP, "input")?.iter().map(|v| v.to_f32()).collect();
                let y =
                    self.fwd::<f32>(&x, contiguous(s2, l2, BN_OP, "gamma")?, contiguous(s3, l3, BN_OP, "beta")?, dims)?;
                CpuStorage::BF16(y.into_iter().map(half::bf16::from_f32).collect())
            }
            _ => candle_core::bail!("{BN_OP}: only f32, f64, and f16 or bf16 with f32 parameters are supported"),
        };
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n, c, h, w) = nchw(l1.shape(), BN_OP)?;
        let (y, st) = cuda::forward((s1, l1), (s2, l2), (s3, l3), (n, c, h * w), self.eps)?;
        // A second forward through the same op value would be a caller bug; keep the first statistics then.
        let _ = self.device_stats.set(st);
        Ok((y, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let Some(st) = self.device_stats.get() else {
                candle_core::bail!("{BN_OP}: backward before forward");
            };
            let c = gamma.dim(0)?;
            let (dx, dgb) = cuda::backward(x, grad, gamma, st)?;
            return Ok((Some(dx), Some(dgb.narrow(0, 0, c)?), Some(dgb.narrow(0, c, c)?)));
        }
        let twin = || match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, gamma, beta, grad),
            DType::F64 => self.bwd_typed::<f64>(x, gamma, beta, grad),
            // Mixed precision: the f32 backward of the widened activations; dx in their dtype, dγ and dβ in f32.
            half @ (DType::F16 | DType::BF16) => {
                let [dx, dg, db] =
                    self.bwd_typed::<f32>(&x.to_dtype(DType::F32)?, gamma, beta, &grad.to_dtype(DType::F32)?)?;
                Ok([dx.to_dtype(half)?, dg, db])
            }
            d => candle_core::bail!("{BN_OP}: unsupported dtype {d:?}"),
        };
        let [dx, dg, db] = if crate::ledger::model_cuda() {
            // The CUDA path's three kernels (`cuda::backward`: partial sums, their reduction, dx) writing dx and
            // one (2C,) buffer of dγ, dβ.
            let out = candle_core::ledger::paused(twin)?;
            crate::ledger::record_kernel(BN_BWD_LEDGER, 3, &[x, grad, gamma], &[&out[0], &out[1], &out[2]]);
            out
        } else {
            twin()?
        };
        Ok((Some(dx), Some(dg), Some(db)))
    }
}

/// Training-mode `SiLU(BatchNorm2d(x))` with batch statistics: returns `(y, mean, var)`, where `mean` and the
/// biased `var` are the per-channel batch statistics, shape `(C,)`, detached (for the running-stat update).
///
/// `x` is NCHW, `gamma`/`beta` have shape `(C,)` and `x`'s dtype, or f32 for f16 / bf16 activations (mixed
/// precision: `y` in the activations' dtype, the statistics in f32). The fused kernel runs for f32/f64 and for f16 /
/// bf16 activations (through f32) on the CPU and, with the `cuda` feature, for f32, f16 and bf16 activations on a
/// CUDA device (gradients for `x`, `gamma` and `beta`); mixed precision elsewhere runs the f32 op between casts, and
/// other devices and dtypes use [`batch_norm_silu_train_composed`].
pub fn batch_norm_silu_train(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, c, _, _) = nchw(x.shape(), BN_OP)?;
    // Mixed precision: half activations with f32 parameters.
    let mixed = matches!(x.dtype(), DType::F16 | DType::BF16) && gamma.dtype() == DType::F32;
    let param_dtype = if mixed { DType::F32 } else { x.dtype() };
    check_param(gamma, c, param_dtype, BN_OP, "gamma")?;
    check_param(beta, c, param_dtype, BN_OP, "beta")?;
    #[cfg(feature = "cuda")]
    if cuda::supports(x, gamma) {
        let device_stats = Arc::new(OnceLock::new());
        let op = BnSiluTrain { eps, stats: Arc::new(OnceLock::new()), device_stats: Arc::clone(&device_stats) };
        let y = x.contiguous()?.apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)?;
        let (Some(st), candle_core::Device::Cuda(dev)) = (device_stats.get(), x.device()) else {
            candle_core::bail!("{BN_OP}: the forward pass left no statistics");
        };
        let mv = cuda::mean_var(st, dev, c)?;
        return Ok((y, mv.narrow(0, 0, c)?, mv.narrow(0, c, c)?));
    }
    if mixed && !x.device().is_cpu() {
        // Off the CUDA kernels: the f32 op between two casts (differentiable), statistics in f32.
        let (y, mean, var) = batch_norm_silu_train(&x.to_dtype(DType::F32)?, gamma, beta, eps)?;
        return Ok((y.to_dtype(x.dtype())?, mean, var));
    }
    // The CPU kernel (half activations through f32) also stands for the CUDA one while the op ledger models a CUDA
    // device.
    let cpu_kernel = x.device().is_cpu() && (mixed || matches!(x.dtype(), DType::F32 | DType::F64));
    if !cpu_kernel || crate::ledger::model_composed_batch_norm() {
        return batch_norm_silu_train_composed(x, gamma, beta, eps);
    }
    let stats = Arc::new(OnceLock::new());
    let op = BnSiluTrain {
        eps,
        stats: Arc::clone(&stats),
        #[cfg(feature = "cuda")]
        device_stats: Arc::new(OnceLock::new()),
    };
    let y = x.contiguous()?.apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)?;
    let Some(st) = stats.get() else {
        candle_core::bail!("{BN_OP}: the forward pass left no statistics");
    };
    // The mean and the variance side by side in one tensor, as `cuda::mean_var` leaves them on CUDA.
    let stats = || -> Result<Tensor> {
        let mv: Vec<f64> = st.mean.iter().chain(&st.var).copied().collect();
        Tensor::new(mv.as_slice(), &Device::Cpu)?.to_dtype(param_dtype)
    };
    let mv = if crate::ledger::model_cuda() {
        // On CUDA the op's statistics kernel writes them into a buffer of their own, which the caller takes
        // (`cuda::mean_var`): no launch beyond the op's three, one allocation.
        let mv = candle_core::ledger::paused(stats)?;
        crate::ledger::record_kernel(BN_STATS_LEDGER, 0, &[], &[&mv]);
        mv
    } else {
        stats()?
    };
    Ok((y, mv.narrow(0, 0, c)?, mv.narrow(0, c, c)?))
}

/// The composed candle version of [`batch_norm_silu_train`] (the reference, and the fallback off the CPU).
pub fn batch_norm_silu_train_composed(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    eps: f64,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, c, _, _) = nchw(x.shape(), BN_OP)?;
    let mean = x.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
    let centred = x.broadcast_sub(&mean)?;
    let var = centred.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
    let inv = (var.clone() + eps)?.sqrt()?.recip()?;
    let y = centred
        .broadcast_mul(&inv)?
        .broadcast_mul(&gamma.reshape((1, c, 1, 1))?)?
        .broadcast_add(&beta.reshape((1, c, 1, 1))?)?
        .silu()?;
    Ok((y, mean.detach().flatten_all()?, var.detach().flatten_all()?))
}
