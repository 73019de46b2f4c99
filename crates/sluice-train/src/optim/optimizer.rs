//! The parameter updates of `torch.optim.SGD` (Nesterov), `Adam` and `AdamW` exactly as torch's single-tensor
//! implementations write them, per parameter group with its own learning rate, momentum and weight decay, and
//! `torch.nn.utils.clip_grad_norm_`. Works on candle tensors on any device.

use candle_core::{DType, Tensor};

use super::error::{OptimError, Result};
use super::groups::ParamGroups;
use super::settings::Rule;

/// Adam's β2 in Ultralytics (`betas=(momentum, 0.999)`).
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's ε (torch's default).
pub const ADAM_EPS: f64 = 1e-8;
/// Ultralytics' gradient-clipping threshold (`clip_grad_norm_(…, max_norm=10.0)`).
pub const MAX_GRAD_NORM: f64 = 10.0;

/// The hyper-parameters of one parameter group at one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupHyper {
    /// Learning rate.
    pub lr: f64,
    /// SGD momentum, or Adam's β1.
    pub momentum: f64,
    /// Weight decay.
    pub weight_decay: f64,
}

/// Per-parameter optimizer state, as in torch's `optimizer.state[p]`.
#[derive(Debug, Clone, Default)]
pub struct ParamState {
    /// SGD's `momentum_buffer` (absent before the first step).
    pub momentum_buffer: Option<Tensor>,
    /// Adam's `exp_avg` (absent before the first step).
    pub exp_avg: Option<Tensor>,
    /// Adam's `exp_avg_sq` (absent before the first step).
    pub exp_avg_sq: Option<Tensor>,
    /// Adam's `step`: how many updates this parameter received.
    pub step: u64,
}

/// An optimizer over a model's [`ParamGroups`].
#[derive(Debug, Clone)]
pub struct Optimizer {
    rule: Rule,
    groups: ParamGroups,
    state: Vec<ParamState>,
}

impl Optimizer {
    /// A fresh optimizer (empty state) for these groups.
    pub fn new(rule: Rule, groups: ParamGroups) -> Self {
        let state = vec![ParamState::default(); groups.params().len()];
        Self { rule, groups, state }
    }

    /// The update rule.
    pub fn rule(&self) -> Rule {
        self.rule
    }

    /// The parameter groups.
    pub fn groups(&self) -> &ParamGroups {
        &self.groups
    }

    /// The state of every parameter, in [`ParamGroups::params`] order.
    pub fn state(&self) -> &[ParamState] {
        &self.state
    }

    /// Mutable state (for restoring a checkpoint).
    pub fn state_mut(&mut self) -> &mut [ParamState] {
        &mut self.state
    }

    /// One update of every parameter that has a gradient (`grads` in [`ParamGroups::params`] order; a parameter
    /// without one is skipped, state included, as torch skips `p.grad is None`). `hyper` is per group, in
    /// `param_groups` order.
    pub fn step(&mut self, grads: &[Option<Tensor>], hyper: &[GroupHyper; 3]) -> Result<()> {
        self.step_inner(grads, hyper, None)
    }

    /// [`Optimizer::step`] applied only where `ok` (a scalar `u8` tensor on the parameters' device) is 1: every
    /// new parameter and state tensor is `where(ok, new, old)`, so a step whose gradients are not finite changes
    /// no value (its NaNs never reach the kept branch) and the host never has to look. The per-parameter step
    /// counters advance either way. With `ok` = 1 the result equals [`Optimizer::step`] bit for bit.
    pub fn step_masked(&mut self, grads: &[Option<Tensor>], hyper: &[GroupHyper; 3], ok: &Tensor) -> Result<()> {
        self.step_inner(grads, hyper, Some(ok))
    }

    fn step_inner(&mut self, grads: &[Option<Tensor>], hyper: &[GroupHyper; 3], ok: Option<&Tensor>) -> Result<()> {
        if grads.len() != self.state.len() {
            return Err(OptimError::BadInput(format!("{} gradients for {} parameters", grads.len(), self.state.len())));
        }
        let keep = |new: &Tensor, old: &Tensor| -> Result<Tensor> {
            match ok {
                Some(ok) => Ok(ok.broadcast_as(new.shape())?.where_cond(new, old)?),
                None => Ok(new.clone()),
            }
        };
        let keep_opt = |new: &Option<Tensor>, old: &Option<Tensor>| -> Result<Option<Tensor>> {
            Ok(match (new, old) {
                (Some(n), Some(o)) => Some(keep(n, o)?),
                (Some(n), None) => Some(keep(n, &n.zeros_like()?)?),
                (None, _) => None,
            })
        };
        for ((param, state), grad) in self.groups.params().iter().zip(self.state.iter_mut()).zip(grads) {
            let Some(grad) = grad else { continue };
            let h = hyper[param.group.index()];
            // Detached: the parameter is a variable, so ops on it would be tracked, and a momentum buffer built
            // from tracked tensors would keep every earlier step's buffers alive through its graph (a leak of a
            // few parameter copies per step).
            let p = param.var.as_tensor().detach();
            let grad = &grad.detach();
            let old = ok.map(|_| state.clone());
            let new = match self.rule {
                Rule::Sgd => sgd_nesterov(&p, grad, state, h)?,
                Rule::Adam => adam(&p, grad, state, h, false)?,
                Rule::AdamW => adam(&p, grad, state, h, true)?,
            };
            if let Some(old) = old {
                state.momentum_buffer = keep_opt(&state.momentum_buffer, &old.momentum_buffer)?;
                state.exp_avg = keep_opt(&state.exp_avg, &old.exp_avg)?;
                state.exp_avg_sq = keep_opt(&state.exp_avg_sq, &old.exp_avg_sq)?;
            }
            param.var.set(&keep(&new, &p)?)?;
        }
        Ok(())
    }
}

/// The total gradient norm as a scalar float32 tensor on the gradients' device (no read).
pub fn total_grad_norm_tensor(grads: &[Option<Tensor>]) -> Result<Option<Tensor>> {
    let norms: Vec<Tensor> = grads
        .iter()
        .flatten()
        .map(|g| g.to_dtype(DType::F32)?.sqr()?.sum_all()?.sqrt())
        .collect::<candle_core::Result<_>>()?;
    if norms.is_empty() {
        return Ok(None);
    }
    Ok(Some(Tensor::stack(&norms, 0)?.sqr()?.sum_all()?.sqrt()?))
}

/// [`clip_coefficient`] on the device: `min(max_norm / (norm + 1e-6), 1)` in float32 (the same rounding), from a
/// scalar norm tensor.
pub fn clip_coefficient_tensor(norm: &Tensor, max_norm: f64) -> Result<Tensor> {
    let max = Tensor::new(max_norm as f32, norm.device())?;
    Ok(max.broadcast_div(&norm.affine(1.0, 1e-6)?)?.minimum(1.0)?)
}

/// `torch.optim.SGD(nesterov=True, dampening=0)`: `g += wd·p`; `buf = g` at the first step, else
/// `buf = momentum·buf + g`; `g += momentum·buf`; `p −= lr·g`. Returns the new parameter.
fn sgd_nesterov(p: &Tensor, grad: &Tensor, state: &mut ParamState, h: GroupHyper) -> Result<Tensor> {
    // On the CPU, the same float operations as one parallel pass (`sluice_kernels::optim`, equal bit for bit).
    let step = sluice_kernels::optim::SgdStep { lr: h.lr, momentum: h.momentum, weight_decay: h.weight_decay };
    if let Some((new_p, new_buf)) = sluice_kernels::optim::sgd_nesterov(p, grad, state.momentum_buffer.as_ref(), step)?
    {
        state.momentum_buffer = new_buf;
        state.step += 1;
        return Ok(new_p);
    }
    let d_p = if h.weight_decay != 0.0 { (grad + p.affine(h.weight_decay, 0.0)?)? } else { grad.clone() };
    let d_p = if h.momentum != 0.0 {
        let buf = match state.momentum_buffer.take() {
            None => d_p.clone(),
            Some(buf) => (buf.affine(h.momentum, 0.0)? + &d_p)?,
        };
        let d_p = (d_p + buf.affine(h.momentum, 0.0)?)?;
        state.momentum_buffer = Some(buf);
        d_p
    } else {
        d_p
    };
    state.step += 1;
    Ok((p + d_p.affine(-h.lr, 0.0)?)?)
}

/// `torch.optim.Adam` / `AdamW` (no AMSGrad): AdamW first scales `p` by `1 − lr·wd`, Adam adds `wd·p` to the
/// gradient; `m = m + (1 − β1)(g − m)`; `v = β2·v + (1 − β2)·g²`; `p −= lr/(1 − β1ᵗ) · m / (√v/√(1 − β2ᵗ) + ε)`.
fn adam(p: &Tensor, grad: &Tensor, state: &mut ParamState, h: GroupHyper, decoupled: bool) -> Result<Tensor> {
    let beta1 = h.momentum;
    let mut p = p.clone();
    let mut g = grad.clone();
    if h.weight_decay != 0.0 {
        if decoupled {
            p = p.affine(1.0 - h.lr * h.weight_decay, 0.0)?;
        } else {
            g = (g + p.affine(h.weight_decay, 0.0)?)?;
        }
    }
    state.step += 1;
    let m = match state.exp_avg.take() {
        None => g.affine(1.0 - beta1, 0.0)?,
        Some(m) => (&m + (&g - &m)?.affine(1.0 - beta1, 0.0)?)?,
    };
    let g2 = g.sqr()?.affine(1.0 - ADAM_BETA2, 0.0)?;
    let v = match state.exp_avg_sq.take() {
        None => g2,
        Some(v) => (v.affine(ADAM_BETA2, 0.0)? + g2)?,
    };
    let t = state.step as f64;
    let bias_correction1 = 1.0 - beta1.powf(t);
    let bias_correction2 = 1.0 - ADAM_BETA2.powf(t);
    let step_size = h.lr / bias_correction1;
    let denom = v.sqrt()?.affine(1.0 / bias_correction2.sqrt(), ADAM_EPS)?;
    let p = (p + (m.div(&denom)?).affine(-step_size, 0.0)?)?;
    state.exp_avg = Some(m);
    state.exp_avg_sq = Some(v);
    Ok(p)
}

/// The total L2 norm of the gradients (torch's norm of the per-tensor norms), computed on the device and read
/// once. `None` entries are skipped.
pub fn total_grad_norm(grads: &[Option<Tensor>]) -> Result<f64> {
    let Some(total) = total_grad_norm_tensor(grads)? else { return Ok(0.0) };
    sluice_core::syncs::record_if(!total.device().is_cpu(), sluice_core::syncs::Site::NonFiniteCheck);
    Ok(f64::from(total.to_scalar::<f32>()?))
}

/// `clip_grad_norm_`'s factor for a total norm: `min(max_norm / (norm + 1e-6), 1)`, in float32 as torch
/// computes it.
pub fn clip_coefficient(total_norm: f64, max_norm: f64) -> f64 {
    let coef = max_norm as f32 / (total_norm as f32 + 1e-6_f32);
    f64::from(coef.min(1.0))
}

/// Scales every gradient by `coef` (a no-op at 1, which is exact).
pub fn scale_grads(grads: &mut [Option<Tensor>], coef: f64) -> Result<()> {
    if coef == 1.0 {
        return Ok(());
    }
    for g in grads.iter_mut().flatten() {
        *g = g.affine(coef, 0.0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Each rule against torch's documented update written out in f64 on small tensors, over several steps
    //! with changing learning rate and momentum (as during warmup).
    #![allow(clippy::unwrap_used)]
    use candle_core::{Device, Var};

    use super::*;
    use crate::optim::groups::{Group, Param};

    /// Deterministic pseudo-random values in [−1, 1).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect()
    }

    fn tensor(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.iter().map(|&x| x as f32).collect::<Vec<f32>>(), v.len(), &Device::Cpu).unwrap()
    }

    fn read(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64).unwrap().to_vec1().unwrap()
    }

    /// One parameter per group, so every group's hyper-parameters are exercised.
    fn optimizer(rule: Rule, init: &[Vec<f64>; 3]) -> Optimizer {
        let groups = [Group::Weight, Group::BnWeight, Group::Bias];
        let params = groups
            .iter()
            .zip(init)
            .map(|(g, v)| Param { name: format!("{g:?}"), var: Var::from_tensor(&tensor(v)).unwrap(), group: *g })
            .collect();
        Optimizer::new(rule, ParamGroups::from_params(params))
    }

    fn hyper(step: usize) -> [GroupHyper; 3] {
        // Learning rate and momentum change every step, like warmup; only group 0 decays.
        let lr = 0.01 * (1.0 + step as f64) / 3.0;
        let m = 0.8 + 0.04 * step as f64;
        [
            GroupHyper { lr, momentum: m, weight_decay: 5e-3 },
            GroupHyper { lr, momentum: m, weight_decay: 0.0 },
            GroupHyper { lr: 0.1 - 0.02 * step as f64, momentum: m, weight_decay: 0.0 },
        ]
    }

    /// f64 reference: torch.optim.SGD docs (nesterov, dampening 0).
    fn sgd_ref(p: &mut [f64], buf: &mut Option<Vec<f64>>, g: &[f64], h: GroupHyper) {
        let gt: Vec<f64> = g.iter().zip(p.iter()).map(|(g, p)| g + h.weight_decay * p).collect();
        let b: Vec<f64> = match buf {
            None => gt.clone(),
            Some(b) => b.iter().zip(&gt).map(|(b, g)| h.momentum * b + g).collect(),
        };
        for i in 0..p.len() {
            p[i] -= h.lr * (gt[i] + h.momentum * b[i]);
        }
        *buf = Some(b);
    }

    /// f64 reference: torch.optim.Adam / AdamW docs.
    fn adam_ref(p: &mut [f64], m: &mut [f64], v: &mut [f64], t: u64, g: &[f64], h: GroupHyper, decoupled: bool) {
        let (b1, b2) = (h.momentum, ADAM_BETA2);
        for i in 0..p.len() {
            let mut gi = g[i];
            if decoupled {
                p[i] *= 1.0 - h.lr * h.weight_decay;
            } else {
                gi += h.weight_decay * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            let mh = m[i] / (1.0 - b1.powi(t as i32));
            let vh = v[i] / (1.0 - b2.powi(t as i32));
            p[i] -= h.lr * mh / (vh.sqrt() + ADAM_EPS);
        }
    }

    fn assert_close(got: &[f64], want: &[f64], what: &str) {
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            // float32 arithmetic against f64: a few ulps of the parameter scale.
            assert!((g - w).abs() <= 2e-6 * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
        }
    }

    fn run(rule: Rule) {
        let n = 7;
        let init = [values(n, 1), values(n, 2), values(n, 3)];
        let mut opt = optimizer(rule, &init);
        let mut p = init.clone();
        let mut bufs: [Option<Vec<f64>>; 3] = [None, None, None];
        let mut ms = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
        let mut vs = ms.clone();
        for step in 0..5 {
            let g: Vec<Vec<f64>> = (0..3).map(|k| values(n, 100 + 10 * step as u64 + k)).collect();
            let h = hyper(step);
            let grads: Vec<Option<Tensor>> = g.iter().map(|g| Some(tensor(g))).collect();
            opt.step(&grads, &h).unwrap();
            for k in 0..3 {
                match rule {
                    Rule::Sgd => sgd_ref(&mut p[k], &mut bufs[k], &g[k], h[k]),
                    Rule::Adam | Rule::AdamW => {
                        adam_ref(&mut p[k], &mut ms[k], &mut vs[k], step as u64 + 1, &g[k], h[k], rule == Rule::AdamW)
                    }
                }
                let got = read(opt.groups().params()[k].var.as_tensor());
                // Compare against the reference advanced from the float32 parameters, so errors do not compound.
                assert_close(&got, &p[k], &format!("{rule:?} step {step} group {k}"));
                p[k] = got;
            }
        }
        assert!(opt.state().iter().all(|s| s.step == 5));
        // No state tensor carries an autograd graph (which would chain every step's buffers together).
        for st in opt.state() {
            for t in [&st.momentum_buffer, &st.exp_avg, &st.exp_avg_sq].into_iter().flatten() {
                assert!(!t.track_op(), "{rule:?}: optimizer state is tracked by autograd");
            }
        }
    }

    #[test]
    fn sgd_nesterov_matches_torch_rule() {
        run(Rule::Sgd);
    }

    #[test]
    fn adam_matches_torch_rule() {
        run(Rule::Adam);
    }

    #[test]
    fn adamw_matches_torch_rule() {
        run(Rule::AdamW);
    }

    #[test]
    fn a_parameter_without_gradient_is_left_alone() {
        let init = [values(3, 1), values(3, 2), values(3, 3)];
        let mut opt = optimizer(Rule::AdamW, &init);
        let grads = vec![Some(tensor(&values(3, 9))), None, Some(tensor(&values(3, 8)))];
        opt.step(&grads, &hyper(0)).unwrap();
        assert_eq!(read(opt.groups().params()[1].var.as_tensor()), read(&tensor(&init[1])));
        assert_eq!(opt.state()[1].step, 0);
        assert!(opt.state()[1].exp_avg.is_none());
        assert_eq!(opt.state()[0].step, 1);
    }

    #[test]
    fn clipping_matches_torch() {
        let a = values(50, 4).iter().map(|x| x * 3.0).collect::<Vec<_>>();
        let b = values(20, 5);
        let want = a.iter().chain(&b).map(|x| x * x).sum::<f64>().sqrt();
        let mut grads = vec![Some(tensor(&a)), None, Some(tensor(&b))];
        let norm = total_grad_norm(&grads).unwrap();
        assert!((norm - want).abs() < 1e-5 * want, "{norm} vs {want}");
        assert!(want > MAX_GRAD_NORM);
        let coef = clip_coefficient(norm, MAX_GRAD_NORM);
        assert!((coef - MAX_GRAD_NORM / (want + 1e-6)).abs() < 1e-6);
        scale_grads(&mut grads, coef).unwrap();
        let clipped = total_grad_norm(&grads).unwrap();
        assert!((clipped - MAX_GRAD_NORM).abs() < 1e-4, "{clipped}");
        // Below the threshold the factor is exactly 1.
        assert_eq!(clip_coefficient(3.0, MAX_GRAD_NORM), 1.0);
        assert!(total_grad_norm(&[Some(tensor(&[f64::NAN]))]).unwrap().is_nan());
    }
}
