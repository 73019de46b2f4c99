//! Training-mode BatchNorm fused with SiLU: one pass forward, one pass backward, as a candle custom op.
//!
//! YOLOv8's unit is Conv → BatchNorm → SiLU. Composed from candle primitives, the BatchNorm+SiLU part is about
//! fifteen element-wise and reduction ops, each a full sweep over the activation with its own allocation, forward
//! and again backward. Here it is:
//!
//! * [`batch_norm_silu_train`]: per-channel batch statistics (one sweep, f64 accumulators, shifted by the
//!   channel's first value so the sums stay well conditioned), then one sweep that normalises, applies
//!   `γ`/`β` and SiLU. Its backward recomputes `z = γ·x̂ + β` from the input and the saved statistics, sweeps once
//!   to get `dz = dy·SiLU'(z)` and the two per-channel sums, and once more to turn `dz` into `dx` in place.
//!   The batch mean and biased variance come back detached so the caller can update running statistics.
//! * [`affine_silu`]: the eval-mode `SiLU(x·scale[c] + shift[c])` in one sweep (with a backward too, since candle
//!   builds the graph for inference as well when the parameters are variables).
//!
//! Both run on contiguous f32/f64 CPU storage and parallelise over `(n, c)` planes with rayon's global pool (the
//! pool candle's own CPU kernels use, so the two never oversubscribe each other). With the `cuda` feature,
//! [`batch_norm_silu_train`] on f32 CUDA tensors runs the same sweeps as device kernels (`norm/cuda.rs`), its
//! statistics staying on the device. Anything else (another device or dtype) falls back to the composed candle
//! ops, which are also public ([`batch_norm_silu_train_composed`], [`affine_silu_composed`]) as the reference the
//! tests and benches compare against.
//!
//! The per-plane loops are compiled for AVX-512 and AVX2+FMA as well as baseline x86-64 and picked at run time
//! (`multiversion`). No clone contracts `a·b + c` into an FMA or reorders a sum, so every clone gives the same bits.

use std::mem::MaybeUninit;
use std::sync::{Arc, OnceLock};

use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Storage, Tensor, WithDType};
use multiversion::multiversion;
use rayon::prelude::*;

use crate::uninit::filled_vec;

#[cfg(feature = "cuda")]
mod cuda;

/// Lanes of the per-element loops: written as fixed-size arrays so LLVM vectorises them (one AVX-512 register of
/// f32, two AVX2 ones).
const LANES: usize = 16;
/// Elements whose sums are accumulated in the element type before being added into the f64 totals: each lane then
/// adds only `BLOCK / LANES` values in f32, and the loop stays in vector registers (converting every element to
/// f64 made LLVM shuffle lanes one by one).
const BLOCK: usize = 256;
/// Planes smaller than this are grouped into one rayon task.
const MIN_TASK_ELEMS: usize = 16 * 1024;

/// The element types the CPU kernels support (f32 and f64), with the few functions they need.
pub(crate) trait Elem: WithDType {
    /// `e^x`; for f32 a branch-free polynomial that vectorises (within 2 ulp of `f32::exp`).
    fn exp_fast(self) -> Self;
    /// `ln x` for `x > 0`; for f32 a branch-free polynomial that vectorises (within 2 ulp of `f32::ln`).
    fn ln_fast(self) -> Self;
    /// Whether the value is NaN.
    fn nan(self) -> bool;
}

impl Elem for f32 {
    #[inline(always)]
    fn exp_fast(self) -> Self {
        exp_f32(self)
    }

    #[inline(always)]
    fn ln_fast(self) -> Self {
        ln_f32(self)
    }

    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Elem for f64 {
    #[inline(always)]
    fn exp_fast(self) -> Self {
        self.exp()
    }

    #[inline(always)]
    fn ln_fast(self) -> Self {
        self.ln()
    }

    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

/// Cephes' `expf`: `2^n · e^r` with `n = round(x·log2 e)`, `|r| ≤ ln2/2` and a degree-6 polynomial; no branches,
/// no libm call, so loops over it vectorise. The argument is clamped to [−87.3, 88.7]: below, the result is the
/// smallest normal float instead of a subnormal or 0; above, `+∞`.
#[inline(always)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer for |v| < 2^22.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_55, 88.722_83);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let r2 = r * r;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r2 + r + 1.0;
    // 2^n through the exponent bits; n + 127 ∈ [1, 255] after the clamp (n = 128 gives +∞, as it should). `t`'s
    // bits are those of 1.5·2^23 plus n, so n comes out of them by integer arithmetic: `n as i32` (a saturating
    // cast) would not vectorise.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let bits = (ni.wrapping_add(127) as u32) << 23;
    e * f32::from_bits(bits)
}

/// Cephes' `logf` for positive normal `x`: `x = m·2^e` with `m ∈ [√½, √2)` from the bits, then
/// `ln m = (m − 1) − (m − 1)²/2 + (m − 1)³·P(m − 1)` with a degree-8 polynomial, plus `e·ln 2`; no branches.
#[inline(always)]
fn ln_f32(x: f32) -> f32 {
    const SQRT_HALF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 126;
    // Mantissa in [0.5, 1).
    let m = f32::from_bits((bits & 0x807f_ffff) | 0x3f00_0000);
    let small = m < SQRT_HALF;
    e -= i32::from(small);
    let r = if small { m + m - 1.0 } else { m - 1.0 };
    let ef = e as f32;
    let z = r * r;
    const P: [f32; 9] = [
        7.037_683_6e-2,
        -1.151_461e-1,
        1.167_699_9e-1,
        -1.242_014_1e-1,
        1.424_932_3e-1,
        -1.666_805_8e-1,
        2.000_071_4e-1,
        -2.499_999_4e-1,
        3.333_333e-1,
    ];
    let p = P.iter().fold(0.0, |acc, &c| acc * r + c);
    let y = r * z * p - 2.121_944_4e-4 * ef - 0.5 * z;
    r + y + 0.693_359_4 * ef
}

/// `SiLU(z) = z·σ(z)`.
#[inline(always)]
fn silu<T: Elem>(z: T) -> T {
    z / (T::one() + (T::zero() - z).exp_fast())
}

/// `SiLU'(z) = σ(z)·(1 + z·(1 − σ(z)))`.
#[inline(always)]
fn silu_grad<T: Elem>(z: T) -> T {
    let s = T::one() / (T::one() + (T::zero() - z).exp_fast());
    s * (T::one() + z * (T::one() - s))
}

/// The contiguous part of a storage a layout describes, or an error naming the op and the operand.
pub(crate) fn contiguous<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [T]> {
    let v = T::cpu_storage_as_slice(s)?;
    match l.contiguous_offsets() {
        Some((a, b)) if b <= v.len() => Ok(&v[a..b]),
        _ => candle_core::bail!("{op}: {what} is not contiguous (layout {l:?})"),
    }
}

/// Runs `f` on the contiguous CPU data of `t` (an error for another device or a strided layout).
pub(crate) fn with_cpu_slice<T: WithDType, R>(
    t: &Tensor,
    op: &str,
    what: &str,
    f: impl FnOnce(&[T]) -> R,
) -> Result<R> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(s) => Ok(f(contiguous::<T>(s, layout, op, what)?)),
        _ => candle_core::bail!("{op}: {what} is not on the CPU"),
    }
}

/// Whether the fused CPU kernels handle this tensor (CPU storage, f32 or f64).
pub(crate) fn fused_supported(x: &Tensor) -> bool {
    matches!(x.device(), Device::Cpu) && matches!(x.dtype(), DType::F32 | DType::F64)
}

/// `(n, c, h·w)` of an NCHW shape, or an error naming the op.
pub(crate) fn nchw(shape: &Shape, op: &str) -> Result<(usize, usize, usize, usize)> {
    match shape.dims() {
        &[n, c, h, w] => Ok((n, c, h, w)),
        d => candle_core::bail!("{op}: expected an NCHW tensor, got shape {d:?}"),
    }
}

/// Checks that a per-channel parameter has shape `(c,)` and the input's dtype.
fn check_param(p: &Tensor, c: usize, dtype: DType, op: &str, what: &str) -> Result<()> {
    if p.dims() != [c] {
        candle_core::bail!("{op}: {what} has shape {:?}, expected ({c},)", p.dims());
    }
    if p.dtype() != dtype {
        candle_core::bail!("{op}: {what} is {:?}, the input {dtype:?}", p.dtype());
    }
    Ok(())
}

/// Rayon task granularity (in planes) for planes of `hw` elements.
fn min_planes(hw: usize) -> usize {
    MIN_TASK_ELEMS.div_ceil(hw.max(1)).max(1)
}

// ---------------------------------------------------------------------------------------------------------------
// Plane kernels.

/// Per-plane sums `(Σ(x−k), Σ(x−k)²)` in f64, `k` the channel's shift.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn plane_moments<T: Elem>(x: &[T], k: T) -> (f64, f64) {
    let (mut a, mut b) = (0f64, 0f64);
    for blk in x.chunks(BLOCK) {
        let mut s1 = [T::zero(); LANES];
        let mut s2 = [T::zero(); LANES];
        let mut chunks = blk.chunks_exact(LANES);
        for ch in &mut chunks {
            for l in 0..LANES {
                let d = ch[l] - k;
                s1[l] += d;
                s2[l] += d * d;
            }
        }
        let (mut p1, mut p2) = lane_sums(&s1, &s2);
        for &v in chunks.remainder() {
            let d = v - k;
            p1 += d;
            p2 += d * d;
        }
        a += p1.to_f64();
        b += p2.to_f64();
    }
    (a, b)
}

/// The sums of two lane arrays, in lane order.
#[inline(always)]
fn lane_sums<T: Elem>(s1: &[T; LANES], s2: &[T; LANES]) -> (T, T) {
    let (mut p1, mut p2) = (T::zero(), T::zero());
    for l in 0..LANES {
        p1 += s1[l];
        p2 += s2[l];
    }
    (p1, p2)
}

/// `x = SiLU(x)` in place: the inference epilogue of [`crate::conv::conv2d_bias_silu`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(crate) fn silu_in_place<T: Elem>(x: &mut [T]) {
    for v in x.iter_mut() {
        *v = silu(*v);
    }
}

/// `y = SiLU(x·a + b)` over one plane.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn plane_affine_silu<T: Elem>(x: &[T], y: &mut [MaybeUninit<T>], a: T, b: T) {
    for (yo, &xi) in y.iter_mut().zip(x) {
        yo.write(silu(xi * a + b));
    }
}

/// One plane of the backward sweep: `dz = g·SiLU'(x·a + b)`, writes `out = dz·out_scale`, returns
/// `(Σ dz, Σ dz·(x − m))` in f64.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn plane_dz<T: Elem>(x: &[T], g: &[T], out: &mut [MaybeUninit<T>], a: T, b: T, m: T, out_scale: T) -> (f64, f64) {
    let (mut r0, mut r1) = (0f64, 0f64);
    for ((xb, gb), ob) in x.chunks(BLOCK).zip(g.chunks(BLOCK)).zip(out.chunks_mut(BLOCK)) {
        let mut s0 = [T::zero(); LANES];
        let mut s1 = [T::zero(); LANES];
        let mut xc = xb.chunks_exact(LANES);
        let mut gc = gb.chunks_exact(LANES);
        let mut oc = ob.chunks_exact_mut(LANES);
        for ((xs, gs), os) in (&mut xc).zip(&mut gc).zip(&mut oc) {
            for l in 0..LANES {
                let dz = gs[l] * silu_grad(xs[l] * a + b);
                os[l].write(dz * out_scale);
                s0[l] += dz;
                s1[l] += dz * (xs[l] - m);
            }
        }
        let (mut p0, mut p1) = lane_sums(&s0, &s1);
        for ((&xi, &gi), o) in xc.remainder().iter().zip(gc.remainder()).zip(oc.into_remainder()) {
            let dz = gi * silu_grad(xi * a + b);
            o.write(dz * out_scale);
            p0 += dz;
            p1 += dz * (xi - m);
        }
        r0 += p0.to_f64();
        r1 += p1.to_f64();
    }
    (r0, r1)
}

/// The backward's second sweep over one plane, in place: `d = k·d − k0 − k1·(x − m)`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn plane_dx<T: Elem>(x: &[T], d: &mut [T], (k, k0, k1, m): (T, T, T, T)) {
    for (d, &xi) in d.iter_mut().zip(x) {
        *d = k * *d - k0 - k1 * (xi - m);
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Training-mode BatchNorm + SiLU.

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

impl CustomOp3 for BnSiluTrain {
    fn name(&self) -> &'static str {
        BN_OP
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
            _ => candle_core::bail!("{BN_OP}: only f32 and f64 are supported"),
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
        let [dx, dg, db] = match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, gamma, beta, grad)?,
            DType::F64 => self.bwd_typed::<f64>(x, gamma, beta, grad)?,
            d => candle_core::bail!("{BN_OP}: unsupported dtype {d:?}"),
        };
        Ok((Some(dx), Some(dg), Some(db)))
    }
}

/// Training-mode `SiLU(BatchNorm2d(x))` with batch statistics: returns `(y, mean, var)`, where `mean` and the
/// biased `var` are the per-channel batch statistics, shape `(C,)`, detached (for the running-stat update).
///
/// `x` is NCHW, `gamma`/`beta` have shape `(C,)` and `x`'s dtype. The fused kernel runs for f32/f64 on the CPU
/// and, with the `cuda` feature, for f32 on a CUDA device (gradients for `x`, `gamma` and `beta`); other devices
/// and dtypes use [`batch_norm_silu_train_composed`].
pub fn batch_norm_silu_train(x: &Tensor, gamma: &Tensor, beta: &Tensor, eps: f64) -> Result<(Tensor, Tensor, Tensor)> {
    let (_, c, _, _) = nchw(x.shape(), BN_OP)?;
    check_param(gamma, c, x.dtype(), BN_OP, "gamma")?;
    check_param(beta, c, x.dtype(), BN_OP, "beta")?;
    #[cfg(feature = "cuda")]
    if cuda::supports(x) {
        let device_stats = Arc::new(OnceLock::new());
        let op = BnSiluTrain { eps, stats: Arc::new(OnceLock::new()), device_stats: Arc::clone(&device_stats) };
        let y = x.contiguous()?.apply_op3(&gamma.contiguous()?, &beta.contiguous()?, op)?;
        let (Some(st), candle_core::Device::Cuda(dev)) = (device_stats.get(), x.device()) else {
            candle_core::bail!("{BN_OP}: the forward pass left no statistics");
        };
        let mv = cuda::mean_var(st, dev, c)?;
        return Ok((y, mv.narrow(0, 0, c)?, mv.narrow(0, c, c)?));
    }
    if !fused_supported(x) {
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
    let mean = Tensor::new(st.mean.as_slice(), &Device::Cpu)?.to_dtype(x.dtype())?;
    let var = Tensor::new(st.var.as_slice(), &Device::Cpu)?.to_dtype(x.dtype())?;
    Ok((y, mean, var))
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

// ---------------------------------------------------------------------------------------------------------------
// Eval-mode affine + SiLU.

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

    #[test]
    fn ln_f32_matches_std() {
        let mut worst = 0f32;
        let mut x = 1e-30f32;
        while x < 1e30 {
            for v in [x, x * 1.37, x * 1.9999] {
                let (got, want) = (ln_f32(v), v.ln());
                worst = worst.max((got - want).abs() / want.abs().max(1e-6));
            }
            x *= 1.01;
        }
        for v in [1.0f32, 2.0, 0.5, std::f32::consts::SQRT_2, 1.0 + f32::EPSILON, 1.5] {
            assert!((ln_f32(v) - v.ln()).abs() <= 2.0 * f32::EPSILON * v.ln().abs().max(1.0), "{v}");
        }
        assert!(worst < 1e-6, "worst relative error {worst:e}");
    }

    #[test]
    fn exp_f32_matches_std_over_its_range() {
        let mut worst = 0f32;
        for i in -7_900..=8_000 {
            let x = i as f32 / 91.0;
            let (a, b) = (exp_f32(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
        }
        assert!(worst < 2.5e-7, "worst relative error {worst:e}");
        assert!(exp_f32(-1000.0) < 1e-37);
        assert!(exp_f32(1000.0).is_infinite());
        // SiLU saturates cleanly at both ends.
        assert_eq!(silu(-200f32), -0.0);
        assert_eq!(silu(200f32), 200.0);
    }

    #[test]
    fn rejects_bad_shapes_and_dtypes() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((2, 3, 4, 4), DType::F32, &dev).unwrap();
        let g = Tensor::ones(3, DType::F32, &dev).unwrap();
        let bad = Tensor::ones(4, DType::F32, &dev).unwrap();
        assert!(batch_norm_silu_train(&x, &bad, &g, 1e-3).is_err());
        assert!(batch_norm_silu_train(&x, &g.to_dtype(DType::F64).unwrap(), &g, 1e-3).is_err());
        assert!(affine_silu(&x.flatten_all().unwrap(), &g, &g).is_err());
        let empty = Tensor::zeros((0, 3, 4, 4), DType::F32, &dev).unwrap();
        assert!(batch_norm_silu_train(&empty, &g, &g, 1e-3).is_err());
    }
}
