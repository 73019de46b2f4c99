//! Dynamic loss scaling for float16 mixed precision, as PyTorch's `torch.amp.GradScaler` with its defaults (which
//! Ultralytics' trainer uses): the loss is multiplied by the scale before the backward pass, so small gradients
//! survive float16's range; at the optimizer step the gradients are multiplied by the reciprocal; a non-finite
//! gradient skips the step and halves the scale (`backoff_factor` 0.5), and every `growth_interval` (2000)
//! consecutive good steps double it (`growth_factor` 2), from 2^16.
//!
//! Two forms with one arithmetic: [`LossScaler`] keeps the scale on the host (a value, for the CPU path that reads
//! the gradient norm at every step anyway), and, after [`LossScaler::to_device`], as float32 scalars on the device,
//! updated by tensor ops from the step's finite mask, so a GPU step never waits on a read. The scale is a power of
//! two, so scaling and unscaling are exact in float32 and the unscaled gradients equal the unscaled run's bit for
//! bit whenever no value overflows.

use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};

use super::error::Result;

/// `GradScaler`'s constructor arguments.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerSettings {
    /// The first scale (`init_scale`, 2^16).
    pub init_scale: f32,
    /// Factor on growth (`growth_factor`, 2).
    pub growth_factor: f32,
    /// Factor on a non-finite gradient (`backoff_factor`, 0.5).
    pub backoff_factor: f32,
    /// Consecutive good steps before a growth (`growth_interval`, 2000).
    pub growth_interval: u32,
}

impl Default for ScalerSettings {
    fn default() -> Self {
        Self { init_scale: 65536.0, growth_factor: 2.0, backoff_factor: 0.5, growth_interval: 2000 }
    }
}

/// The scaler's state as a checkpoint carries it (`GradScaler.state_dict()`'s `scale` and `_growth_tracker`,
/// plus the steps it skipped).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScalerState {
    /// The constructor arguments.
    pub settings: ScalerSettings,
    /// The scale the next loss is multiplied by.
    pub scale: f32,
    /// Consecutive good steps since the last growth or backoff.
    pub growth_tracker: u32,
    /// Optimizer steps skipped for a non-finite gradient since the run started.
    pub overflows: u64,
}

/// The device form: float32 scalars, never read inside the step.
#[derive(Debug, Clone)]
struct OnDevice {
    scale: Tensor,
    tracker: Tensor,
    /// Steps skipped since [`LossScaler::to_device`].
    overflows: Tensor,
}

impl OnDevice {
    /// `1 / scale` in float32, rounded from float64 as `GradScaler` does.
    fn inverse(&self) -> Result<Tensor> {
        Ok(self.scale.to_dtype(DType::F64)?.recip()?.to_dtype(DType::F32)?)
    }
}

/// A dynamic loss scaler (see the module header).
#[derive(Debug, Clone)]
pub struct LossScaler {
    state: ScalerState,
    device: Option<OnDevice>,
}

impl LossScaler {
    /// A scaler at `settings.init_scale`, on the host.
    pub fn new(settings: ScalerSettings) -> Self {
        Self {
            state: ScalerState { settings, scale: settings.init_scale, growth_tracker: 0, overflows: 0 },
            device: None,
        }
    }

    /// A scaler resumed from a checkpoint's state, on the host.
    pub fn from_state(state: ScalerState) -> Self {
        Self { state, device: None }
    }

    /// Keeps the scale on `device` from now on (no read per step). A CPU device runs the same tensor arithmetic.
    pub fn to_device(&mut self, device: &Device) -> Result<()> {
        let s = self.state()?;
        self.state = s;
        self.device = Some(OnDevice {
            scale: Tensor::new(s.scale, device)?,
            tracker: Tensor::new(s.growth_tracker as f32, device)?,
            overflows: Tensor::new(0f32, device)?,
        });
        Ok(())
    }

    /// The scale as a float32 scalar on the device, where it lives there.
    pub(crate) fn scale_tensor(&self) -> Option<&Tensor> {
        self.device.as_ref().map(|d| &d.scale)
    }

    /// Whether the scale lives on the device.
    pub fn on_device(&self) -> bool {
        self.device.is_some()
    }

    /// The loss to run the backward pass from: `loss · scale`.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        Ok(match &self.device {
            None => loss.affine(self.state.scale as f64, 0.0)?,
            Some(d) => loss.broadcast_mul(&d.scale.to_dtype(loss.dtype())?)?,
        })
    }

    /// Multiplies the gradients by the reciprocal of the scale, in float32 as `GradScaler.unscale_`.
    pub fn unscale(&self, grads: &mut [Option<Tensor>]) -> Result<()> {
        match &self.device {
            None => {
                let inv = (1.0f64 / self.state.scale as f64) as f32;
                for g in grads.iter_mut().flatten() {
                    *g = g.affine(inv as f64, 0.0)?;
                }
            }
            Some(d) => {
                let inv = d.inverse()?;
                for g in grads.iter_mut().flatten() {
                    *g = g.broadcast_mul(&inv.to_dtype(g.dtype())?)?;
                }
            }
        }
        Ok(())
    }

    /// The reciprocal of the scale as a float32 scalar on the device, where the scale lives there (the factor
    /// [`LossScaler::unscale`] multiplies by).
    pub(crate) fn inverse_tensor(&self) -> Result<Option<Tensor>> {
        self.device.as_ref().map(OnDevice::inverse).transpose()
    }

    /// `GradScaler.update` on the host, after a step whose gradients were finite or not.
    pub fn update(&mut self, found_inf: bool) {
        let s = &mut self.state;
        if found_inf {
            s.scale *= s.settings.backoff_factor;
            s.growth_tracker = 0;
            s.overflows += 1;
            return;
        }
        let successful = s.growth_tracker + 1;
        if successful >= s.settings.growth_interval {
            let grown = s.scale * s.settings.growth_factor;
            if grown.is_finite() {
                s.scale = grown;
            }
            s.growth_tracker = 0;
        } else {
            s.growth_tracker = successful;
        }
    }

    /// [`LossScaler::update`] on the device, from the step's mask `ok` (a scalar, 1 where the gradients were
    /// finite): the same arithmetic as tensor ops, nothing read.
    pub fn update_masked(&mut self, ok: &Tensor) -> Result<()> {
        let settings = self.state.settings;
        let Some(d) = self.device.as_mut() else {
            return Err(super::error::OptimError::BadInput("update_masked on a host scaler".into()));
        };
        let ok = ok.to_dtype(DType::F32)?;
        let bad = ok.affine(-1.0, 1.0)?;
        // successful = (tracker + 1) on a good step, 0 after a bad one; a growth where it reaches the interval.
        let successful = (d.tracker.affine(1.0, 1.0)? * &ok)?;
        let grow = successful.ge(settings.growth_interval as f64)?.to_dtype(DType::F32)?;
        let grown = d.scale.affine(settings.growth_factor as f64, 0.0)?;
        #[allow(clippy::eq_op)] // x − x is 0 exactly when x is finite.
        let grown_finite = (&grown - &grown)?.eq(0.0)?;
        let grown = grown_finite.where_cond(&grown, &d.scale)?;
        let kept = (&d.scale * grow.affine(-1.0, 1.0)?)?;
        let good = (kept + (grown * &grow)?)?;
        let backed = d.scale.affine(settings.backoff_factor as f64, 0.0)?;
        d.scale = ((good * &ok)? + (backed * &bad)?)?;
        d.tracker = (successful * grow.affine(-1.0, 1.0)?)?;
        d.overflows = (&d.overflows + bad)?;
        Ok(())
    }

    /// The current state (one read of the device scalars when the scale lives there).
    pub fn state(&self) -> Result<ScalerState> {
        let Some(d) = &self.device else { return Ok(self.state) };
        sluice_core::syncs::record_if(!d.scale.device().is_cpu(), sluice_core::syncs::Site::NonFiniteCheck);
        Ok(ScalerState {
            settings: self.state.settings,
            scale: d.scale.to_scalar::<f32>()?,
            growth_tracker: d.tracker.to_scalar::<f32>()? as u32,
            overflows: self.state.overflows + d.overflows.to_scalar::<f32>()? as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The host update and the device update agree on a long sequence with growth (interval 3), backoff, and a
    /// growth to infinity that is refused.
    #[test]
    fn host_and_device_updates_agree() {
        let settings = ScalerSettings { init_scale: 2f32.powi(120), growth_interval: 3, ..Default::default() };
        let mut host = LossScaler::new(settings);
        let mut dev = LossScaler::new(settings);
        dev.to_device(&Device::Cpu).unwrap();
        let pattern = [false, false, false, true, false, false, false, false, false, false, false, true, true];
        for (k, &inf) in pattern.iter().cycle().take(60).enumerate() {
            host.update(inf);
            dev.update_masked(&Tensor::new(if inf { 0f32 } else { 1.0 }, &Device::Cpu).unwrap()).unwrap();
            assert_eq!(dev.state().unwrap(), host.state().unwrap(), "after update {k}");
        }
        assert!(host.state().unwrap().scale.is_finite());
        let bad = pattern.iter().cycle().take(60).filter(|b| **b).count() as u64;
        assert_eq!(host.state().unwrap().overflows, bad);
    }

    #[test]
    fn scaling_and_unscaling_are_exact() {
        let mut s = LossScaler::new(ScalerSettings::default());
        let g = Tensor::new(&[1.5e-7f32, -3.25, 0.0], &Device::Cpu).unwrap();
        for device in [false, true] {
            if device {
                s.to_device(&Device::Cpu).unwrap();
            }
            let loss = Tensor::new(0.3f32, &Device::Cpu).unwrap();
            assert_eq!(s.scale_loss(&loss).unwrap().to_scalar::<f32>().unwrap(), 0.3f32 * 65536.0);
            let mut grads = vec![Some(g.affine(65536.0, 0.0).unwrap()), None];
            s.unscale(&mut grads).unwrap();
            assert_eq!(grads[0].as_ref().unwrap().to_vec1::<f32>().unwrap(), g.to_vec1::<f32>().unwrap());
        }
    }
}
