//! The parameter updates of `torch.optim.SGD` (Nesterov), `Adam` and `AdamW` exactly as torch's single-tensor
//! implementations write them, Ultralytics 8.4.190's `MuSGD` (`ultralytics/optim/muon.py`), per parameter group
//! with its own learning rate, momentum and weight decay, and `torch.nn.utils.clip_grad_norm_`. Works on candle
//! tensors on any device.

use std::collections::BTreeMap;

use candle_core::{DType, Tensor};
use sluice_model::PackedVars;

use super::error::{OptimError, Result};
use super::groups::{Group, ParamGroups};
use super::settings::Rule;

mod flat;
use flat::FlatGroup;

/// MuSGD's weight of the Muon update in a Muon group (`muon=0.2` in Ultralytics' `build_optimizer`).
pub const MUSGD_MUON: f64 = 0.2;
/// MuSGD's weight of the SGD update in a Muon group (`sgd=1.0`).
pub const MUSGD_SGD: f64 = 1.0;
/// The quintic Newton–Schulz coefficients of `zeropower_via_newtonschulz5`.
const NS_COEFFS: (f64, f64, f64) = (3.4445, -4.7750, 2.0315);
/// Newton–Schulz iterations.
const NS_STEPS: usize = 5;

/// Adam's β2 in Ultralytics (`betas=(momentum, 0.999)`) and ε (torch's default): the constants the multi-tensor
/// step uses too, so that the composed and the fused updates cannot drift apart.
pub use sluice_kernels::multi_tensor::{ADAM_BETA2, ADAM_EPS};
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
    /// SGD's `momentum_buffer` (absent before the first step); in a MuSGD Muon group, Muon's momentum.
    pub momentum_buffer: Option<Tensor>,
    /// MuSGD's `momentum_buffer_SGD`: the SGD momentum of a Muon-group parameter.
    pub momentum_buffer_sgd: Option<Tensor>,
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
    /// Per parameter group whose update is element-wise (all but MuSGD's Muon groups): its parameters updated as
    /// one flat tensor.
    flat: Vec<FlatGroup>,
}

impl Optimizer {
    /// A fresh optimizer (empty state) for these groups.
    pub fn new(rule: Rule, groups: ParamGroups) -> Self {
        let state = vec![ParamState::default(); groups.params().len()];
        let flat = (0..groups.len())
            .filter(|&g| !(rule == Rule::MuSgd && groups.group_at(g).0 == Group::Muon))
            .map(|g| FlatGroup {
                members: (0..groups.params().len()).filter(|&i| groups.index_of(&groups.params()[i]) == g).collect(),
                buffer: None,
                state: None,
            })
            .filter(|f| !f.members.is_empty())
            .collect();
        Self { rule, groups, state, flat }
    }

    /// Uses the model's parameter buffers: a group whose parameters are, in order, the parts of one of `packs`
    /// reads and writes that buffer whole. Returns how many groups found theirs.
    pub fn use_buffers(&mut self, packs: &[PackedVars]) -> usize {
        let params = self.groups.params();
        let mut found = 0;
        for f in &mut self.flat {
            f.buffer = packs
                .iter()
                .find(|p| {
                    p.parts.len() == f.members.len()
                        && p.parts
                            .iter()
                            .zip(&f.members)
                            .all(|((_, part), &i)| part.as_tensor().id() == params[i].var.as_tensor().id())
                })
                .map(|p| p.buffer.clone());
            found += usize::from(f.buffer.is_some());
        }
        found
    }

    /// How many flat groups read and write a buffer of the model's ([`Optimizer::use_buffers`]).
    pub fn buffers_in_use(&self) -> usize {
        self.flat.iter().filter(|f| f.buffer.is_some()).count()
    }

    /// The names of each group's parameters whose update is element-wise, in order: the lists to pack the model's
    /// parameters by ([`sluice_model::Yolo::with_params_packed`]), so that [`Optimizer::use_buffers`] finds them.
    pub fn flat_groups(&self) -> Vec<Vec<String>> {
        self.flat.iter().map(|f| f.members.iter().map(|&i| self.groups.params()[i].name.clone()).collect()).collect()
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
        self.flat.iter_mut().for_each(|f| f.state = None);
        &mut self.state
    }

    /// One update of every parameter that has a gradient (`grads` in [`ParamGroups::params`] order; a parameter
    /// without one is skipped, state included, as torch skips `p.grad is None`). `hyper` is per group, in
    /// `param_groups` order ([`ParamGroups::len`] of them).
    pub fn step(&mut self, grads: &[Option<Tensor>], hyper: &[GroupHyper]) -> Result<()> {
        self.step_inner(grads, hyper, None, None, None)
    }

    /// [`Optimizer::step`] applied only where `ok` (a scalar `u8` tensor on the parameters' device) is 1: every
    /// new parameter and state tensor is `where(ok, new, old)`, so a step whose gradients are not finite changes
    /// no value (its NaNs never reach the kept branch) and the host never has to look. The per-parameter step
    /// counters advance either way. With `ok` = 1 the result equals [`Optimizer::step`] bit for bit.
    pub fn step_masked(&mut self, grads: &[Option<Tensor>], hyper: &[GroupHyper], ok: &Tensor) -> Result<()> {
        self.step_inner(grads, hyper, Some(ok), None, None)
    }

    /// [`Optimizer::step_masked`] with every gradient first multiplied by `coef`, a scalar tensor (the clip factor
    /// on the device): once per flat group rather than once per gradient, the same products. `flat` is
    /// [`Optimizer::flat_grads`] of `grads`.
    pub fn step_masked_scaled(
        &mut self,
        grads: &[Option<Tensor>],
        flat: Vec<Option<Tensor>>,
        hyper: &[GroupHyper],
        ok: &Tensor,
        coef: &Tensor,
    ) -> Result<()> {
        if flat.len() != self.flat.len() {
            return Err(OptimError::BadInput(format!("{} flat gradients for {} groups", flat.len(), self.flat.len())));
        }
        self.step_inner(grads, hyper, Some(ok), Some(coef), Some(flat))
    }

    /// Per group updated as one flat tensor, its gradients concatenated (one op), where every member has one;
    /// `None` for the others.
    pub fn flat_grads(&self, grads: &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> {
        self.flat
            .iter()
            .map(|f| {
                let gs: Option<Vec<Tensor>> = f
                    .members
                    .iter()
                    .map(|&i| grads.get(i).and_then(Option::as_ref).map(|g| g.detach().flatten_all()))
                    .map(|g| g.transpose())
                    .collect::<candle_core::Result<_>>()?;
                Ok(gs.map(|gs| Tensor::cat(&gs, 0)).transpose()?)
            })
            .collect()
    }

    /// The total L2 norm of `grads` as a scalar float32 tensor (no read), from the flat groups' gradients (`flat`,
    /// [`Optimizer::flat_grads`]) and each other gradient: the square root of the sum of every group's and every
    /// other gradient's sum of squares. Equal to the norm of the per-tensor norms (torch's) up to the order of the
    /// sums; a few ops per group instead of a few per gradient.
    pub fn grad_norm_tensor(&self, grads: &[Option<Tensor>], flat: &[Option<Tensor>]) -> Result<Option<Tensor>> {
        let mut covered = vec![false; grads.len()];
        let mut sums = Vec::new();
        for (f, g) in self.flat.iter().zip(flat) {
            if let Some(g) = g {
                f.members.iter().for_each(|&i| covered[i] = true);
                sums.push(g.to_dtype(DType::F32)?.sqr()?.sum_all()?);
            }
        }
        for (g, covered) in grads.iter().zip(covered) {
            if let (Some(g), false) = (g, covered) {
                sums.push(g.to_dtype(DType::F32)?.sqr()?.sum_all()?);
            }
        }
        if sums.is_empty() {
            return Ok(None);
        }
        Ok(Some(Tensor::stack(&sums, 0)?.sum_all()?.sqrt()?))
    }

    fn step_inner(
        &mut self,
        grads: &[Option<Tensor>],
        hyper: &[GroupHyper],
        ok: Option<&Tensor>,
        coef: Option<&Tensor>,
        flat: Option<Vec<Option<Tensor>>>,
    ) -> Result<()> {
        if grads.len() != self.state.len() {
            return Err(OptimError::BadInput(format!("{} gradients for {} parameters", grads.len(), self.state.len())));
        }
        if hyper.len() != self.groups.len() {
            return Err(OptimError::BadInput(format!(
                "{} group settings for {} parameter groups",
                hyper.len(),
                self.groups.len()
            )));
        }
        // Ultralytics calls `muon_update` once per param group, so the batches it transposes are per group.
        let mut transposed = vec![false; grads.len()];
        if self.rule == Rule::MuSgd {
            for group in 0..self.groups.len() {
                let shapes: Vec<_> = self
                    .groups
                    .params()
                    .iter()
                    .zip(grads)
                    .map(|(p, g)| match g {
                        Some(g) if p.group == Group::Muon && self.groups.index_of(p) == group => {
                            Some(muon_matrix(g.dims()))
                        }
                        _ => None,
                    })
                    .collect();
                for (t, s) in transposed.iter_mut().zip(muon_transposes(&shapes)) {
                    *t |= s;
                }
            }
        }
        let keep = |new: &Tensor, old: &Tensor| -> Result<Tensor> {
            match ok {
                Some(ok) => Ok(ok.broadcast_as(new.shape())?.where_cond(new, old)?),
                None => Ok(new.clone()),
            }
        };
        let mut done = vec![false; grads.len()];
        let mut flat = flat.unwrap_or_default().into_iter();
        for f in 0..self.flat.len() {
            if self.flat_step(f, grads, flat.next().flatten(), hyper, ok, coef)? {
                self.flat[f].members.iter().for_each(|&i| done[i] = true);
            } else {
                // The members' states are about to change one by one.
                self.flat[f].state = None;
            }
        }
        for ((((param, state), grad), transpose), done) in
            self.groups.params().iter().zip(self.state.iter_mut()).zip(grads).zip(transposed).zip(done)
        {
            let Some(grad) = grad else { continue };
            if done {
                continue;
            }
            let h = hyper[self.groups.index_of(param)];
            // Detached: the parameter is a variable, so ops on it would be tracked, and a momentum buffer built
            // from tracked tensors would keep every earlier step's buffers alive through its graph (a leak of a
            // few parameter copies per step).
            let p = param.var.as_tensor().detach();
            let grad = &match coef {
                Some(c) => grad.detach().broadcast_mul(&c.to_dtype(grad.dtype())?)?,
                None => grad.detach(),
            };
            let old = ok.map(|_| state.clone());
            let new = match self.rule {
                Rule::Sgd => sgd_nesterov(&p, grad, state, h)?,
                Rule::Adam => adam(&p, grad, state, h, false)?,
                Rule::AdamW => adam(&p, grad, state, h, true)?,
                Rule::MuSgd if param.group == Group::Muon => musgd_muon(&p, grad, state, h, transpose)?,
                Rule::MuSgd => sgd_nesterov(&p, grad, state, h)?,
            };
            if let (Some(old), Some(ok)) = (old, ok) {
                keep_state(state, &old, ok)?;
            }
            // The variable takes the new tensor's buffer when nothing else holds it (no copy).
            let next = keep(&new, &p)?;
            drop(new);
            param.var.set_owned(next)?;
        }
        Ok(())
    }
}

/// `where(ok, new, old)` for every state tensor (a first step's missing `old` reads as zeros).
fn keep_state(st: &mut ParamState, old: &ParamState, ok: &Tensor) -> Result<()> {
    let keep = |new: &Option<Tensor>, old: &Option<Tensor>| -> Result<Option<Tensor>> {
        Ok(match (new, old) {
            (Some(n), Some(o)) => Some(ok.broadcast_as(n.shape())?.where_cond(n, o)?),
            (Some(n), None) => Some(ok.broadcast_as(n.shape())?.where_cond(n, &n.zeros_like()?)?),
            (None, _) => None,
        })
    };
    st.momentum_buffer = keep(&st.momentum_buffer, &old.momentum_buffer)?;
    st.momentum_buffer_sgd = keep(&st.momentum_buffer_sgd, &old.momentum_buffer_sgd)?;
    st.exp_avg = keep(&st.exp_avg, &old.exp_avg)?;
    st.exp_avg_sq = keep(&st.exp_avg_sq, &old.exp_avg_sq)?;
    Ok(())
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
    state.step += 1;
    sgd_nesterov_with(p, grad, &mut state.momentum_buffer, h)
}

/// The SGD update with an explicit momentum buffer (SGD's, or MuSGD's second one).
fn sgd_nesterov_with(p: &Tensor, grad: &Tensor, buffer: &mut Option<Tensor>, h: GroupHyper) -> Result<Tensor> {
    // On the CPU, the same float operations as one parallel pass (`sluice_kernels::optim`, equal bit for bit).
    let step = sluice_kernels::optim::SgdStep { lr: h.lr, momentum: h.momentum, weight_decay: h.weight_decay };
    if let Some((new_p, new_buf)) = sluice_kernels::optim::sgd_nesterov(p, grad, buffer.as_ref(), step)? {
        *buffer = new_buf;
        return Ok(new_p);
    }
    let d_p = if h.weight_decay != 0.0 { (grad + p.affine(h.weight_decay, 0.0)?)? } else { grad.clone() };
    let d_p = if h.momentum != 0.0 {
        let buf = match buffer.take() {
            None => d_p.clone(),
            Some(buf) => (buf.affine(h.momentum, 0.0)? + &d_p)?,
        };
        let d_p = (d_p + buf.affine(h.momentum, 0.0)?)?;
        *buffer = Some(buf);
        d_p
    } else {
        d_p
    };
    Ok((p + d_p.affine(-h.lr, 0.0)?)?)
}

/// The matrix Muon orthogonalises for a parameter of these dimensions, as `muon_update` flattens it: rows = the
/// first dimension, columns = the rest; and its update scale `sqrt(max(1, dims[-2] / dims[-1]))` (1 for a square
/// conv kernel: Ultralytics takes the ratio of the kernel's height to its width there).
fn muon_matrix(dims: &[usize]) -> (usize, usize, f64) {
    let rows = dims.first().copied().unwrap_or(1).max(1);
    let cols = dims.iter().product::<usize>() / rows;
    let scale = match dims {
        [.., a, b] if *b > 0 => (*a as f64 / *b as f64).max(1.0).sqrt(),
        _ => 1.0,
    };
    (rows, cols, scale)
}

/// Which Muon matrices are orthogonalised transposed. Ultralytics batches matrices of equal column count and
/// scale, sorted by rows (largest first) and split where the first one's rows exceed 16 times another's, zero-pads
/// their rows to the batch's largest, and transposes the whole batch when that row count exceeds the columns.
/// Padding changes no value, the transposition changes the rounding in bfloat16, so the decision is the same here.
pub fn muon_transposes(shapes: &[Option<(usize, usize, f64)>]) -> Vec<bool> {
    let mut buckets: BTreeMap<(usize, u64), Vec<(usize, usize)>> = BTreeMap::new();
    for (i, s) in shapes.iter().enumerate() {
        if let Some((rows, cols, scale)) = *s {
            buckets.entry((cols, scale.to_bits())).or_default().push((rows, i));
        }
    }
    let mut out = vec![false; shapes.len()];
    for ((cols, _), mut items) in buckets {
        items.sort_by_key(|t| std::cmp::Reverse(t.0));
        let mut start = 0;
        for j in 1..=items.len() {
            if j == items.len() || items[start].0 > 16 * items[j].0 {
                let transpose = items[start].0 > cols;
                for &(_, i) in &items[start..j] {
                    out[i] = transpose;
                }
                start = j;
            }
        }
    }
    out
}

/// Rounds float32 values to bfloat16 and back (round to nearest even), where Ultralytics' Newton–Schulz holds
/// a bfloat16 tensor.
fn bf16(t: &Tensor) -> Result<Tensor> {
    Ok(t.to_dtype(DType::BF16)?.to_dtype(DType::F32)?)
}

/// `zeropower_via_newtonschulz5` of one matrix (float32 in, float32 holding bfloat16 values out): `X = G / (‖G‖ +
/// 1e-7)`, transposed when asked, then five times `A = X·Xᵀ`, `B = b·A + c·A·A`, `X = a·X + B·X`. Each product is
/// computed in float32 from bfloat16 operands (exact products, float32 sums, as torch's bfloat16 matmul on the CPU)
/// and rounded to bfloat16 where torch stores a bfloat16 result.
pub fn newton_schulz5(g: &Tensor, transpose: bool) -> Result<Tensor> {
    let (a, b, c) = NS_COEFFS;
    let x = bf16(&g.to_dtype(DType::F32)?)?;
    let norm = bf16(&x.sqr()?.sum_all()?.sqrt()?)?;
    let denom = bf16(&norm.affine(1.0, 1e-7)?)?;
    let mut x = bf16(&x.broadcast_div(&denom)?)?;
    if transpose {
        x = x.t()?.contiguous()?;
    }
    for _ in 0..NS_STEPS {
        let xt = x.t()?.contiguous()?;
        let am = bf16(&x.matmul(&xt)?)?;
        let bm = bf16(&(am.affine(b, 0.0)? + am.matmul(&am)?.affine(c, 0.0)?)?)?;
        x = bf16(&(x.affine(a, 0.0)? + bm.matmul(&x)?)?)?;
    }
    if transpose {
        x = x.t()?.contiguous()?;
    }
    Ok(x)
}

/// Muon's update of one parameter: its momentum `buf = β·buf + (1 − β)·g` (zeros before the first step), the
/// Nesterov update `u = β·buf + (1 − β)·g` flattened to its matrix, orthogonalised by [`newton_schulz5`] and
/// scaled.
fn muon_one(grad: &Tensor, buffer: &mut Option<Tensor>, beta: f64, transpose: bool) -> Result<Tensor> {
    let g_part = grad.affine(1.0 - beta, 0.0)?;
    let buf = match buffer.take() {
        None => g_part.clone(),
        Some(b) => (b.affine(beta, 0.0)? + &g_part)?,
    };
    let u = (buf.affine(beta, 0.0)? + &g_part)?;
    *buffer = Some(buf);
    let (rows, cols, scale) = muon_matrix(grad.dims());
    let o = newton_schulz5(&u.reshape((rows, cols))?, transpose)?.reshape(grad.shape())?;
    Ok(if scale != 1.0 { o.affine(scale, 0.0)? } else { o })
}

/// Ultralytics' `muon_update(grads, momentum, beta, nesterov=True)` over one param group: updates the momentum
/// buffers and returns the orthogonalised updates, with its batching's transpositions ([`muon_transposes`]).
pub fn muon_update(grads: &[Tensor], momenta: &mut [Option<Tensor>], beta: f64) -> Result<Vec<Tensor>> {
    let shapes: Vec<_> = grads.iter().map(|g| Some(muon_matrix(g.dims()))).collect();
    let transposed = muon_transposes(&shapes);
    grads.iter().zip(momenta.iter_mut()).zip(transposed).map(|((g, m), t)| muon_one(g, m, beta, t)).collect()
}

/// MuSGD on a Muon-group parameter, as `MuSGD.step` with `use_muon`: Muon's momentum `buf = β·buf + (1 − β)·g`,
/// its Nesterov update `u = β·buf + (1 − β)·g` orthogonalised by [`newton_schulz5`] and applied with
/// `lr · 0.2`; then, on the updated parameter, SGD with Nesterov momentum, weight decay and `lr · 1.0` on the
/// second buffer.
fn musgd_muon(p: &Tensor, grad: &Tensor, state: &mut ParamState, h: GroupHyper, transpose: bool) -> Result<Tensor> {
    let o = muon_one(grad, &mut state.momentum_buffer, h.momentum, transpose)?;
    let p = (p + o.affine(-(h.lr * MUSGD_MUON), 0.0)?)?;
    state.step += 1;
    let h_sgd = GroupHyper { lr: h.lr * MUSGD_SGD, ..h };
    sgd_nesterov_with(&p, grad, &mut state.momentum_buffer_sgd, h_sgd)
}

/// `torch.optim.Adam` / `AdamW` (no AMSGrad): AdamW first scales `p` by `1 − lr·wd`, Adam adds `wd·p` to the
/// gradient; `m = m + (1 − β1)(g − m)`; `v = β2·v + (1 − β2)·g²`; `p −= lr/(1 − β1ᵗ) · m / (√v/√(1 − β2ᵗ) + ε)`.
fn adam(p: &Tensor, grad: &Tensor, state: &mut ParamState, h: GroupHyper, decoupled: bool) -> Result<Tensor> {
    let beta1 = h.momentum;
    // On the CPU, the same float operations as one parallel pass (`sluice_kernels::optim`, equal bit for bit).
    let step = sluice_kernels::optim::AdamStep {
        lr: h.lr,
        beta1,
        beta2: ADAM_BETA2,
        eps: ADAM_EPS,
        weight_decay: h.weight_decay,
        decoupled,
        step: state.step + 1,
    };
    if let Some((new_p, m, v)) =
        sluice_kernels::optim::adam(p, grad, state.exp_avg.as_ref(), state.exp_avg_sq.as_ref(), step)?
    {
        state.step += 1;
        state.exp_avg = Some(m);
        state.exp_avg_sq = Some(v);
        return Ok(new_p);
    }
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
mod tests;
