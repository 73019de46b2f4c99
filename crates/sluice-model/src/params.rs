//! A small builder that creates (or fetches) named `Var`s in a `VarMap` under Ultralytics key names.

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::{Init, VarMap};
use rand::RngCore;
use sluice_core::sample_rng;

use crate::layers::Autocast;

/// FNV-1a of a parameter name: the stream id of its seeded initialisation.
fn name_key(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Creates variables named `<prefix>.<name>` in a [`VarMap`].
#[derive(Clone)]
pub(crate) struct Params<'a> {
    map: &'a VarMap,
    prefix: String,
    dtype: DType,
    device: Device,
    seed: Option<u64>,
    autocast: Autocast,
}

impl std::fmt::Debug for Params<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params").field("prefix", &self.prefix).finish()
    }
}

impl<'a> Params<'a> {
    /// Variables drawn from the device's generator (`seed` None) or from per-name streams of `seed`.
    pub(crate) fn new(map: &'a VarMap, dtype: DType, device: &Device, seed: Option<u64>) -> Self {
        Self { map, prefix: String::new(), dtype, device: device.clone(), seed, autocast: Autocast::default() }
    }

    /// The model's mixed-precision switch, shared by every module built from this builder.
    pub(crate) fn autocast(&self) -> &Autocast {
        &self.autocast
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
        let v = match (self.seed, init) {
            (Some(seed), Init::Uniform { lo, up }) => {
                let mut rng = sample_rng(seed, name_key(&key), 0);
                let values: Vec<f64> = (0..shape.elem_count())
                    .map(|_| lo + (up - lo) * ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64))
                    .collect();
                Var::from_tensor(&Tensor::from_vec(values, shape, &self.device)?.to_dtype(self.dtype)?)?
            }
            _ => init.var(shape, self.dtype, &self.device)?,
        };
        data.insert(key, v.clone());
        Ok(v)
    }

    /// PyTorch's default `Conv2d` init: U(−1/√fan_in, 1/√fan_in).
    pub(crate) fn conv_init(fan_in: usize) -> Init {
        let bound = 1.0 / (fan_in as f64).sqrt();
        Init::Uniform { lo: -bound, up: bound }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scale, YoloConfig, YoloV8};

    fn weight(m: &YoloV8) -> Vec<f32> {
        m.var("model.2.m.0.cv1.conv.weight").unwrap().as_tensor().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn seeded_models_repeat_and_follow_the_pytorch_bounds() {
        let cfg = YoloConfig::new(Scale::N, 3);
        let a = YoloV8::new_seeded(cfg, DType::F32, &Device::Cpu, 7).unwrap();
        let b = YoloV8::new_seeded(cfg, DType::F32, &Device::Cpu, 7).unwrap();
        let c = YoloV8::new_seeded(cfg, DType::F32, &Device::Cpu, 8).unwrap();
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
