//! A small builder that creates (or fetches) named `Var`s in a `VarMap` under Ultralytics key names.

use std::sync::{Arc, Mutex};

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::{Init, VarMap};
use rand_mt::Mt;

use crate::layers::Autocast;
use crate::stats::StatsSink;

/// PyTorch's CPU generator after `torch.manual_seed(seed)` (MT19937 seeded with the seed's low 32 bits), drawing
/// as `Tensor.uniform_` does: 24 random bits of each 32-bit output, `x · 2⁻²⁴ · (to − from) + from` in float32 with
/// one rounding. Values come in the order PyTorch creates the modules, so a model built in that order holds the
/// weights Ultralytics' `DetectionModel` starts from after `init_seeds(seed)`.
pub(crate) struct TorchRng(Mt);

impl TorchRng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(Mt::new(seed as u32))
    }

    /// Advances past `n` draws without keeping them.
    pub(crate) fn skip(&mut self, n: usize) {
        for _ in 0..n {
            self.0.next_u32();
        }
    }

    /// `n` values of `uniform_(lo, up)`.
    pub(crate) fn uniform(&mut self, lo: f64, up: f64, n: usize) -> Vec<f32> {
        let (from, to) = (lo as f32, up as f32);
        (0..n)
            .map(|_| ((self.0.next_u32() & 0x00ff_ffff) as f32 * (1.0 / 16_777_216.0)).mul_add(to - from, from))
            .collect()
    }
}

/// A new buffer holding the values of `vars` back to back, and one variable per input over its range of the buffer
/// (same shape and values): one op over the buffer then reaches every part.
pub(crate) fn pack(vars: &[&Var]) -> Result<(Var, Vec<Var>)> {
    let flat = vars.iter().map(|v| v.as_tensor().flatten_all()).collect::<Result<Vec<_>>>()?;
    let buffer = Var::from_tensor(&Tensor::cat(&flat, 0)?)?;
    let mut parts = Vec::with_capacity(vars.len());
    let mut at = 0;
    for v in vars {
        let n = v.elem_count();
        parts.push(Var::sharing(&buffer.as_tensor().narrow(0, at, n)?.reshape(v.shape())?)?);
        at += n;
    }
    Ok((buffer, parts))
}

/// Creates variables named `<prefix>.<name>` in a [`VarMap`].
#[derive(Clone)]
pub(crate) struct Params<'a> {
    map: &'a VarMap,
    prefix: String,
    dtype: DType,
    device: Device,
    /// The seeded generator, shared by every builder of one model (`None`: candle's own random init).
    rng: Option<Arc<Mutex<TorchRng>>>,
    autocast: Autocast,
    stats: StatsSink,
}

impl std::fmt::Debug for Params<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params").field("prefix", &self.prefix).finish()
    }
}

impl<'a> Params<'a> {
    /// Variables drawn from the device's generator (`seed` None) or, in creation order, from PyTorch's generator
    /// seeded with `seed` ([`TorchRng`]).
    pub(crate) fn new(map: &'a VarMap, dtype: DType, device: &Device, seed: Option<u64>) -> Self {
        let rng = seed.map(|s| Arc::new(Mutex::new(TorchRng::new(s))));
        Self {
            map,
            prefix: String::new(),
            dtype,
            device: device.clone(),
            rng,
            autocast: Autocast::default(),
            stats: StatsSink::default(),
        }
    }

    /// The same builder without the seeded generator, for modules PyTorch copies rather than draws (YOLO26's
    /// one-to-one head is a deep copy of the one-to-many head); the caller copies their values.
    pub(crate) fn without_draws(&self) -> Self {
        Self { rng: None, ..self.clone() }
    }

    /// Advances the seeded generator past the `n` values PyTorch draws for a tensor that it overwrites afterwards
    /// (a head bias set by `bias_init`, the DFL's fixed weights); nothing without a seed.
    pub(crate) fn skip_draws(&self, n: usize) {
        if let Some(rng) = &self.rng {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked while building.
            rng.lock().unwrap().skip(n);
        }
    }

    /// The model's mixed-precision switch, shared by every module built from this builder.
    pub(crate) fn autocast(&self) -> &Autocast {
        &self.autocast
    }

    /// Where the model's BatchNorm layers report their batch statistics, shared by every module of the model.
    pub(crate) fn stats(&self) -> &StatsSink {
        &self.stats
    }

    /// This builder's name prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The builder for a sub-module.
    pub(crate) fn pp(&self, name: impl std::fmt::Display) -> Self {
        let prefix = if self.prefix.is_empty() { name.to_string() } else { format!("{}.{name}", self.prefix) };
        Self { prefix, ..self.clone() }
    }

    /// The variable `<prefix>.<name>`, created with `init` when it does not exist yet.
    pub(crate) fn var(&self, name: &str, shape: impl Into<Shape>, init: Init) -> Result<Var> {
        let shape = shape.into();
        let key = format!("{}.{name}", self.prefix);
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked while building.
        let mut data = self.map.data().lock().unwrap();
        if let Some(v) = data.get(&key) {
            if v.shape() != &shape {
                candle_core::bail!("variable {key}: shape {:?} already registered, asked {:?}", v.shape(), shape);
            }
            return Ok(v.clone());
        }
        let v = match (&self.rng, init) {
            (Some(rng), Init::Uniform { lo, up }) => {
                #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked while building.
                let values = rng.lock().unwrap().uniform(lo, up, shape.elem_count());
                Var::from_tensor(&Tensor::from_vec(values, shape, &self.device)?.to_dtype(self.dtype)?)?
            }
            _ => init.var(shape, self.dtype, &self.device)?,
        };
        data.insert(key, v.clone());
        Ok(v)
    }

    /// PyTorch's default `Conv2d` weight init, `kaiming_uniform_(a=√5)`: U(−b, b) with b = √3 · gain / √fan_in and
    /// gain = √(2 / (1 + 5)), computed in float64 as PyTorch does (so b rounds to the same float32), about 1/√fan_in.
    pub(crate) fn conv_init(fan_in: usize) -> Init {
        let gain = (2.0f64 / 6.0).sqrt();
        let bound = 3.0f64.sqrt() * (gain / (fan_in as f64).sqrt());
        Init::Uniform { lo: -bound, up: bound }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scale, Yolo, YoloConfig};

    fn weight(m: &Yolo) -> Vec<f32> {
        m.var("model.2.m.0.cv1.conv.weight").unwrap().as_tensor().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn seeded_models_repeat_and_follow_the_pytorch_bounds() {
        let cfg = YoloConfig::new(Scale::N, 3);
        let a = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 7).unwrap();
        let b = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 7).unwrap();
        let c = Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 8).unwrap();
        assert_eq!(weight(&a), weight(&b));
        assert_ne!(weight(&a), weight(&c));
        // 16 input channels x 3 x 3: U(-1/12, 1/12), mean near 0.
        let w = weight(&a);
        let bound = 1.0 / 12.0;
        assert!(w.iter().all(|v| v.abs() <= bound));
        let mean = w.iter().sum::<f32>() / w.len() as f32;
        assert!(mean.abs() < 0.01 && w.iter().any(|v| v.abs() > 0.07), "mean {mean}");
    }
}
