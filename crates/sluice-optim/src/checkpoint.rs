//! Training checkpoints: everything needed to resume a run exactly, in one safetensors file written atomically.
//!
//! Layout:
//! - `model.<key>`: the trained model's Ultralytics `state_dict` (float32 parameters and running statistics,
//!   int64 `num_batches_tracked`, the DFL projection); `Yolo::load_weights_prefixed(path, "model.", Strict)`
//!   reads it.
//! - `ema.<key>`: the EMA model's `state_dict`, the same way (`"ema."`): the weights for validation and
//!   prediction.
//! - `optim.state.<param>.momentum_buffer` (SGD; Muon's momentum in MuSGD), `.momentum_buffer_SGD` (MuSGD's
//!   SGD momentum of a Muon-group parameter), `optim.state.<param>.exp_avg` and `.exp_avg_sq` (Adam/AdamW): the
//!   optimizer buffers, under torch's names; `optim.grad.<param>`: gradients accumulated since the last step (present only when a
//!   checkpoint is taken inside an accumulation window).
//! - metadata `format` = [`FORMAT`], `optim` = JSON of the settings, run shape, resolved optimizer, schedule,
//!   per-group learning rates and momenta, accumulation position, iteration counter, step counts and EMA update
//!   count, and `user` = the caller's JSON (epoch, sampler position, resolved config, best fitness, …).

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use sluice_model::{LoadMode, Yolo};

use super::driver::{DriverState, Optimization};
use super::error::{OptimError, Result};
use super::io::{load_safetensors, read_metadata, save_safetensors};
use super::scaler::LossScaler;

/// The value of the `format` metadata key of a training checkpoint.
pub const FORMAT: &str = "sluice-train-checkpoint/1";

fn bad(file: &Path, reason: impl Into<String>) -> OptimError {
    OptimError::BadCheckpoint { file: file.to_path_buf(), reason: reason.into() }
}

/// The caller's JSON of a training checkpoint, reading only the file's header (to rebuild the run's
/// configuration before the model and the [`Optimization`] exist).
pub fn read_user_metadata(path: impl AsRef<Path>) -> Result<serde_json::Value> {
    let path = path.as_ref();
    let meta = read_metadata(path)?;
    check_format(path, &meta)?;
    parse_user(path, &meta)
}

fn check_format(path: &Path, meta: &HashMap<String, String>) -> Result<()> {
    match meta.get("format") {
        Some(f) if f == FORMAT => Ok(()),
        Some(f) => Err(bad(path, format!("checkpoint format `{f}`, expected `{FORMAT}`"))),
        None => Err(bad(path, "not a sluice training checkpoint (no `format` metadata); a plain weights file?")),
    }
}

fn parse_user(path: &Path, meta: &HashMap<String, String>) -> Result<serde_json::Value> {
    let user = meta.get("user").ok_or_else(|| bad(path, "no `user` metadata"))?;
    serde_json::from_str(user).map_err(|e| bad(path, format!("`user` metadata: {e}")))
}

fn prefixed(prefix: &str, sd: HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = sd.into_iter().map(|(k, t)| (format!("{prefix}{k}"), t)).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

impl Optimization {
    /// Writes `model` (the model being trained), the EMA, the optimizer state and `user` metadata to `path`,
    /// atomically: a kill or an error mid-save leaves the previous file intact.
    pub fn save_state(&self, model: &Yolo, path: impl AsRef<Path>, user: &serde_json::Value) -> Result<()> {
        self.save_with_pending(model, path.as_ref(), user, &self.pending)
    }

    /// [`Optimization::save_state`] for a data-parallel run: every rank calls it at the same point, and only where
    /// `write` (rank 0) is the file written. The gradients accumulated since the last step are each rank's own, so
    /// while a window is open they are summed over the ranks (a collective) and the file holds the sum; a resumed
    /// run gives it to rank 0 and starts the other ranks' windows empty ([`Optimization::drop_pending`]).
    pub fn save_state_collective(
        &mut self,
        model: &Yolo,
        path: impl AsRef<Path>,
        user: &serde_json::Value,
        write: bool,
    ) -> Result<()> {
        let open = self.pending.iter().any(Option::is_some);
        let pending = match self.grad_reduce.as_mut() {
            Some(r) if open => {
                let mut p = self.pending.clone();
                r.reduce(&mut p, self.optimizer.groups().params())?;
                p
            }
            _ => self.pending.clone(),
        };
        if write { self.save_with_pending(model, path.as_ref(), user, &pending) } else { Ok(()) }
    }

    /// Forgets the gradients accumulated since the last step (a resumed rank other than 0: the checkpoint's window
    /// is already the sum of every rank's).
    pub fn drop_pending(&mut self) {
        self.pending.iter_mut().for_each(|g| *g = None);
    }

    /// Whether gradients have been accumulated since the last optimizer step (a window is open).
    pub fn window_open(&self) -> bool {
        self.pending.iter().any(Option::is_some)
    }

    fn save_with_pending(
        &self,
        model: &Yolo,
        path: &Path,
        user: &serde_json::Value,
        pending: &[Option<Tensor>],
    ) -> Result<()> {
        let mut tensors = prefixed("model.", model.state_dict()?);
        tensors.extend(prefixed("ema.", self.ema.model().state_dict()?));
        for (p, s) in self.optimizer.groups().params().iter().zip(self.optimizer.state()) {
            let bufs = [
                ("momentum_buffer", &s.momentum_buffer),
                ("momentum_buffer_SGD", &s.momentum_buffer_sgd),
                ("exp_avg", &s.exp_avg),
                ("exp_avg_sq", &s.exp_avg_sq),
            ];
            for (what, t) in bufs {
                if let Some(t) = t {
                    tensors.push((format!("optim.state.{}.{what}", p.name), t.clone()));
                }
            }
        }
        for (p, g) in self.optimizer.groups().params().iter().zip(pending) {
            if let Some(g) = g {
                tensors.push((format!("optim.grad.{}", p.name), g.clone()));
            }
        }
        let state = serde_json::to_string(&self.driver_state()?)
            .map_err(|e| OptimError::BadInput(format!("serialising the optimizer state: {e}")))?;
        let user = serde_json::to_string(user)
            .map_err(|e| OptimError::BadInput(format!("serialising the checkpoint metadata: {e}")))?;
        let meta = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("optim".to_string(), state),
            ("user".to_string(), user),
        ]);
        save_safetensors(path, &tensors, meta)
    }

    /// Restores `model`, the EMA and the optimizer from a checkpoint written by [`Optimization::save_state`] and
    /// returns its `user` metadata. `self` must have been built for `model` with the checkpoint's settings and
    /// run shape (read them first with [`read_user_metadata`]); anything else is an error. The checkpoint is
    /// checked before anything is changed, except that a model and EMA that do not fit are found while loading.
    pub fn load_state(&mut self, model: &mut Yolo, path: impl AsRef<Path>) -> Result<serde_json::Value> {
        let path = path.as_ref();
        let (mut tensors, meta) = load_safetensors(path, model.device())?;
        check_format(path, &meta)?;
        let user = parse_user(path, &meta)?;
        let state: DriverState =
            serde_json::from_str(meta.get("optim").ok_or_else(|| bad(path, "no `optim` metadata"))?)
                .map_err(|e| bad(path, format!("`optim` metadata: {e}")))?;
        if state.settings != self.settings || state.shape != self.shape {
            return Err(bad(
                path,
                format!(
                    "the checkpoint was trained with {:?} / {:?}, this optimizer is built with {:?} / {:?}",
                    state.settings, state.shape, self.settings, self.shape
                ),
            ));
        }
        if state.resolved != self.resolved || state.schedule != self.schedule {
            return Err(bad(path, "the resolved optimizer or schedule differs (another model class count?)"));
        }
        if state.lr.len() != self.lr.len() || state.momentum.len() != self.momentum.len() {
            return Err(bad(path, "the checkpoint has another number of parameter groups"));
        }
        let params = self.optimizer.groups().params().to_vec();
        if state.params.len() != params.len() || state.params.iter().zip(&params).any(|((n, _), p)| *n != p.name) {
            return Err(bad(path, "the checkpoint's parameters are not this model's"));
        }

        // Optimizer buffers and pending gradients, checked against the parameters' shapes.
        let mut take = |key: String, shape: &[usize]| -> Result<Option<Tensor>> {
            match tensors.remove(&key) {
                None => Ok(None),
                Some(t) if t.dims() == shape => Ok(Some(t)),
                Some(t) => Err(bad(path, format!("`{key}` has shape {:?}, the parameter {:?}", t.dims(), shape))),
            }
        };
        let mut bufs = Vec::with_capacity(params.len());
        for (p, (_, step)) in params.iter().zip(&state.params) {
            let dims = p.var.dims();
            let s = super::optimizer::ParamState {
                momentum_buffer: take(format!("optim.state.{}.momentum_buffer", p.name), dims)?,
                momentum_buffer_sgd: take(format!("optim.state.{}.momentum_buffer_SGD", p.name), dims)?,
                exp_avg: take(format!("optim.state.{}.exp_avg", p.name), dims)?,
                exp_avg_sq: take(format!("optim.state.{}.exp_avg_sq", p.name), dims)?,
                step: *step,
            };
            let grad = take(format!("optim.grad.{}", p.name), dims)?;
            bufs.push((s, grad));
        }
        let mut model_sd = HashMap::new();
        let mut ema_sd = HashMap::new();
        for (k, t) in tensors {
            if let Some(key) = k.strip_prefix("model.") {
                model_sd.insert(key.to_string(), t);
            } else if let Some(key) = k.strip_prefix("ema.") {
                ema_sd.insert(key.to_string(), t);
            } else {
                return Err(bad(path, format!("unexpected tensor `{k}`")));
            }
        }

        model.load_state_dict(&model_sd, LoadMode::Strict, path)?;
        self.ema.model_mut().load_state_dict(&ema_sd, LoadMode::Strict, path)?;
        self.ema.set_updates(state.ema_updates);
        for ((slot, pending), (s, grad)) in self.optimizer.state_mut().iter_mut().zip(self.pending.iter_mut()).zip(bufs)
        {
            *slot = s;
            *pending = grad;
        }
        self.lr = state.lr;
        self.momentum = state.momentum;
        self.accumulate = state.accumulate;
        self.last_opt_step = state.last_opt_step;
        self.last_ni = state.last_ni;
        self.scheduled_epoch = state.scheduled_epoch;
        self.steps = state.steps;
        self.skipped = state.skipped;
        if let (Some(scaler), Some(saved)) = (self.scaler.as_mut(), state.scaler) {
            let on_device = scaler.on_device();
            *scaler = LossScaler::from_state(saved);
            if on_device {
                scaler.to_device(model.device())?;
            }
        }
        Ok(user)
    }
}
