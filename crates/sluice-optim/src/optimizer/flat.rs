//! A parameter group updated as one flat tensor over the model's buffer of its parameters (the trainer's packing
//! on a GPU): its gradients concatenated once, each op of the update once over the group, the buffer handed the
//! new values without a copy, the members' states views of the group's.

use candle_core::{Tensor, Var};

use super::{GroupHyper, Optimizer, ParamState, Rule, adam, keep_state, sgd_nesterov};
use crate::error::Result;

/// A parameter group updated as one flat tensor: its gradients concatenated once, then each op of the update once
/// over the group instead of once per parameter. The arithmetic is per element, so the values are those of the
/// per-parameter update bit for bit.
#[derive(Debug, Clone)]
pub(super) struct FlatGroup {
    /// The group's parameters (indices into [`crate::ParamGroups::params`]), in order.
    pub(super) members: Vec<usize>,
    /// The buffer whose consecutive parts the members are ([`sluice_model::Yolo::with_params_packed`]): the update
    /// reads it whole and hands it the new values without a copy. Without one, the group takes the per-parameter
    /// update.
    pub(super) buffer: Option<Var>,
    /// The group's optimizer state as flat tensors, when the members' states are views of it; `None` after
    /// anything else changed them (the next flat step concatenates them again).
    pub(super) state: Option<ParamState>,
}

impl Optimizer {
    /// Group `f`'s update as one flat tensor. Returns `false`, changing nothing, where it does not apply: no buffer, some
    /// members have a gradient and some not, or their states differ in kind or step count (a checkpoint of
    /// another run); the per-parameter update then takes the group. A group without any gradient is skipped, as
    /// torch skips each `p.grad is None`.
    pub(super) fn flat_step(
        &mut self,
        f: usize,
        grads: &[Option<Tensor>],
        flat_grad: Option<Tensor>,
        hyper: &[GroupHyper],
        ok: Option<&Tensor>,
        coef: Option<&Tensor>,
    ) -> Result<bool> {
        let group = &self.flat[f];
        // Without the model's buffer, concatenating the parameters and copying the new values back into each would
        // cost more than it saves.
        let Some(buffer) = group.buffer.clone() else { return Ok(false) };
        let members = &group.members;
        let present = members.iter().filter(|&&i| grads[i].is_some()).count();
        if present == 0 {
            return Ok(true);
        }
        if present != members.len() {
            return Ok(false);
        }
        let mut st = match &group.state {
            Some(st) => st.clone(),
            None => match gather_states(members.iter().map(|&i| &self.state[i]))? {
                Some(st) => st,
                None => return Ok(false),
            },
        };
        let params = self.groups.params();
        let flat = |t: &Tensor| t.detach().flatten_all();
        let g = match flat_grad {
            Some(g) => g,
            None => Tensor::cat(
                &members
                    .iter()
                    .filter_map(|&i| grads[i].as_ref().map(flat))
                    .collect::<candle_core::Result<Vec<_>>>()?,
                0,
            )?,
        };
        let g = match coef {
            Some(c) => g.broadcast_mul(&c.to_dtype(g.dtype())?)?,
            None => g,
        };
        let p = buffer.as_tensor().detach();
        let h = hyper[self.groups.index_of(&params[members[0]])];
        let old = ok.map(|_| st.clone());
        let new = match self.rule {
            Rule::Sgd | Rule::MuSgd => sgd_nesterov(&p, &g, &mut st, h)?,
            Rule::Adam => adam(&p, &g, &mut st, h, false)?,
            Rule::AdamW => adam(&p, &g, &mut st, h, true)?,
        };
        drop(g);
        let next = match ok {
            Some(ok) => {
                if let Some(old) = old {
                    keep_state(&mut st, &old, ok)?;
                }
                ok.broadcast_as(new.shape())?.where_cond(&new, &p)?
            }
            None => new,
        };
        drop(p);
        let group = &mut self.flat[f];
        // A fresh tensor that nothing else holds: the buffer takes it without a copy.
        buffer.set_owned(next)?;
        // Each member's state is its range of the group's.
        let mut at = 0;
        for &i in &group.members {
            let v = &params[i].var;
            let n = v.elem_count();
            let part = |t: &Option<Tensor>| -> Result<Option<Tensor>> {
                Ok(t.as_ref().map(|t| t.narrow(0, at, n)?.reshape(v.shape())).transpose()?)
            };
            self.state[i] = ParamState {
                momentum_buffer: part(&st.momentum_buffer)?,
                momentum_buffer_sgd: None,
                exp_avg: part(&st.exp_avg)?,
                exp_avg_sq: part(&st.exp_avg_sq)?,
                step: st.step,
            };
            at += n;
        }
        group.state = Some(st);
        Ok(true)
    }
}

/// The flat state of a group from its members' states: each tensor present in all (concatenated) or in none; the
/// same step count. `None` when they differ.
fn gather_states<'a>(states: impl Iterator<Item = &'a ParamState> + Clone) -> Result<Option<ParamState>> {
    let mut steps = states.clone().map(|s| s.step);
    let Some(step) = steps.next() else { return Ok(None) };
    if steps.any(|s| s != step) || states.clone().any(|s| s.momentum_buffer_sgd.is_some()) {
        return Ok(None);
    }
    let field = |get: fn(&ParamState) -> &Option<Tensor>| -> Result<Option<Option<Tensor>>> {
        let all: Vec<&Option<Tensor>> = states.clone().map(get).collect();
        if all.iter().all(|t| t.is_none()) {
            return Ok(Some(None));
        }
        if all.iter().any(|t| t.is_none()) {
            return Ok(None);
        }
        let flat =
            all.iter().flat_map(|t| t.as_ref()).map(|t| t.flatten_all()).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Some(Some(Tensor::cat(&flat, 0)?)))
    };
    let (Some(momentum_buffer), Some(exp_avg), Some(exp_avg_sq)) =
        (field(|s| &s.momentum_buffer)?, field(|s| &s.exp_avg)?, field(|s| &s.exp_avg_sq)?)
    else {
        return Ok(None);
    };
    Ok(Some(ParamState { momentum_buffer, momentum_buffer_sgd: None, exp_avg, exp_avg_sq, step }))
}
