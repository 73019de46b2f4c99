//! Element-wise binary cross-entropy with logits as one candle custom op: PyTorch's
//! `BCEWithLogitsLoss(reduction="none")`, `max(x, 0) − x·z + log(1 + e^{−|x|})`, finite for any logit.
//!
//! YOLOv8's class loss evaluates it over every anchor and class (`B × nc × A`: 1.3 M elements for 80 classes at
//! 320 px, batch 8). Composed from candle ops that is nine passes forward with a buffer each, and their backward;
//! here it is one pass forward and one backward, `∂/∂x = σ(x) − z`. The targets get no gradient (they are
//! assigner outputs, detached). Other devices and dtypes use [`bce_with_logits_composed`], also the tests'
//! reference; the loss itself, which needs only the sum against one-hot targets and holds `σ(x)` already, takes
//! [`bce_with_logits_sum_one_hot`]: on a device a few passes from the probabilities and a one-op gradient, or, on the
//! opt-in device path `fused_bce`, [`bce_with_logits_sum_one_hot_kernel`]: one pass each way (`loss/kernels.cu`).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};
use multiversion::multiversion;
use rayon::prelude::*;

use crate::norm::{Elem, contiguous, fused_supported, with_cpu_slice};

const BCE_OP: &str = "bce_with_logits";
/// Elements per rayon task.
const CHUNK: usize = 16 * 1024;

/// `y = max(x, 0) − x·z + ln(1 + e^{−|x|})` over one chunk.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn chunk_fwd<T: Elem>(x: &[T], z: &[T], y: &mut [T]) {
    for ((yi, &xi), &zi) in y.iter_mut().zip(x).zip(z) {
        let a = if xi < T::zero() { T::zero() - xi } else { xi };
        let relu = if xi > T::zero() { xi } else { T::zero() };
        *yi = relu - xi * zi + (T::one() + (T::zero() - a).exp_fast()).ln_fast();
    }
}

/// `dx = g·(σ(x) − z)` over one chunk.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn chunk_bwd<T: Elem>(x: &[T], z: &[T], g: &[T], dx: &mut [T]) {
    for (((d, &xi), &zi), &gi) in dx.iter_mut().zip(x).zip(z).zip(g) {
        let s = T::one() / (T::one() + (T::zero() - xi).exp_fast());
        *d = gi * (s - zi);
    }
}

#[derive(Debug, Clone, Copy)]
struct Bce;

impl Bce {
    fn fwd<T: Elem>(x: &[T], z: &[T]) -> Vec<T> {
        let mut y = vec![T::zero(); x.len()];
        y.par_chunks_mut(CHUNK)
            .zip(x.par_chunks(CHUNK).zip(z.par_chunks(CHUNK)))
            .for_each(|(ys, (xs, zs))| chunk_fwd(xs, zs, ys));
        y
    }

    fn bwd_typed<T: Elem>(x: &Tensor, z: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let (z, grad) = (z.contiguous()?, grad.contiguous()?);
        let mut dx = vec![T::zero(); x.elem_count()];
        with_cpu_slice::<T, _>(x, BCE_OP, "logits", |xv| {
            with_cpu_slice::<T, _>(&z, BCE_OP, "targets", |zv| {
                with_cpu_slice::<T, _>(&grad, BCE_OP, "gradient", |gv| {
                    dx.par_chunks_mut(CHUNK)
                        .zip(xv.par_chunks(CHUNK).zip(zv.par_chunks(CHUNK).zip(gv.par_chunks(CHUNK))))
                        .for_each(|(ds, (xs, (zs, gs)))| chunk_bwd(xs, zs, gs, ds))
                })
            })
        })???;
        Tensor::from_vec(dx, x.shape(), &Device::Cpu)
    }
}

impl CustomOp2 for Bce {
    fn name(&self) -> &'static str {
        BCE_OP
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!("{BCE_OP}: logits {:?} and targets {:?} differ", l1.shape(), l2.shape());
        }
        let out = match (s1, s2) {
            (CpuStorage::F32(_), CpuStorage::F32(_)) => CpuStorage::F32(Bce::fwd::<f32>(
                contiguous(s1, l1, BCE_OP, "logits")?,
                contiguous(s2, l2, BCE_OP, "targets")?,
            )),
            (CpuStorage::F64(_), CpuStorage::F64(_)) => CpuStorage::F64(Bce::fwd::<f64>(
                contiguous(s1, l1, BCE_OP, "logits")?,
                contiguous(s2, l2, BCE_OP, "targets")?,
            )),
            _ => candle_core::bail!("{BCE_OP}: logits and targets must both be f32 or both f64"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, z: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dx = match x.dtype() {
            DType::F32 => Bce::bwd_typed::<f32>(x, z, grad)?,
            DType::F64 => Bce::bwd_typed::<f64>(x, z, grad)?,
            d => candle_core::bail!("{BCE_OP}: unsupported dtype {d:?}"),
        };
        Ok((Some(dx), None))
    }
}

/// Element-wise BCE with logits `x` against targets `z` (same shape), differentiable in `x`; `z` gets no
/// gradient. Fused on f32/f64 CPU storage; [`bce_with_logits_composed`] elsewhere.
pub fn bce_with_logits(x: &Tensor, z: &Tensor) -> Result<Tensor> {
    if !fused_supported(x) || x.dtype() != z.dtype() || x.shape() != z.shape() {
        return bce_with_logits_composed(x, z);
    }
    x.contiguous()?.apply_op2(&z.detach().contiguous()?, Bce)
}

/// One-hot weighted targets `(B, C, A)` of a class loss: `z[b, c, a] = weight[b, a]` for `c = label[b, a]`, else 0.
/// `label` `(B, A)` u32 below `C` (the dataset's classes are checked against `C` when loaded), `weight` `(B, A)` of
/// the targets' dtype; the same values as `onehot(label) · weight`, in one zero fill and one scatter.
pub fn one_hot_targets(label: &Tensor, weight: &Tensor, classes: usize) -> Result<Tensor> {
    let (b, a) = label.dims2()?;
    let z = Tensor::zeros((b, classes, a), weight.dtype(), weight.device())?;
    z.scatter_add_set(&label.unsqueeze(1)?, &weight.detach().unsqueeze(1)?, 1)?;
    Ok(z)
}

/// The sum of [`bce_with_logits`] of `x` `(B, C, A)` against [`one_hot_targets`] of `label` and `weight`, for a
/// caller that holds `p = σ(x)` already (the loss's assigner needs the probabilities): the fused op's sum on
/// f32/f64 CPU storage, elsewhere [`bce_with_logits_sum_one_hot_given_probs`]. A scalar of `x`'s dtype.
pub fn bce_with_logits_sum_one_hot(x: &Tensor, label: &Tensor, weight: &Tensor, p: &Tensor) -> Result<Tensor> {
    if fused_supported(x) && x.dtype() == weight.dtype() {
        let z = one_hot_targets(label, weight, x.dim(1)?)?;
        return bce_with_logits(x, &z)?.sum_all();
    }
    bce_with_logits_sum_one_hot_given_probs(x, label, weight, p)
}

/// [`bce_with_logits_sum_given_probs`] against one-hot weighted targets: `Σ x·z` is read as
/// `Σ weight · x[label]`, one gather, instead of a product over `x`'s size.
pub fn bce_with_logits_sum_one_hot_given_probs(
    x: &Tensor,
    label: &Tensor,
    weight: &Tensor,
    p: &Tensor,
) -> Result<Tensor> {
    let z = one_hot_targets(label, weight, x.dim(1)?)?;
    let x_dot_z = (x.detach().gather(&label.unsqueeze(1)?, 1)?.squeeze(1)? * weight.detach())?.sum_all()?;
    sum_given_probs(x, &z, p, &x_dot_z)
}

/// The sum of BCE with logits from candle's ops, in fewer passes over `x`'s size than the composed form, with a
/// one-op backward. `p` is `σ(x)` (its gradient is not taken), `z` gets no gradient.
///
/// The value is `Σ max(x, 0) − Σ x·z − Σ ln max(p, 1 − p)`: `ln(1 + e^{−|x|}) = −ln σ(|x|)` and
/// `σ(|x|) = max(σ(x), 1 − σ(x))`, so the probabilities already at hand stand in for `abs`, `neg`, `exp`, `+1`;
/// `max(p, 1 − p) ≥ ½` keeps the logarithm finite for any logit, and each element's three terms are summed apart,
/// which reads `x`'s size instead of writing it. It equals the composed form's sum up to rounding.
///
/// The gradient reaches `x` as `g·(p − z)` (PyTorch's) through `S − Ŝ`, `S = Σ x·(p − z)` and `Ŝ` the same value
/// detached: exactly zero in value for a finite `S`, so the value above is unchanged. The composed form's own backward
/// runs about twenty passes over `x`'s size (the derivatives of `abs`, `exp`, `log` and `relu`, and their sums);
/// this is one.
pub fn bce_with_logits_sum_given_probs(x: &Tensor, z: &Tensor, p: &Tensor) -> Result<Tensor> {
    let z = z.detach();
    let x_dot_z = (x.detach() * &z)?.sum_all()?;
    sum_given_probs(x, &z, p, &x_dot_z)
}

/// [`bce_with_logits_sum_given_probs`] with `Σ x·z` (detached) computed by the caller.
fn sum_given_probs(x: &Tensor, z: &Tensor, p: &Tensor, x_dot_z: &Tensor) -> Result<Tensor> {
    let (xd, pd) = (x.detach(), p.detach());
    let log_sigmoid_abs = pd.affine(-1.0, 1.0)?.maximum(&pd)?.log()?.sum_all()?;
    let value = ((xd.relu()?.sum_all()? - x_dot_z)? - log_sigmoid_abs)?;
    if !x.track_op() {
        return Ok(value);
    }
    let s = (x * (&pd - z)?)?.sum_all()?;
    let zero = (&s - s.detach())?;
    value + zero
}

/// The same from candle's ops (differentiable in both arguments).
pub fn bce_with_logits_composed(x: &Tensor, z: &Tensor) -> Result<Tensor> {
    let softplus = (x.abs()?.neg()?.exp()? + 1.0)?.log()?;
    (x.relu()? - (x * z)?)? + softplus
}

#[cfg(feature = "cuda")]
mod cuda;

/// The CUDA C source of the one-kernel one-hot sum ([`bce_with_logits_sum_one_hot_kernel`]).
pub const CUDA_SOURCE: &str = include_str!("loss/kernels.cu");

const ONE_HOT_OP: &str = "bce_with_logits_sum_one_hot";
/// The ledger's name of the one-kernel sum's backward.
const ONE_HOT_BWD_LEDGER: &str = "custom-bwd:bce_with_logits_sum_one_hot";

/// The one-kernel sum of `(x, p, weight)`; the op holds the labels (`(B, A)` u32), which get no gradient.
struct BceSumOneHot {
    label: Tensor,
}

/// `(B, C, A)` of the logits, with the probabilities, labels and weights checked against it.
fn one_hot_dims(x: &Shape, p: &Shape, label: &Shape, weight: &Shape) -> Result<(usize, usize, usize)> {
    let (b, c, a) = x.dims3()?;
    if p != x || label.dims() != [b, a] || weight.dims() != [b, a] {
        candle_core::bail!(
            "{ONE_HOT_OP}: logits {x:?} need probabilities of their shape and labels and weights (B, A), got {p:?}, \
             {label:?} and {weight:?}"
        );
    }
    Ok((b, c, a))
}

/// The sum on the host: each `(b, c)` row's terms in f64, the rows in order (the same value every run).
fn one_hot_sum_twin(x: &[f32], p: &[f32], label: &[u32], weight: &[f32], (b, c, a): (usize, usize, usize)) -> f32 {
    let rows: Vec<f64> = (0..b * c)
        .into_par_iter()
        .map(|r| {
            let (bi, ci) = (r / c, r % c);
            let mut s = 0f64;
            for ai in 0..a {
                let (xi, pi) = (x[r * a + ai], p[r * a + ai]);
                let q = 1.0 - pi;
                let mut t = f64::from(if xi > 0.0 { xi } else { 0.0 }) - f64::from(if pi > q { pi } else { q }.ln());
                let anchor = bi * a + ai;
                if label[anchor] as usize == ci {
                    t -= f64::from(weight[anchor]) * f64::from(xi);
                }
                s += t;
            }
            s
        })
        .collect();
    rows.iter().sum::<f64>() as f32
}

/// `g · (p − z)` on the host.
fn one_hot_grad_twin(p: &[f32], label: &[u32], weight: &[f32], g: f32, (b, c, a): (usize, usize, usize)) -> Vec<f32> {
    let mut dx = vec![0f32; b * c * a];
    dx.par_chunks_mut(a.max(1)).enumerate().for_each(|(r, row)| {
        let (bi, ci) = (r / c.max(1), r % c.max(1));
        for (ai, d) in row.iter_mut().enumerate() {
            let anchor = bi * a + ai;
            let z = if label[anchor] as usize == ci { weight[anchor] } else { 0.0 };
            *d = g * (p[r * a + ai] - z);
        }
    });
    dx
}

impl CustomOp3 for BceSumOneHot {
    fn name(&self) -> &'static str {
        ONE_HOT_OP
    }

    /// The CUDA path: the blocks' partial sums, then their total.
    fn ledger_launches(&self) -> u64 {
        2
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
        let dims = one_hot_dims(l1.shape(), l2.shape(), self.label.shape(), l3.shape())?;
        // The labels' own storage: a read of the tensor would count as a read back to the host.
        let (ls, ll) = self.label.storage_and_layout();
        let candle_core::Storage::Cpu(ls) = &*ls else {
            candle_core::bail!("{ONE_HOT_OP}: the labels are not on the logits' device")
        };
        let sum = one_hot_sum_twin(
            contiguous::<f32>(s1, l1, ONE_HOT_OP, "logits")?,
            contiguous::<f32>(s2, l2, ONE_HOT_OP, "probabilities")?,
            contiguous::<u32>(ls, ll, ONE_HOT_OP, "labels")?,
            contiguous::<f32>(s3, l3, ONE_HOT_OP, "weights")?,
            dims,
        );
        Ok((CpuStorage::F32(vec![sum]), Shape::from(())))
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
        let dims = one_hot_dims(l1.shape(), l2.shape(), self.label.shape(), l3.shape())?;
        let (ls, ll) = self.label.storage_and_layout();
        let candle_core::Storage::Cuda(ls) = &*ls else {
            candle_core::bail!("{ONE_HOT_OP}: the labels are not on the logits' device")
        };
        let out = cuda::forward((s1, l1), (s2, l2), (ls, ll), (s3, l3), dims)?;
        Ok((out, Shape::from(())))
    }

    fn bwd(
        &self,
        x: &Tensor,
        p: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let dims = one_hot_dims(x.shape(), p.shape(), self.label.shape(), weight.shape())?;
        let grad = grad.contiguous()?;
        #[cfg(feature = "cuda")]
        if x.device().is_cuda() {
            let dx = {
                let (ps, pl) = p.storage_and_layout();
                let (ls, ll) = self.label.storage_and_layout();
                let (ws, wl) = weight.storage_and_layout();
                let (gs, gl) = grad.storage_and_layout();
                let (
                    candle_core::Storage::Cuda(ps),
                    candle_core::Storage::Cuda(ls),
                    candle_core::Storage::Cuda(ws),
                    candle_core::Storage::Cuda(gs),
                ) = (&*ps, &*ls, &*ws, &*gs)
                else {
                    candle_core::bail!("{ONE_HOT_OP}: backward on tensors off the device")
                };
                cuda::backward((ps, pl), (ls, ll), (ws, wl), (gs, gl), dims)?
            };
            let dx = Tensor::from_storage(
                candle_core::Storage::Cuda(dx),
                x.shape().clone(),
                candle_core::op::BackpropOp::none(),
                false,
            );
            return Ok((Some(dx), None, None));
        }
        let twin = || -> Result<Tensor> {
            let g: f32 = grad.to_vec0()?;
            let label: Vec<u32> = self.label.flatten_all()?.to_vec1()?;
            let dx =
                one_hot_grad_twin(&p.flatten_all()?.to_vec1()?, &label, &weight.flatten_all()?.to_vec1()?, g, dims);
            Tensor::from_vec(dx, x.shape(), x.device())
        };
        // The CUDA path's one kernel, whose twin runs unrecorded.
        let dx = candle_core::ledger::paused(twin)?;
        crate::ledger::record_kernel(ONE_HOT_BWD_LEDGER, 1, &[p, &self.label, weight, &grad], &[&dx]);
        Ok((Some(dx), None, None))
    }
}

/// [`bce_with_logits_sum_one_hot_given_probs`] in one kernel pass forward (two launches: block sums in f64, then
/// their total in a fixed order) and one backward (`g·(p − z)`), for f32 logits `x` `(B, C, A)`, probabilities `p`
/// (its shape), labels `(B, A)` u32 below `C` and weights `(B, A)`: the opt-in device path `fused_bce`. The
/// composed form reads and writes `x`'s size about twenty times; this reads `x` and `p` once each way. Its
/// value is the same sum in another order (f64 accumulation, then one rounding), its gradient the same values.
/// Elsewhere than CUDA its host twin runs (also the kernels' stand-in while the op ledger models a device).
pub fn bce_with_logits_sum_one_hot_kernel(x: &Tensor, label: &Tensor, weight: &Tensor, p: &Tensor) -> Result<Tensor> {
    if x.dtype() != DType::F32 || p.dtype() != DType::F32 || weight.dtype() != DType::F32 || label.dtype() != DType::U32
    {
        candle_core::bail!(
            "{ONE_HOT_OP}: f32 logits, probabilities and weights and u32 labels, got {:?}, {:?}, {:?} and {:?}",
            x.dtype(),
            p.dtype(),
            weight.dtype(),
            label.dtype()
        );
    }
    one_hot_dims(x.shape(), p.shape(), label.shape(), weight.shape())?;
    let op = BceSumOneHot { label: label.detach().contiguous()? };
    x.contiguous()?.apply_op3(&p.detach().contiguous()?, &weight.detach().contiguous()?, op)
}
