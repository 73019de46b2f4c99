//! The optimizer's per-parameter update as one parallel pass on the CPU. Written as candle tensor ops, torch's SGD
//! with Nesterov momentum is eight element-wise passes over each parameter (`g + wd·p`, `m·buf + d`, `d + m·buf`,
//! `p − lr·d`, each an affine and a binary op), and candle 0.11 runs them on the calling thread: about 4% of a
//! YOLOv8n training step at 320/b8 on 2 cores. [`sgd_nesterov`] computes the same float operations in the same
//! order, element by element in rayon tasks, so its results equal the composed ops' bit for bit. [`adam`] does the
//! same for torch's Adam and AdamW (a dozen passes composed), which streams well over a parameter group's whole
//! buffer where a chain of composed passes would read and write it a dozen times.

use std::mem::MaybeUninit;

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use crate::norm::with_cpu_slice;
use crate::uninit::filled_vec;

/// Elements per rayon task.
const CHUNK: usize = 16 * 1024;

/// Hyper-parameters of one SGD update (torch's `lr`, `momentum`, `weight_decay`; Nesterov).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SgdStep {
    /// Learning rate.
    pub lr: f64,
    /// Momentum (0: plain SGD, no buffer).
    pub momentum: f64,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f64,
}

/// One `torch.optim.SGD(nesterov=True)` update of a contiguous f32 CPU parameter `p` with gradient `g` and momentum
/// buffer `buf` (`None` before the first step): returns `(new_p, new_buf)` (`new_buf` is `None` without momentum),
/// or `Ok(None)` when the tensors are not contiguous f32 CPU tensors of one shape (the caller then uses tensor ops).
///
/// Per element, as torch and the composed candle ops compute it (`affine(a, 0)` is `x·a + 0`):
/// `d = g + (p·wd + 0)`; `b = (buf·m + 0) + d` (first step: `b = d`); `d' = d + (b·m + 0)`; `p' = p + (d'·(−lr) + 0)`.
pub fn sgd_nesterov(
    p: &Tensor,
    g: &Tensor,
    buf: Option<&Tensor>,
    h: SgdStep,
) -> Result<Option<(Tensor, Option<Tensor>)>> {
    let ok = |t: &Tensor| {
        crate::ledger::host_paths(t.device()) && t.dtype() == DType::F32 && t.is_contiguous() && t.dims() == p.dims()
    };
    if !(ok(p) && ok(g) && buf.is_none_or(ok)) {
        return Ok(None);
    }
    let (wd, m, neg_lr) = (h.weight_decay as f32, h.momentum as f32, -h.lr as f32);
    let n = p.elem_count();
    let op = "sgd_nesterov";
    let keep_buf = h.momentum != 0.0;
    let run = |pv: &[f32], gv: &[f32], bv: Option<&[f32]>| -> (Vec<f32>, Vec<f32>) {
        let mut new_b = Vec::with_capacity(if keep_buf { n } else { 0 });
        // Every element of both outputs is written by its chunk's loop.
        let new_p = filled_vec(n, |out_p| {
            let out_b = &mut new_b.spare_capacity_mut()[..if keep_buf { n } else { 0 }];
            let c = SgdConsts { wd, m, neg_lr };
            let decay = h.weight_decay != 0.0;
            // One branch-free loop per case, so that the compiler vectorises it.
            let update = |i0: usize, op_: &mut [MaybeUninit<f32>], ob: &mut [MaybeUninit<f32>]| {
                let r = i0..i0 + op_.len();
                let (pv, gv, bv) = (&pv[r.clone()], &gv[r.clone()], bv.map(|b| &b[r.clone()]));
                match (decay, keep_buf, bv) {
                    (false, false, _) => sgd_chunk::<false, false, false>(pv, gv, None, op_, ob, &c),
                    (true, false, _) => sgd_chunk::<true, false, false>(pv, gv, None, op_, ob, &c),
                    (false, true, None) => sgd_chunk::<false, true, false>(pv, gv, None, op_, ob, &c),
                    (true, true, None) => sgd_chunk::<true, true, false>(pv, gv, None, op_, ob, &c),
                    (false, true, Some(bv)) => sgd_chunk::<false, true, true>(pv, gv, Some(bv), op_, ob, &c),
                    (true, true, Some(bv)) => sgd_chunk::<true, true, true>(pv, gv, Some(bv), op_, ob, &c),
                }
            };
            if keep_buf {
                out_p
                    .par_chunks_mut(CHUNK)
                    .zip(out_b.par_chunks_mut(CHUNK))
                    .enumerate()
                    .for_each(|(c, (a, b))| update(c * CHUNK, a, b));
            } else {
                out_p.par_chunks_mut(CHUNK).enumerate().for_each(|(c, a)| update(c * CHUNK, a, &mut []));
            }
        });
        if keep_buf {
            // SAFETY: the loop above wrote every one of the n buffer elements (with momentum, out_b has n of them).
            unsafe { new_b.set_len(n) };
        }
        (new_p, new_b)
    };
    let (new_p, new_b) = match buf {
        Some(b) => with_cpu_slice::<f32, _>(p, op, "parameter", |pv| {
            with_cpu_slice::<f32, _>(g, op, "gradient", |gv| {
                with_cpu_slice::<f32, _>(b, op, "momentum buffer", |bv| run(pv, gv, Some(bv)))
            })
        })???,
        None => with_cpu_slice::<f32, _>(p, op, "parameter", |pv| {
            with_cpu_slice::<f32, _>(g, op, "gradient", |gv| run(pv, gv, None))
        })??,
    };
    let dev = Device::Cpu;
    let new_p = Tensor::from_vec(new_p, p.shape(), &dev)?;
    let new_b = if keep_buf { Some(Tensor::from_vec(new_b, p.shape(), &dev)?) } else { None };
    Ok(Some((new_p, new_b)))
}

/// [`sgd_nesterov`]'s factors, rounded to f32 as `affine` rounds them.
struct SgdConsts {
    wd: f32,
    m: f32,
    neg_lr: f32,
}

/// [`sgd_nesterov`] over one chunk: `DECAY` with weight decay, `MOMENTUM` with a buffer to write (`ob`), `BUF`
/// when the previous buffer exists (not the first step).
#[inline(always)]
fn sgd_chunk<const DECAY: bool, const MOMENTUM: bool, const BUF: bool>(
    pv: &[f32],
    gv: &[f32],
    bv: Option<&[f32]>,
    op: &mut [MaybeUninit<f32>],
    ob: &mut [MaybeUninit<f32>],
    c: &SgdConsts,
) {
    let n = op.len();
    let (pv, gv) = (&pv[..n], &gv[..n]);
    let bv = &bv.unwrap_or(gv)[..n];
    let ob = &mut ob[..if MOMENTUM { n } else { 0 }];
    for i in 0..n {
        let mut d = gv[i];
        if DECAY {
            d += pv[i] * c.wd + 0.0;
        }
        if MOMENTUM {
            let b = if BUF { (bv[i] * c.m + 0.0) + d } else { d };
            ob[i].write(b);
            d += b * c.m + 0.0;
        }
        op[i].write(pv[i] + (d * c.neg_lr + 0.0));
    }
}

/// Hyper-parameters of one `torch.optim.Adam` / `AdamW` update (no AMSGrad), at step `step` (counted from 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    /// β1 (Ultralytics' momentum).
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Weight decay: AdamW's decoupled `p·(1 − lr·wd)`, Adam's `g + wd·p`.
    pub weight_decay: f64,
    /// AdamW (decoupled decay) rather than Adam.
    pub decoupled: bool,
    /// The step number after this update's increment (the bias corrections').
    pub step: u64,
}

/// One Adam / AdamW update of a contiguous f32 CPU parameter `p` with gradient `g`, first moment `m` and second
/// moment `v` (both `None` before the first step): returns `(new_p, new_m, new_v)`, or `Ok(None)` when the tensors
/// are not contiguous f32 CPU tensors of one shape or only one moment is given (the caller then uses tensor ops).
///
/// Per element, as torch and the composed candle ops compute it (`affine(a, b)` is `x·a + b`): AdamW
/// `p = p·(1 − lr·wd) + 0`, Adam `g = g + (p·wd + 0)`; `m' = m + ((g − m)·(1 − β1) + 0)` (first step:
/// `g·(1 − β1) + 0`); `v' = (v·β2 + 0) + ((g·g)·(1 − β2) + 0)` (first step: the second term); `d = √v'·(1/√bc2) + ε`;
/// `p' = p + ((m'/d)·(−lr/bc1) + 0)`, with `bc1 = 1 − β1ᵗ`, `bc2 = 1 − β2ᵗ` in f64 and every factor rounded to f32 as
/// `affine` rounds it.
pub fn adam(
    p: &Tensor,
    g: &Tensor,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
    h: AdamStep,
) -> Result<Option<(Tensor, Tensor, Tensor)>> {
    let ok = |t: &Tensor| {
        crate::ledger::host_paths(t.device()) && t.dtype() == DType::F32 && t.is_contiguous() && t.dims() == p.dims()
    };
    if !(ok(p) && ok(g) && m.is_none_or(ok) && v.is_none_or(ok)) || m.is_some() != v.is_some() {
        return Ok(None);
    }
    let t = h.step as f64;
    let (bc1, bc2) = (1.0 - h.beta1.powf(t), 1.0 - h.beta2.powf(t));
    let decay = if h.decoupled { 1.0 - h.lr * h.weight_decay } else { h.weight_decay };
    let (decay, one_b1, b2, one_b2) = (decay as f32, (1.0 - h.beta1) as f32, h.beta2 as f32, (1.0 - h.beta2) as f32);
    let (inv_sqrt_bc2, eps, neg_step) = ((1.0 / bc2.sqrt()) as f32, h.eps as f32, (-(h.lr / bc1)) as f32);
    let n = p.elem_count();
    let op = "adam";
    let run = |pv: &[f32], gv: &[f32], mv: Option<(&[f32], &[f32])>| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (mut new_m, mut new_v) = (Vec::with_capacity(n), Vec::with_capacity(n));
        // Every element of the three outputs is written by its chunk's loop.
        let new_p = filled_vec(n, |out_p| {
            let (out_m, out_v) = (&mut new_m.spare_capacity_mut()[..n], &mut new_v.spare_capacity_mut()[..n]);
            let c = AdamConsts { decay, one_b1, b2, one_b2, inv_sqrt_bc2, eps, neg_step };
            let decay_kind = match (h.weight_decay != 0.0, h.decoupled) {
                (false, _) => DECAY_NONE,
                (true, true) => DECAY_DECOUPLED,
                (true, false) => DECAY_L2,
            };
            out_p
                .par_chunks_mut(CHUNK)
                .zip(out_m.par_chunks_mut(CHUNK))
                .zip(out_v.par_chunks_mut(CHUNK))
                .enumerate()
                .for_each(|(k, ((op_, om), ov))| {
                    let r = k * CHUNK..k * CHUNK + op_.len();
                    let (pv, gv) = (&pv[r.clone()], &gv[r.clone()]);
                    let mv = mv.map(|(m, v)| (&m[r.clone()], &v[r.clone()]));
                    // One branch-free loop per case, so that the compiler vectorises it (square root and division
                    // included: the vector instructions round as the scalar ones).
                    match (mv, decay_kind) {
                        (None, DECAY_NONE) => adam_chunk::<false, DECAY_NONE>(pv, gv, None, op_, om, ov, &c),
                        (None, DECAY_DECOUPLED) => adam_chunk::<false, DECAY_DECOUPLED>(pv, gv, None, op_, om, ov, &c),
                        (None, _) => adam_chunk::<false, DECAY_L2>(pv, gv, None, op_, om, ov, &c),
                        (Some(mv), DECAY_NONE) => adam_chunk::<true, DECAY_NONE>(pv, gv, Some(mv), op_, om, ov, &c),
                        (Some(mv), DECAY_DECOUPLED) => {
                            adam_chunk::<true, DECAY_DECOUPLED>(pv, gv, Some(mv), op_, om, ov, &c)
                        }
                        (Some(mv), _) => adam_chunk::<true, DECAY_L2>(pv, gv, Some(mv), op_, om, ov, &c),
                    }
                });
        });
        // SAFETY: the loop above wrote every one of the n elements of both moments.
        unsafe {
            new_m.set_len(n);
            new_v.set_len(n);
        }
        (new_p, new_m, new_v)
    };
    let (new_p, new_m, new_v) = match (m, v) {
        (Some(m), Some(v)) => with_cpu_slice::<f32, _>(p, op, "parameter", |pv| {
            with_cpu_slice::<f32, _>(g, op, "gradient", |gv| {
                with_cpu_slice::<f32, _>(m, op, "first moment", |mv| {
                    with_cpu_slice::<f32, _>(v, op, "second moment", |vv| run(pv, gv, Some((mv, vv))))
                })
            })
        })????,
        _ => with_cpu_slice::<f32, _>(p, op, "parameter", |pv| {
            with_cpu_slice::<f32, _>(g, op, "gradient", |gv| run(pv, gv, None))
        })??,
    };
    let dev = Device::Cpu;
    Ok(Some((
        Tensor::from_vec(new_p, p.shape(), &dev)?,
        Tensor::from_vec(new_m, p.shape(), &dev)?,
        Tensor::from_vec(new_v, p.shape(), &dev)?,
    )))
}

/// [`adam`]'s factors, each rounded to f32 as `affine` rounds it.
struct AdamConsts {
    decay: f32,
    one_b1: f32,
    b2: f32,
    one_b2: f32,
    inv_sqrt_bc2: f32,
    eps: f32,
    neg_step: f32,
}

const DECAY_NONE: u8 = 0;
const DECAY_DECOUPLED: u8 = 1;
const DECAY_L2: u8 = 2;

/// [`adam`] over one chunk: `MOMENTS` when the moments exist (not the first step), `DECAY` one of the `DECAY_*`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn adam_chunk<const MOMENTS: bool, const DECAY: u8>(
    pv: &[f32],
    gv: &[f32],
    mv: Option<(&[f32], &[f32])>,
    op: &mut [MaybeUninit<f32>],
    om: &mut [MaybeUninit<f32>],
    ov: &mut [MaybeUninit<f32>],
    c: &AdamConsts,
) {
    let n = op.len();
    let (pv, gv) = (&pv[..n], &gv[..n]);
    let (m0, v0) = mv.unwrap_or((gv, gv));
    let (m0, v0, om, ov) = (&m0[..n], &v0[..n], &mut om[..n], &mut ov[..n]);
    for i in 0..n {
        let (mut pi, mut gi) = (pv[i], gv[i]);
        if DECAY == DECAY_DECOUPLED {
            pi = pi * c.decay + 0.0;
        } else if DECAY == DECAY_L2 {
            gi += pi * c.decay + 0.0;
        }
        let g2 = (gi * gi) * c.one_b2 + 0.0;
        let (m1, v1) = if MOMENTS {
            (m0[i] + ((gi - m0[i]) * c.one_b1 + 0.0), (v0[i] * c.b2 + 0.0) + g2)
        } else {
            (gi * c.one_b1 + 0.0, g2)
        };
        let denom = v1.sqrt() * c.inv_sqrt_bc2 + c.eps;
        om[i].write(m1);
        ov[i].write(v1);
        op[i].write(pi + ((m1 / denom) * c.neg_step + 0.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The composed candle ops the trainer used before (torch's rule, op for op).
    fn composed(p: &Tensor, g: &Tensor, buf: Option<&Tensor>, h: SgdStep) -> (Tensor, Option<Tensor>) {
        let d = if h.weight_decay != 0.0 { (g + p.affine(h.weight_decay, 0.0).unwrap()).unwrap() } else { g.clone() };
        if h.momentum == 0.0 {
            return ((p + d.affine(-h.lr, 0.0).unwrap()).unwrap(), None);
        }
        let b = match buf {
            None => d.clone(),
            Some(b) => (b.affine(h.momentum, 0.0).unwrap() + &d).unwrap(),
        };
        let d = (d + b.affine(h.momentum, 0.0).unwrap()).unwrap();
        ((p + d.affine(-h.lr, 0.0).unwrap()).unwrap(), Some(b))
    }

    fn ramp(n: usize, seed: u32) -> Tensor {
        let v: Vec<f32> =
            (0..n as u32).map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0).collect();
        Tensor::from_vec(v, n, &Device::Cpu).unwrap()
    }

    fn bits(t: &Tensor) -> Vec<u32> {
        t.to_vec1::<f32>().unwrap().into_iter().map(f32::to_bits).collect()
    }

    #[test]
    fn equals_the_composed_ops_bit_for_bit() {
        // More than one chunk, and a ragged last one.
        let n = 2 * CHUNK + 77;
        let (p, g, b) = (ramp(n, 1), ramp(n, 2), ramp(n, 3));
        for h in [
            SgdStep { lr: 0.01, momentum: 0.937, weight_decay: 5e-4 },
            SgdStep { lr: 0.1, momentum: 0.9, weight_decay: 0.0 },
            SgdStep { lr: 0.05, momentum: 0.0, weight_decay: 1e-3 },
        ] {
            for buf in [None, Some(&b)] {
                let (fp, fb) = sgd_nesterov(&p, &g, buf, h).unwrap().unwrap();
                let (cp, cb) = composed(&p, &g, buf, h);
                assert_eq!(bits(&fp), bits(&cp), "{h:?} first step: {}", buf.is_none());
                assert_eq!(fb.map(|t| bits(&t)), cb.map(|t| bits(&t)), "{h:?} buffer");
            }
        }
    }

    /// The composed candle ops of torch's Adam / AdamW (the optimizer's own form, op for op).
    fn composed_adam(p: &Tensor, g: &Tensor, mv: Option<(&Tensor, &Tensor)>, h: AdamStep) -> [Tensor; 3] {
        let (mut p, mut g) = (p.clone(), g.clone());
        if h.weight_decay != 0.0 {
            if h.decoupled {
                p = p.affine(1.0 - h.lr * h.weight_decay, 0.0).unwrap();
            } else {
                g = (g + p.affine(h.weight_decay, 0.0).unwrap()).unwrap();
            }
        }
        let m = match mv {
            None => g.affine(1.0 - h.beta1, 0.0).unwrap(),
            Some((m, _)) => (m + (&g - m).unwrap().affine(1.0 - h.beta1, 0.0).unwrap()).unwrap(),
        };
        let g2 = g.sqr().unwrap().affine(1.0 - h.beta2, 0.0).unwrap();
        let v = match mv {
            None => g2,
            Some((_, v)) => (v.affine(h.beta2, 0.0).unwrap() + g2).unwrap(),
        };
        let t = h.step as f64;
        let (bc1, bc2) = (1.0 - h.beta1.powf(t), 1.0 - h.beta2.powf(t));
        let denom = v.sqrt().unwrap().affine(1.0 / bc2.sqrt(), h.eps).unwrap();
        let p = (p + m.div(&denom).unwrap().affine(-(h.lr / bc1), 0.0).unwrap()).unwrap();
        [p, m, v]
    }

    #[test]
    fn adam_equals_the_composed_ops_bit_for_bit() {
        let n = 2 * CHUNK + 77;
        let (p, g, m) = (ramp(n, 1), ramp(n, 2).affine(0.01, 0.0).unwrap(), ramp(n, 3).affine(1e-3, 0.0).unwrap());
        let v = ramp(n, 4).sqr().unwrap().affine(1e-5, 0.0).unwrap();
        for (decoupled, weight_decay, step) in [(true, 5e-4, 1), (true, 5e-4, 37), (false, 5e-4, 2), (true, 0.0, 5)] {
            let h = AdamStep { lr: 1.2e-3, beta1: 0.937, beta2: 0.999, eps: 1e-8, weight_decay, decoupled, step };
            for mv in [None, Some((&m, &v))] {
                let (fp, fm, fv) = adam(&p, &g, mv.map(|x| x.0), mv.map(|x| x.1), h).unwrap().unwrap();
                let [cp, cm, cv] = composed_adam(&p, &g, mv, h);
                for (what, a, b) in [("p", &fp, &cp), ("m", &fm, &cm), ("v", &fv, &cv)] {
                    assert_eq!(bits(a), bits(b), "{h:?} first step {}: {what}", mv.is_none());
                }
            }
        }
        let h = AdamStep { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, decoupled: true, step: 1 };
        assert!(adam(&p, &g, Some(&m), None, h).unwrap().is_none(), "one moment without the other");
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        let p = ramp(8, 1);
        let h = SgdStep { lr: 0.01, momentum: 0.9, weight_decay: 0.0 };
        assert!(
            sgd_nesterov(&p.to_dtype(DType::F64).unwrap(), &ramp(8, 2).to_dtype(DType::F64).unwrap(), None, h)
                .unwrap()
                .is_none()
        );
        assert!(sgd_nesterov(&p, &ramp(9, 2), None, h).unwrap().is_none());
        let strided =
            Tensor::from_vec((0..16).map(|i| i as f32).collect::<Vec<_>>(), (4, 4), &Device::Cpu).unwrap().t().unwrap();
        assert!(sgd_nesterov(&strided, &strided, None, h).unwrap().is_none());
    }
}
