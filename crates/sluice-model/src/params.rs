//! A small builder that creates (or fetches) named `Var`s in a `VarMap` under Ultralytics key names.

use candle_core::{DType, Device, Result, Shape, Var};
use candle_nn::{Init, VarMap};

/// Creates variables named `<prefix>.<name>` in a [`VarMap`].
#[derive(Clone)]
pub(crate) struct Params<'a> {
    map: &'a VarMap,
    prefix: String,
    dtype: DType,
    device: Device,
}

impl std::fmt::Debug for Params<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Params").field("prefix", &self.prefix).finish()
    }
}

impl<'a> Params<'a> {
    pub(crate) fn new(map: &'a VarMap, dtype: DType, device: &Device) -> Self {
        Self { map, prefix: String::new(), dtype, device: device.clone() }
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
        let v = init.var(shape, self.dtype, &self.device)?;
        data.insert(key, v.clone());
        Ok(v)
    }

    /// PyTorch's default `Conv2d` init: U(−1/√fan_in, 1/√fan_in).
    pub(crate) fn conv_init(fan_in: usize) -> Init {
        let bound = 1.0 / (fan_in as f64).sqrt();
        Init::Uniform { lo: -bound, up: bound }
    }
}
