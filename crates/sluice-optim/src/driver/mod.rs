//! [`Optimization`]: the one object the training loop drives per batch. It owns the optimizer, the schedule,
//! the gradient accumulation and the EMA, and does per batch what Ultralytics' trainer does between the forward
//! pass and the next batch: warmup of the accumulation factor, learning rates and momentum; backward; gradient
//! accumulation; when due, clipping to norm 10, the optimizer step and the EMA update.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use sluice_model::Yolo;

use super::ema::ModelEma;
use super::error::{OptimError, Result};
use super::groups::{BOOST, Group, ParamGroups};
use super::optimizer::{
    GroupHyper, MAX_GRAD_NORM, Optimizer, clip_coefficient, clip_coefficient_tensor, scale_grads, total_grad_norm,
};
use super::scaler::{LossScaler, ScalerSettings, ScalerState};
use super::schedule::{Schedule, warmup_accumulate};
use super::settings::{OptimSettings, Resolved, Rule, RunShape, resolve};
use sluice_kernels::multi_tensor::{self, MultiTensor};

/// Combines the gradients that every data-parallel rank accumulated since the last optimizer step, in place, before
/// clipping and the step (so the norm, the non-finite skip and the update are the same on every rank). `grads`
/// is in [`ParamGroups::params`] order; `None` is a parameter without a gradient.
pub trait GradReduce: Send {
    /// Replaces `grads` with their combination over the ranks.
    fn reduce(&mut self, grads: &mut [Option<Tensor>], params: &[super::groups::Param]) -> Result<()>;
}

/// What one call of [`Optimization::batch`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchOutcome {
    /// An optimizer step (and an EMA update) happened.
    pub stepped: bool,
    /// The loss or the gradient norm was not finite: the batch's gradients and every gradient accumulated since
    /// the last step were dropped, nothing was updated, and the next accumulation window starts after this batch.
    pub skipped_nonfinite: bool,
    /// Under float16 loss scaling, the (scaled) gradients overflowed: the step was skipped and the scale backed
    /// off, as `GradScaler` does. Not a non-finite loss: an expected event while the scale settles.
    pub skipped_overflow: bool,
    /// The total gradient norm before clipping, when a step was due.
    pub grad_norm: Option<f64>,
    /// The accumulation factor in force for this batch.
    pub accumulate: usize,
}

/// The dynamic state that a checkpoint must carry besides tensors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DriverState {
    pub(crate) settings: OptimSettings,
    pub(crate) shape: RunShape,
    pub(crate) resolved: Resolved,
    pub(crate) schedule: Schedule,
    pub(crate) lr: Vec<f64>,
    pub(crate) momentum: Vec<f64>,
    pub(crate) accumulate: usize,
    pub(crate) last_opt_step: i64,
    pub(crate) last_ni: Option<usize>,
    pub(crate) scheduled_epoch: Option<usize>,
    pub(crate) steps: u64,
    pub(crate) skipped: u64,
    pub(crate) ema_updates: u64,
    /// Per parameter (sorted by name): name and the number of updates it received.
    pub(crate) params: Vec<(String, u64)>,
    /// The loss scaler of a float16 mixed-precision run.
    #[serde(default)]
    pub(crate) scaler: Option<ScalerState>,
}

/// Optimizer, schedule, warmup, gradient accumulation and EMA of one training run, as Ultralytics' trainer.
#[derive(Debug)]
pub struct Optimization {
    pub(crate) settings: OptimSettings,
    pub(crate) shape: RunShape,
    pub(crate) resolved: Resolved,
    pub(crate) schedule: Schedule,
    pub(crate) optimizer: Optimizer,
    pub(crate) ema: ModelEma,
    /// Per group (`param_groups` order): current learning rate and (SGD) momentum.
    pub(crate) lr: Vec<f64>,
    pub(crate) momentum: Vec<f64>,
    pub(crate) accumulate: usize,
    pub(crate) last_opt_step: i64,
    pub(crate) last_ni: Option<usize>,
    pub(crate) scheduled_epoch: Option<usize>,
    /// Gradients summed since the last step, in [`ParamGroups::params`] order.
    pub(crate) pending: Vec<Option<Tensor>>,
    pub(crate) steps: u64,
    pub(crate) skipped: u64,
    /// Clip and skip on the device ([`StepPath::Device`]).
    pub(crate) device_checks: bool,
    /// Device-side skips not yet read: a scalar float32 count.
    pub(crate) device_skips: Option<Tensor>,
    /// The data-parallel gradient combination ([`Optimization::set_grad_reduce`]).
    pub(crate) grad_reduce: Option<Box<dyn GradReduce>>,
    /// Dynamic loss scaling ([`StepOptions::loss_scaling`]).
    pub(crate) scaler: Option<LossScaler>,
    /// The device step as one pass per stage over every tensor ([`StepPath::DeviceFused`]).
    pub(crate) fused: Option<MultiTensor>,
}

/// Where the optimizer step's gradient checks run; fixed when the optimization is built
/// ([`Optimization::with_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StepPath {
    /// Clipping and the non-finite skip from the gradient norm read on the host at every step (the CPU's path).
    #[default]
    Host,
    /// Clipping and the non-finite skip on the device, with no read: for GPUs, where reading the gradient norm at
    /// every step would stall the device. The clip factor is a tensor, and the optimizer step and the EMA update
    /// are kept only where the norm is finite ([`Optimizer::step_masked`]); skipped steps are summed on the device
    /// and read by [`Optimization::take_device_skips`]. With finite gradients the result equals the host path's
    /// bit for bit. A skipped step still advances the step counters (Adam's bias correction, the EMA's decay), and
    /// [`BatchOutcome::grad_norm`] is `None`.
    Device,
    /// As [`StepPath::Device`], with the step's norm, clip, update and EMA as one pass each over every tensor
    /// ([`sluice_kernels::multi_tensor`]: four kernels on a GPU instead of thousands of small ones), for SGD, Adam
    /// and AdamW, and for MuSGD's SGD parameters (its Muon update is matrix work and keeps the composed ops, masked
    /// by the fused norm). The arithmetic is the composed ops'; only the norm sums in another order.
    DeviceFused,
}

/// How the optimizer step runs, given once to [`Optimization::with_step`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StepOptions {
    /// Where the gradient checks run.
    pub path: StepPath,
    /// Float16 mixed precision's dynamic loss scaling (`GradScaler`); `None` without. On the device paths the scale
    /// lives on the model's device.
    pub loss_scaling: Option<ScalerSettings>,
}

impl BatchOutcome {
    /// A batch whose gradients were added to the accumulation window, with no step.
    fn accumulated(accumulate: usize) -> Self {
        Self { stepped: false, skipped_nonfinite: false, skipped_overflow: false, grad_norm: None, accumulate }
    }
}

impl std::fmt::Debug for dyn GradReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GradReduce")
    }
}

impl Optimization {
    /// [`Optimization::new`] with the step run as `step` says.
    pub fn with_step(model: &Yolo, settings: &OptimSettings, shape: RunShape, step: StepOptions) -> Result<Self> {
        let mut s = Self::new(model, settings, shape)?;
        s.device_checks = step.path != StepPath::Host;
        if step.path == StepPath::DeviceFused {
            s.fused = Some(MultiTensor::new(model.device())?);
        }
        if let Some(settings) = step.loss_scaling {
            let mut scaler = LossScaler::new(settings);
            if s.device_checks {
                scaler.to_device(model.device())?;
            }
            s.scaler = Some(scaler);
        }
        Ok(s)
    }

    /// Builds the optimizer for `model` (parameter groups, `auto` resolved for `model`'s class count), the
    /// schedule and warmup for a run of this shape, and the EMA (a copy of `model` as it is now), with the host's
    /// step path and no loss scaling ([`Optimization::with_step`] takes them).
    pub fn new(model: &Yolo, settings: &OptimSettings, shape: RunShape) -> Result<Self> {
        let resolved = resolve(settings, model.config().nc, &shape)?;
        let schedule =
            Schedule::new(shape.epochs, settings.lrf, settings.cos_lr, settings.warmup_epochs, shape.batches_per_epoch);
        let groups =
            if resolved.rule == Rule::MuSgd { ParamGroups::new_muon(model)? } else { ParamGroups::new(model)? };
        let n = groups.params().len();
        let n_groups = groups.len();
        let mut optimizer = Optimizer::new(resolved.rule, groups);
        optimizer.use_buffers(model.param_packs());
        let ema = ModelEma::new(model)?;
        let mut s = Self {
            settings: *settings,
            shape,
            resolved,
            schedule,
            optimizer,
            ema,
            lr: vec![0.0; n_groups],
            momentum: vec![resolved.momentum; n_groups],
            accumulate: resolved.accumulate,
            last_opt_step: -1,
            last_ni: None,
            scheduled_epoch: None,
            pending: vec![None; n],
            steps: 0,
            skipped: 0,
            device_checks: false,
            device_skips: None,
            grad_reduce: None,
            scaler: None,
            fused: None,
        };
        // LambdaLR's construction sets every group to initial_lr · lf(0).
        s.lr = (0..n_groups).map(|i| s.initial_lr(i) * s.schedule.lf(0)).collect();
        Ok(s)
    }

    /// `model` with the parameters of each group that the optimizer updates element-wise as parts of one buffer
    /// ([`Yolo::with_params_packed`]), for the optimizer of these settings and this run shape: built over the
    /// packed model, it updates each such group with one op per step of the update over the buffer (a few dozen
    /// ops per step in all, not a dozen per parameter), the buffer takes the new values without a copy, and the EMA
    /// reads the model's values with one copy per buffer. The values and the update's arithmetic are unchanged.
    pub fn pack_model(model: Yolo, settings: &OptimSettings, shape: RunShape) -> Result<Yolo> {
        let resolved = resolve(settings, model.config().nc, &shape)?;
        let groups =
            if resolved.rule == Rule::MuSgd { ParamGroups::new_muon(&model)? } else { ParamGroups::new(&model)? };
        let lists = Optimizer::new(resolved.rule, groups).flat_groups();
        Ok(model.with_params_packed(&lists)?)
    }

    /// `param_groups[i]["initial_lr"]`: lr0, or three times it for MuSGD's boosted groups.
    fn initial_lr(&self, i: usize) -> f64 {
        let boosted = self.optimizer.groups().group_at(i).1;
        if boosted { self.resolved.lr0 * BOOST } else { self.resolved.lr0 }
    }

    /// The resolved optimizer (rule, lr0, momentum, scaled weight decay, accumulation, `auto`'s estimate).
    pub fn resolved(&self) -> &Resolved {
        &self.resolved
    }

    /// The schedule (epochs, `lrf`, cosine or linear, warmup iterations).
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &OptimSettings {
        &self.settings
    }

    /// The run shape it was built for.
    pub fn shape(&self) -> &RunShape {
        &self.shape
    }

    /// The parameter groups.
    pub fn groups(&self) -> &ParamGroups {
        self.optimizer.groups()
    }

    /// Ultralytics' optimizer log line, e.g.
    /// `AdamW(lr=0.000119, momentum=0.9) with parameter groups 57 weight(decay=0.0), 63 weight(…), 63 bias(…)`.
    pub fn describe(&self) -> String {
        format!(
            "{}(lr={}, momentum={}) with parameter groups {}",
            self.resolved.rule.name(),
            self.resolved.lr0,
            self.resolved.momentum,
            self.groups().summary(self.resolved.weight_decay)
        )
    }

    /// Current learning rate of each group: `lr/pg0` (decayed weights), `lr/pg1` (BN weights), `lr/pg2`
    /// (biases), the values and order of Ultralytics' `results.csv`; MuSGD's eight groups in its order.
    pub fn lrs(&self) -> Vec<f64> {
        self.lr.clone()
    }

    /// Current SGD momentum of each group (Adam's β1 stays at the resolved momentum: warmup does not touch it,
    /// as Ultralytics' warmup only changes groups that have a `momentum` entry).
    pub fn momenta(&self) -> Vec<f64> {
        if self.resolved.rule.has_sgd_momentum() {
            self.momentum.clone()
        } else {
            vec![self.resolved.momentum; self.momentum.len()]
        }
    }

    /// The accumulation factor in force (batches per optimizer step).
    pub fn accumulate(&self) -> usize {
        self.accumulate
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Steps skipped because the loss or the gradient norm was not finite.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The loss scaler's state (one device read where the scale lives there); `None` without loss scaling.
    pub fn loss_scale(&self) -> Result<Option<ScalerState>> {
        self.scaler.as_ref().map(LossScaler::state).transpose()
    }

    /// The EMA model: what validation and checkpoints use.
    pub fn ema_model(&self) -> &Yolo {
        self.ema.model()
    }

    /// The EMA (its update count).
    pub fn ema(&self) -> &ModelEma {
        &self.ema
    }

    /// Handles one training batch whose loss (`LossOutput::total`, a scalar) was just computed by a train-mode
    /// forward of `model`: `ni = i + batches_per_epoch · epoch` is the global iteration (strictly increasing).
    ///
    /// In order: the epoch's learning rates `lr0 · lf(epoch)` (at the first batch of an epoch, Ultralytics'
    /// `scheduler.step()`); during warmup (`ni ≤ nw`) the accumulation factor, each group's learning rate (the
    /// bias group from `warmup_bias_lr`, the others from 0, towards `lr0 · lf(epoch)`) and the SGD momentum
    /// (from `warmup_momentum`); a non-finite loss skips everything below; backward, the gradients added to the
    /// accumulated ones; when `ni − last_step ≥ accumulate`: clipping to total norm 10 (a non-finite norm skips
    /// the step), the optimizer step, zeroed gradients and the EMA update.
    pub fn batch(&mut self, model: &Yolo, loss: &Tensor, ni: usize, epoch: usize) -> Result<BatchOutcome> {
        self.batch_inner(model, loss, None, ni, epoch)
    }

    /// [`Optimization::batch`] when the caller already knows whether the loss is finite (it read the loss items
    /// anyway), so the check costs no second device read.
    pub fn batch_known_finite(
        &mut self,
        model: &Yolo,
        loss: &Tensor,
        finite: bool,
        ni: usize,
        epoch: usize,
    ) -> Result<BatchOutcome> {
        self.batch_inner(model, loss, Some(finite), ni, epoch)
    }

    fn batch_inner(
        &mut self,
        model: &Yolo,
        loss: &Tensor,
        finite: Option<bool>,
        ni: usize,
        epoch: usize,
    ) -> Result<BatchOutcome> {
        self.check_model(model)?;
        if let Some(last) = self.last_ni
            && ni <= last
        {
            return Err(OptimError::BadInput(format!("iteration {ni} after iteration {last}")));
        }
        if loss.rank() != 0 {
            return Err(OptimError::BadInput(format!("the loss must be a scalar, got shape {:?}", loss.dims())));
        }
        self.schedule_epoch(epoch);
        self.warmup(ni, epoch);
        self.last_ni = Some(ni);
        let accumulate = self.accumulate;

        let finite = match finite {
            Some(f) => f,
            None => {
                sluice_core::syncs::record_if(!loss.device().is_cpu(), sluice_core::syncs::Site::NonFiniteCheck);
                loss.to_dtype(DType::F64)?.to_scalar::<f64>()?.is_finite()
            }
        };
        if !finite {
            return Ok(self.skip_nonfinite(ni, None));
        }
        self.backward(loss)?;
        if (ni as i64) - self.last_opt_step < accumulate as i64 {
            return Ok(BatchOutcome::accumulated(accumulate));
        }
        candle_core::ledger::set_phase("optimizer");

        if let Some(r) = self.grad_reduce.as_mut() {
            r.reduce(&mut self.pending, self.optimizer.groups().params())?;
        }
        if self.device_checks && self.fused.is_some() {
            // The fused norm divides by the loss scale itself.
            return self.fused_step(model, ni, accumulate);
        }
        if self.device_checks {
            return self.device_step(model, ni, accumulate);
        }
        self.host_step(model, ni, accumulate)
    }

    /// The backward pass of `loss` (scaled under loss scaling), its gradients added into the window's.
    fn backward(&mut self, loss: &Tensor) -> Result<()> {
        // Phases of the op ledger (`sluice bench step-cost`); nothing unless one is recording.
        candle_core::ledger::set_phase("backward");
        let grads = match &self.scaler {
            Some(s) => s.scale_loss(loss)?.backward()?,
            None => loss.backward()?,
        };
        let mut any = false;
        for (param, acc) in self.optimizer.groups().params().iter().zip(self.pending.iter_mut()) {
            if let Some(g) = grads.get(param.var.as_tensor()) {
                any = true;
                *acc = Some(match acc.take() {
                    None => g.clone(),
                    Some(a) => (a + g)?,
                });
            }
        }
        if !any {
            return Err(OptimError::BadInput("the loss does not depend on any trainable parameter".into()));
        }
        Ok(())
    }

    /// A step skipped for a non-finite loss or gradient: the window's gradients go, and it counts.
    fn skip_nonfinite(&mut self, ni: usize, grad_norm: Option<f64>) -> BatchOutcome {
        self.pending.iter_mut().for_each(|g| *g = None);
        self.last_opt_step = ni as i64;
        self.skipped += 1;
        let accumulate = self.accumulate;
        BatchOutcome { stepped: false, skipped_nonfinite: true, skipped_overflow: false, grad_norm, accumulate }
    }

    /// The step on the host: the gradients unscaled, their norm read, the step skipped when it is not finite, else
    /// clipped and applied.
    fn host_step(&mut self, model: &Yolo, ni: usize, accumulate: usize) -> Result<BatchOutcome> {
        if let Some(s) = &self.scaler {
            s.unscale(&mut self.pending)?;
        }
        let norm = total_grad_norm(&self.pending)?;
        if !norm.is_finite() {
            if let Some(s) = self.scaler.as_mut() {
                // `GradScaler.step` skips the update and `update` backs off; the window's gradients go. Ultralytics'
                // `optimizer_step` updates the EMA all the same (towards the unchanged model).
                s.update(true);
                self.pending.iter_mut().for_each(|g| *g = None);
                self.last_opt_step = ni as i64;
                self.ema.update(model)?;
                return Ok(BatchOutcome {
                    stepped: false,
                    skipped_nonfinite: false,
                    skipped_overflow: true,
                    grad_norm: Some(norm),
                    accumulate,
                });
            }
            return Ok(self.skip_nonfinite(ni, Some(norm)));
        }
        let mut grads = std::mem::replace(&mut self.pending, vec![None; self.optimizer.groups().params().len()]);
        scale_grads(&mut grads, clip_coefficient(norm, MAX_GRAD_NORM))?;
        let hyper = self.hyper();
        self.optimizer.step(&grads, &hyper)?;
        self.last_opt_step = ni as i64;
        self.steps += 1;
        self.ema.update(model)?;
        if let Some(s) = self.scaler.as_mut() {
            s.update(false);
        }
        Ok(BatchOutcome { stepped: true, grad_norm: Some(norm), ..BatchOutcome::accumulated(accumulate) })
    }

    fn fused_rule(&self) -> Option<multi_tensor::Rule> {
        match self.resolved.rule {
            Rule::Sgd | Rule::MuSgd => Some(multi_tensor::Rule::SgdNesterov),
            Rule::Adam => Some(multi_tensor::Rule::Adam),
            Rule::AdamW => Some(multi_tensor::Rule::AdamW),
        }
    }

    /// Data-parallel training: `reduce` combines the ranks' accumulated gradients at every optimizer step. Once per
    /// step, not per batch: the sum is linear, so reducing the accumulated window equals reducing each batch (as
    /// PyTorch's DDP does) up to float reassociation, with a fraction of the traffic.
    pub fn set_grad_reduce(&mut self, reduce: Box<dyn GradReduce>) {
        self.grad_reduce = Some(reduce);
    }

    /// The device-side skips since the last call (one read; 0 without device checks), added to
    /// [`Optimization::skipped`].
    pub fn take_device_skips(&mut self) -> Result<u64> {
        let Some(t) = self.device_skips.take() else { return Ok(0) };
        sluice_core::syncs::record_if(!t.device().is_cpu(), sluice_core::syncs::Site::NonFiniteCheck);
        let n = t.to_dtype(DType::F32)?.to_scalar::<f32>()? as u64;
        self.skipped += n;
        Ok(n)
    }

    fn device_step(&mut self, model: &Yolo, ni: usize, accumulate: usize) -> Result<BatchOutcome> {
        let grads = std::mem::replace(&mut self.pending, vec![None; self.optimizer.groups().params().len()]);
        // Each flat group's gradients concatenated once, for the norm and the update.
        let flat = self.optimizer.flat_grads(&grads)?;
        if let Some(norm) = self.optimizer.grad_norm_tensor(&grads, &flat)? {
            // Under loss scaling the gradients are still scaled: their norm is unscaled here and `1/scale` joins
            // the clip's factor, so each gradient takes one multiply instead of two. The scale is a power of two
            // (as `GradScaler`'s growth and back-off keep it), so both products are exact and the values are those
            // of unscaling first.
            let inv = self.scaler.as_ref().map(LossScaler::inverse_tensor).transpose()?.flatten();
            let norm = match &inv {
                Some(inv) => norm.broadcast_mul(inv)?,
                None => norm,
            };
            #[allow(clippy::eq_op)] // x − x is 0 exactly when x is finite.
            let ok = (&norm - &norm)?.eq(0.0)?;
            let coef = clip_coefficient_tensor(&norm, MAX_GRAD_NORM)?;
            let coef = match &inv {
                Some(inv) => coef.broadcast_mul(inv)?,
                None => coef,
            };
            let hyper = self.hyper();
            self.optimizer.step_masked_scaled(&grads, flat, &hyper, &ok, &coef)?;
            if let Some(s) = self.scaler.as_mut() {
                // Under loss scaling a non-finite gradient is an overflow: the scaler counts it and backs off, and
                // the EMA is updated all the same, as Ultralytics' `optimizer_step` does.
                s.update_masked(&ok)?;
                self.ema.update(model)?;
            } else {
                self.ema.update_masked(model, &ok)?;
                let skip = ok.to_dtype(DType::F32)?.affine(-1.0, 1.0)?;
                self.device_skips = Some(match self.device_skips.take() {
                    None => skip,
                    Some(s) => (s + skip)?,
                });
            }
        } else {
            let hyper = self.hyper();
            self.optimizer.step(&grads, &hyper)?;
            self.ema.update(model)?;
        }
        self.last_opt_step = ni as i64;
        self.steps += 1;
        Ok(BatchOutcome { stepped: true, ..BatchOutcome::accumulated(accumulate) })
    }

    /// [`Optimization::device_step`] as the fused passes: the same masking, counters and loss-scaler update.
    fn fused_step(&mut self, model: &Yolo, ni: usize, accumulate: usize) -> Result<BatchOutcome> {
        let (Some(rule), Some(mut mt)) = (self.fused_rule(), self.fused.take()) else {
            return Err(OptimError::BadInput("the fused step is not set up".into()));
        };
        let outcome = self.fused_step_with(&mut mt, rule, model, ni, accumulate);
        self.fused = Some(mt);
        outcome
    }

    fn fused_step_with(
        &mut self,
        mt: &mut MultiTensor,
        rule: multi_tensor::Rule,
        model: &Yolo,
        ni: usize,
        accumulate: usize,
    ) -> Result<BatchOutcome> {
        let mut grads = std::mem::replace(&mut self.pending, vec![None; self.optimizer.groups().params().len()]);
        let all: Vec<usize> = grads.iter().enumerate().filter_map(|(i, g)| g.as_ref().map(|_| i)).collect();
        // MuSGD's Muon parameters take the composed update below; the rest, the fused one.
        let params = self.optimizer.groups().params().to_vec();
        let is_muon = |i: usize| self.resolved.rule == Rule::MuSgd && params[i].group == Group::Muon;
        let idx: Vec<usize> = all.iter().copied().filter(|&i| !is_muon(i)).collect();
        let muon: Vec<usize> = all.iter().copied().filter(|&i| is_muon(i)).collect();
        // Contiguous, and alive until the kernels that read them are queued.
        let gs = all
            .iter()
            .filter_map(|&i| grads[i].as_ref().map(|g| g.contiguous()))
            .collect::<candle_core::Result<Vec<Tensor>>>()?;
        let grefs: Vec<&Tensor> = gs.iter().collect();
        let scale = self.scaler.as_ref().and_then(LossScaler::scale_tensor);
        let norm = mt.grad_norm(&grefs, scale, MAX_GRAD_NORM as f32)?;
        let hyper = self.hyper();
        let groups: Vec<usize> = idx.iter().map(|&i| self.optimizer.groups().index_of(&params[i])).collect();
        let fused_grads: Vec<&Tensor> =
            all.iter().zip(&grefs).filter(|(i, _)| !is_muon(**i)).map(|(_, g)| *g).collect();
        let states = self.optimizer.state_mut();
        let adam = rule != multi_tensor::Rule::SgdNesterov;
        let (mut s0, mut s1, mut consts) = (Vec::new(), Vec::new(), Vec::new());
        for (&i, &group) in idx.iter().zip(&groups) {
            let st = &mut states[i];
            st.step += 1;
            let h = hyper[group];
            let mh =
                multi_tensor::Hyper { lr: h.lr, momentum: h.momentum, weight_decay: h.weight_decay, step: st.step };
            consts.push(multi_tensor::consts(rule, mh));
            if adam {
                s0.push(st.exp_avg.take());
                s1.push(st.exp_avg_sq.take());
            } else {
                s0.push(st.momentum_buffer.take());
            }
        }
        let vars: Vec<&candle_core::Var> = idx.iter().map(|&i| &params[i].var).collect();
        let updated = mt.update(rule, &vars, &fused_grads, &mut s0, &mut s1, &consts, &norm);
        // The state goes back whether or not the update ran.
        for (k, &i) in idx.iter().enumerate() {
            let st = &mut states[i];
            if adam {
                st.exp_avg = s0[k].take();
                st.exp_avg_sq = s1.get_mut(k).and_then(Option::take);
            } else {
                st.momentum_buffer = s0[k].take();
            }
        }
        updated?;
        let ok = norm.narrow(0, 2, 1)?.squeeze(0)?;
        if !muon.is_empty() {
            // The composed Muon update, its gradients clipped and unscaled by the fused norm's factors and the step
            // masked by its finite flag.
            let factor = (norm.narrow(0, 1, 1)? * norm.narrow(0, 3, 1)?)?.squeeze(0)?;
            let mut muon_grads: Vec<Option<Tensor>> = vec![None; grads.len()];
            for &i in &muon {
                if let Some(g) = grads[i].take() {
                    muon_grads[i] = Some(g.broadcast_mul(&factor.to_dtype(g.dtype())?)?);
                }
            }
            self.optimizer.step_masked(&muon_grads, &hyper, &ok.ne(0.0)?)?;
        }
        if let Some(s) = self.scaler.as_mut() {
            // As the composed path: an overflow backs the scale off, and the EMA is updated all the same.
            s.update_masked(&ok)?;
            self.ema.update_fused(model, mt, None)?;
        } else {
            self.ema.update_fused(model, mt, Some(&norm))?;
            let skip = ok.affine(-1.0, 1.0)?;
            self.device_skips = Some(match self.device_skips.take() {
                None => skip,
                Some(s) => (s + skip)?,
            });
        }
        self.last_opt_step = ni as i64;
        self.steps += 1;
        Ok(BatchOutcome { stepped: true, ..BatchOutcome::accumulated(accumulate) })
    }

    /// Marks the end of an epoch and returns its learning rates (`lr/pg0..2` for `results.csv`). The next
    /// epoch's scheduled rates are applied by its first [`Optimization::batch`], so [`Optimization::lrs`] keeps
    /// answering this epoch's values until then, and a checkpoint saved now resumes exactly.
    pub fn end_epoch(&mut self, epoch: usize) -> Result<Vec<f64>> {
        if let Some(e) = self.scheduled_epoch
            && e != epoch
        {
            return Err(OptimError::BadInput(format!("end of epoch {epoch}, but the last batch was of epoch {e}")));
        }
        Ok(self.lr.clone())
    }

    fn check_model(&self, model: &Yolo) -> Result<()> {
        let first = &self.optimizer.groups().params()[0];
        match model.var(&first.name) {
            Some(v) if v.as_tensor().id() == first.var.as_tensor().id() => Ok(()),
            _ => Err(OptimError::BadInput(
                "batch() was given another model than the one the optimizer was built for".into(),
            )),
        }
    }

    /// Ultralytics' `scheduler.step()` at an epoch's start: every group to `initial_lr · lf(epoch)`.
    fn schedule_epoch(&mut self, epoch: usize) {
        if self.scheduled_epoch != Some(epoch) {
            self.lr = (0..self.lr.len()).map(|i| self.initial_lr(i) * self.schedule.lf(epoch)).collect();
            self.scheduled_epoch = Some(epoch);
        }
    }

    fn warmup(&mut self, ni: usize, epoch: usize) {
        if !self.schedule.in_warmup(ni) {
            return;
        }
        self.accumulate = warmup_accumulate(&self.schedule, ni, self.resolved.accumulate);
        for i in 0..self.lr.len() {
            let target = self.initial_lr(i) * self.schedule.lf(epoch);
            let kind = self.optimizer.groups().group_at(i).0;
            let start = if kind == Group::Bias { self.resolved.warmup_bias_lr } else { 0.0 };
            self.lr[i] = self.schedule.warmup_interp(ni, start, target);
            if self.resolved.rule.has_sgd_momentum() {
                self.momentum[i] =
                    self.schedule.warmup_interp(ni, self.settings.warmup_momentum, self.resolved.momentum);
            }
        }
    }

    fn hyper(&self) -> Vec<GroupHyper> {
        let momenta = self.momenta();
        (0..self.lr.len())
            .map(|i| {
                let kind = self.optimizer.groups().group_at(i).0;
                GroupHyper {
                    lr: self.lr[i],
                    momentum: momenta[i],
                    weight_decay: if matches!(kind, Group::Weight | Group::Muon) {
                        self.resolved.weight_decay
                    } else {
                        0.0
                    },
                }
            })
            .collect()
    }

    pub(crate) fn driver_state(&self) -> Result<DriverState> {
        Ok(DriverState {
            settings: self.settings,
            shape: self.shape,
            resolved: self.resolved,
            schedule: self.schedule,
            lr: self.lr.clone(),
            momentum: self.momentum.clone(),
            accumulate: self.accumulate,
            last_opt_step: self.last_opt_step,
            last_ni: self.last_ni,
            scheduled_epoch: self.scheduled_epoch,
            steps: self.steps,
            skipped: self.skipped,
            ema_updates: self.ema.updates(),
            params: self
                .optimizer
                .groups()
                .params()
                .iter()
                .zip(self.optimizer.state())
                .map(|(p, s)| (p.name.clone(), s.step))
                .collect(),
            scaler: self.loss_scale()?,
        })
    }
}

#[cfg(test)]
mod tests;
