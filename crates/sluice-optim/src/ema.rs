//! Ultralytics' `ModelEMA`: an exponential moving average of every floating-point tensor of the model's state
//! (parameters and BatchNorm running statistics), decay `0.9999 · (1 − exp(−updates / 2000))`, updated after
//! each optimizer step. The EMA model is what validation and checkpoints use.

use candle_core::{Tensor, Var};
use sluice_model::{PackedVars, Yolo};

use super::error::{OptimError, Result};

/// Ultralytics' maximum EMA decay.
pub const EMA_DECAY: f64 = 0.9999;
/// Ultralytics' EMA ramp time constant (updates).
pub const EMA_TAU: f64 = 2000.0;

/// The moving average of a model.
#[derive(Debug)]
pub struct ModelEma {
    ema: Yolo,
    /// `(name, EMA variable)` for every variable of the model, sorted by name.
    vars: Vec<(String, Var)>,
    /// The same floating-point variables as parts of one buffer per dtype, in the order of the model's
    /// [`Yolo::float_segments`]: the update is a handful of ops over each buffer, not a handful per variable.
    packs: Vec<PackedVars>,
    updates: u64,
    decay: f64,
    tau: f64,
}

impl ModelEma {
    /// An EMA starting as a deep copy of `model`, with Ultralytics' decay and ramp.
    pub fn new(model: &Yolo) -> Result<Self> {
        Self::with_decay(model, EMA_DECAY, EMA_TAU)
    }

    /// An EMA with another maximum decay and ramp constant.
    pub fn with_decay(model: &Yolo, decay: f64, tau: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&decay) || !tau.is_finite() || tau <= 0.0 {
            return Err(OptimError::BadSettings(format!("EMA decay {decay} must be in [0, 1] and tau {tau} > 0")));
        }
        let (ema, packs) = model.try_clone_packed()?;
        let vars = {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let data = ema.varmap().data().lock().unwrap();
            let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        Ok(Self { ema, vars, packs, updates: 0, decay, tau })
    }

    /// The averaged model.
    pub fn model(&self) -> &Yolo {
        &self.ema
    }

    /// Mutable access to the averaged model (for loading a checkpoint).
    pub fn model_mut(&mut self) -> &mut Yolo {
        &mut self.ema
    }

    /// Number of updates so far.
    pub fn updates(&self) -> u64 {
        self.updates
    }

    /// Sets the update count (when resuming).
    pub fn set_updates(&mut self, updates: u64) {
        self.updates = updates;
    }

    /// The decay the next update will use.
    pub fn next_decay(&self) -> f64 {
        self.decay_at(self.updates + 1)
    }

    fn decay_at(&self, updates: u64) -> f64 {
        self.decay * (1.0 - (-(updates as f64) / self.tau).exp())
    }

    /// `updates += 1; d = decay(updates); ema = lerp(ema, model, 1 − d)` for every floating-point variable
    /// (parameters and running statistics; the integer `num_batches_tracked` counters are not averaged).
    pub fn update(&mut self, model: &Yolo) -> Result<()> {
        self.ledger_phase(|s| s.update_inner(model, None))
    }

    /// Runs `f` in the op ledger's `ema` phase, then back in `optimizer` (the EMA update ends an optimizer step).
    fn ledger_phase<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        candle_core::ledger::set_phase("ema");
        let out = f(self);
        candle_core::ledger::set_phase("optimizer");
        out
    }

    /// [`ModelEma::update`] kept only where `ok` (a scalar `u8` tensor on the model's device) is 1: the device-side
    /// skip of a non-finite step (the update counter advances either way).
    pub fn update_masked(&mut self, model: &Yolo, ok: &Tensor) -> Result<()> {
        self.ledger_phase(|s| s.update_inner(model, Some(ok)))
    }

    /// [`ModelEma::update_masked`] (or, with no `mask`, [`ModelEma::update`]) as one pass over every variable
    /// ([`sluice_kernels::multi_tensor`]); `mask` is the fused step's norm, whose finite flag gates the update.
    pub(crate) fn update_fused(
        &mut self,
        model: &Yolo,
        mt: &mut sluice_kernels::multi_tensor::MultiTensor,
        mask: Option<&Tensor>,
    ) -> Result<()> {
        self.ledger_phase(|s| {
            let w = (1.0 - s.decay_at(s.updates + 1)) as f32;
            let pairs = s.pairs(model)?;
            let ema: Vec<&Var> = pairs.iter().map(|(e, _)| e).collect();
            let src: Vec<&Tensor> = pairs.iter().map(|(_, m)| m).collect();
            mt.ema(&ema, &src, w, mask)?;
            s.updates += 1;
            Ok(())
        })
    }

    /// Every floating-point EMA variable with the model's variable of the same name (detached).
    fn pairs(&self, model: &Yolo) -> Result<Vec<(Var, Tensor)>> {
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        let src = model.varmap().data().lock().unwrap();
        if src.len() != self.vars.len() {
            return Err(OptimError::BadInput(format!(
                "EMA update from a model with {} variables, the EMA has {}",
                src.len(),
                self.vars.len()
            )));
        }
        let mut pairs = Vec::with_capacity(self.vars.len());
        for (name, e) in &self.vars {
            let m = src.get(name).ok_or_else(|| {
                OptimError::BadInput(format!("EMA update from a model without the variable `{name}`"))
            })?;
            if e.dtype().is_float() {
                pairs.push((e.clone(), m.as_tensor().detach()));
            }
        }
        Ok(pairs)
    }

    /// The model's values in `pack`'s order, as tensors to concatenate: one per segment of the model
    /// ([`Yolo::float_segments`], the order the EMA copy was packed in), or, for a model stored otherwise, one per
    /// variable by name.
    fn sources(model: &Yolo, pack: &PackedVars, pairs: &[(Var, Tensor)]) -> Result<Vec<Tensor>> {
        let dtype = pack.buffer.dtype();
        let segments = || model.float_segments().iter().filter(|s| s.var.dtype() == dtype);
        let same_order = segments().flat_map(|s| s.names.iter()).eq(pack.parts.iter().map(|(n, _)| n));
        if same_order {
            return Ok(segments()
                .map(|s| s.var.as_tensor().detach().flatten_all())
                .collect::<candle_core::Result<_>>()?);
        }
        let by_id: std::collections::HashMap<_, &Tensor> = pairs.iter().map(|(e, m)| (e.as_tensor().id(), m)).collect();
        pack.parts
            .iter()
            .map(|(name, part)| {
                let m = by_id.get(&part.as_tensor().id()).ok_or_else(|| {
                    OptimError::BadInput(format!("EMA update from a model without the variable `{name}`"))
                })?;
                Ok(m.flatten_all()?)
            })
            .collect()
    }

    fn update_inner(&mut self, model: &Yolo, ok: Option<&Tensor>) -> Result<()> {
        let d = self.decay_at(self.updates + 1);
        // torch's `lerp_(model, 1 − d)` (Ultralytics' `_foreach_lerp_`), with its weight in float32 and its two
        // branches: `ema + w·(model − ema)` for a small weight, `model + (w − 1)·(model − ema)` otherwise. Unlike
        // `d·ema + (1 − d)·model`, it leaves a tensor the step did not change exactly as it was.
        let w = (1.0 - d) as f32;
        let pairs = self.pairs(model)?;
        for pack in &self.packs {
            let parts = Self::sources(model, pack, &pairs)?;
            let m = Tensor::cat(&parts, 0)?;
            let e = pack.buffer.as_tensor();
            let diff = (&m - e)?;
            let next = if w.abs() < 0.5 {
                (e + diff.affine(f64::from(w), 0.0)?)?
            } else {
                (&m + diff.affine(f64::from(w - 1.0), 0.0)?)?
            };
            let next = match ok {
                Some(ok) => ok.broadcast_as(next.shape())?.where_cond(&next, e)?,
                None => next,
            };
            // A fresh tensor: the buffer takes it (no copy), and every part reads its range of it.
            pack.buffer.set_owned(next)?;
        }
        self.updates += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use candle_core::{DType, Device, Tensor};
    use sluice_model::{Scale, YoloConfig};

    use super::*;

    fn values(t: &Tensor) -> Vec<f64> {
        t.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap()
    }

    #[test]
    fn ema_follows_the_ramp_on_parameters_and_running_stats() {
        let model = Yolo::new(YoloConfig::new(Scale::N, 2), DType::F32, &Device::Cpu).unwrap();
        let mut ema = ModelEma::new(&model).unwrap();
        let names = ["model.0.conv.weight", "model.0.bn.running_var", "model.22.cv3.0.2.bias"];
        let start: Vec<Vec<f64>> = names.iter().map(|n| values(model.var(n).unwrap().as_tensor())).collect();
        // The copy is independent: changing the model leaves the EMA as it was.
        let mut expected = start.clone();
        for step in 1..=3u64 {
            let mut now = Vec::new();
            for (i, n) in names.iter().enumerate() {
                let v = model.var(n).unwrap();
                let moved = v.as_tensor().affine(0.5, (i + step as usize) as f64).unwrap();
                v.set(&moved).unwrap();
                now.push(values(&moved));
            }
            ema.update(&model).unwrap();
            let d = 0.9999 * (1.0 - (-(step as f64) / 2000.0).exp());
            for (i, n) in names.iter().enumerate() {
                let got = values(ema.model().var(n).unwrap().as_tensor());
                for (j, g) in got.iter().enumerate() {
                    expected[i][j] = d * expected[i][j] + (1.0 - d) * now[i][j];
                    assert!((g - expected[i][j]).abs() < 1e-6 * (1.0 + g.abs()), "{n}[{j}] step {step}");
                }
            }
        }
        assert_eq!(ema.updates(), 3);
        assert!(ema.model().var(names[0]).unwrap().as_tensor().id() != model.var(names[0]).unwrap().as_tensor().id());
    }
}
