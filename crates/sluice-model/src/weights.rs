//! Weights I/O in safetensors with Ultralytics' state-dict key names (`model.0.conv.weight`, …), so that a
//! converted Ultralytics checkpoint loads here and a saved model loads back in Ultralytics
//! (`scripts/convert_weights.py` converts between `.pt` and `.safetensors`).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use crate::config::REG_MAX;
use crate::error::{ModelError, Result};
use crate::model::{Yolo, dfl_key};

/// How [`Yolo::load_weights`] treats the keys of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// Every parameter and running statistic of the model must be in the file, and nothing else
    /// (`num_batches_tracked` and the fixed DFL projection are accepted and checked).
    Strict,
    /// Only the keys present in the file are overwritten (e.g. a BN-calibration overlay); unknown keys are
    /// still an error.
    Overlay,
}

/// The prefix of the EMA weights in a Sluice training checkpoint (`sluice-train`'s `last`/`best`).
const TRAINING_EMA_PREFIX: &str = "ema.";

/// What [`Yolo::transfer_weights`] copied: Ultralytics' "Transferred 349/355 items from pretrained weights".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transferred {
    /// Tensors copied from the file.
    pub loaded: usize,
    /// Tensors of this model's state dict (parameters, running statistics, `num_batches_tracked`, DFL).
    pub total: usize,
    /// The file's tensors left out (no such name here, or another shape), sorted.
    pub skipped: Vec<String>,
}

impl Yolo {
    /// A model of this configuration with the weights of a safetensors file (Ultralytics key names) or an Ultralytics
    /// `.pt` checkpoint.
    pub fn load(
        cfg: crate::config::YoloConfig,
        path: impl AsRef<Path>,
        dtype: DType,
        device: &candle_core::Device,
    ) -> Result<Self> {
        let cfg = cfg.fit_to_weights(path.as_ref(), "")?;
        let mut m = Self::new(cfg, dtype, device)?;
        m.load_weights(path, LoadMode::Strict)?;
        Ok(m)
    }

    /// Overwrites the model's parameters with the tensors of a safetensors file, or of an Ultralytics `.pt`
    /// checkpoint (by its extension, see [`crate::pt`]; its class count must be this model's).
    pub fn load_weights(&mut self, path: impl AsRef<Path>, mode: LoadMode) -> Result<()> {
        if self.is_fused() {
            return Err(ModelError::Fused("loading weights"));
        }
        let path = path.as_ref();
        if crate::pt::is_pt(path) {
            return self.load_pt(path, mode);
        }
        let tensors = candle_core::safetensors::load(path, self.device())
            .map_err(|source| ModelError::WeightsIo { file: path.to_path_buf(), source })?;
        self.load_state_dict(&tensors, mode, path)
    }

    /// Overwrites the model's parameters with the tensors of a safetensors file whose names start with `prefix`
    /// (the prefix is stripped; every other tensor of the file is ignored). This reads one part of a file that
    /// holds several models, e.g. `ema.` of a training checkpoint of `sluice-train`.
    pub fn load_weights_prefixed(&mut self, path: impl AsRef<Path>, prefix: &str, mode: LoadMode) -> Result<()> {
        if self.is_fused() {
            return Err(ModelError::Fused("loading weights"));
        }
        let path = path.as_ref();
        let io = |source| ModelError::WeightsIo { file: path.to_path_buf(), source };
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
        let st = candle_core::safetensors::SliceSafetensors::new(&bytes).map_err(io)?;
        let mut tensors = HashMap::new();
        for (name, _) in st.tensors() {
            if let Some(key) = name.strip_prefix(prefix) {
                tensors.insert(key.to_string(), st.load(&name, self.device()).map_err(io)?);
            }
        }
        if tensors.is_empty() {
            return Err(ModelError::BadInput(format!("{}: no tensor under the prefix `{prefix}`", path.display())));
        }
        self.load_state_dict(&tensors, mode, path)
    }

    /// Starts this model from pretrained weights as Ultralytics' `DetectionModel.load` does for training
    /// (`intersect_dicts`): every tensor of the file whose name and shape this model has is copied, the rest is left
    /// as initialised (a head for another class count, another model size). The file is a safetensors file
    /// (Ultralytics key names), an Ultralytics `.pt` checkpoint, or a Sluice training checkpoint (its `ema.` weights,
    /// which Ultralytics' trainer would also take from its own checkpoint). An error if nothing matches.
    pub fn transfer_weights(&mut self, path: impl AsRef<Path>) -> Result<Transferred> {
        if self.is_fused() {
            return Err(ModelError::Fused("loading weights"));
        }
        let path = path.as_ref();
        let tensors = if crate::pt::is_pt(path) {
            crate::pt::read_pt(path)?.tensors
        } else {
            let io = |source| ModelError::WeightsIo { file: path.to_path_buf(), source };
            let bytes = std::fs::read(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
            let st = candle_core::safetensors::SliceSafetensors::new(&bytes).map_err(io)?;
            let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
            let checkpoint = names.iter().any(|n| n.starts_with(TRAINING_EMA_PREFIX));
            let mut tensors = HashMap::new();
            for name in names {
                let key = if checkpoint {
                    match name.strip_prefix(TRAINING_EMA_PREFIX) {
                        Some(k) => k.to_string(),
                        None => continue,
                    }
                } else {
                    name.clone()
                };
                tensors.insert(key, st.load(&name, &candle_core::Device::Cpu).map_err(io)?);
            }
            tensors
        };
        let own = self.state_dict()?;
        let mut matched = HashMap::new();
        let mut skipped = Vec::new();
        for (key, t) in tensors {
            match own.get(&key) {
                Some(o) if o.dims() == t.dims() => {
                    matched.insert(key, t);
                }
                _ => skipped.push(key),
            }
        }
        skipped.sort();
        if matched.is_empty() {
            return Err(ModelError::BadInput(format!(
                "{}: none of its {} tensors has a name and shape of this {} model",
                path.display(),
                skipped.len(),
                self.config().name()
            )));
        }
        let transferred = Transferred { loaded: matched.len(), total: own.len(), skipped };
        self.load_state_dict(&matched, LoadMode::Overlay, path)?;
        Ok(transferred)
    }

    /// Overwrites the model's parameters with tensors by Ultralytics name (the contents of a weights file);
    /// `origin` names where they came from in errors. Every key and shape is checked before anything changes.
    pub fn load_state_dict(&mut self, tensors: &HashMap<String, Tensor>, mode: LoadMode, origin: &Path) -> Result<()> {
        if self.is_fused() {
            return Err(ModelError::Fused("loading weights"));
        }
        let file = origin.to_path_buf();
        // Check every key and shape before touching the model, so a bad file leaves it unchanged.
        let vars: HashMap<String, candle_core::Var> = {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let data = self.varmap().data().lock().unwrap();
            data.clone()
        };
        let mut keys: Vec<&String> = tensors.keys().collect();
        keys.sort();
        for key in &keys {
            let t = &tensors[*key];
            if let Some(v) = vars.get(*key) {
                if v.dims() != t.dims() {
                    return Err(ModelError::ShapeMismatch {
                        file,
                        key: (*key).clone(),
                        expected: v.dims().to_vec(),
                        got: t.dims().to_vec(),
                    });
                }
            } else if let Some(prefix) = key.strip_suffix(".num_batches_tracked") {
                if !self.num_batches_tracked.contains_key(prefix) {
                    return Err(ModelError::UnexpectedKey { file, key: (*key).clone() });
                }
            } else if **key == dfl_key(self.config().family) {
                check_dfl(&file, key, t)?;
            } else {
                return Err(ModelError::UnexpectedKey { file, key: (*key).clone() });
            }
        }
        if mode == LoadMode::Strict {
            let mut names: Vec<&String> = vars.keys().collect();
            names.sort();
            if let Some(missing) = names.into_iter().find(|k| !tensors.contains_key(*k)) {
                return Err(ModelError::MissingKey { file, key: missing.clone() });
            }
        }
        for key in keys {
            let t = &tensors[key];
            if let Some(v) = vars.get(key) {
                v.set(&t.to_dtype(self.dtype())?.to_device(self.device())?)?;
            } else if let Some(prefix) = key.strip_suffix(".num_batches_tracked") {
                let n = t.to_dtype(DType::I64)?.flatten_all()?.to_vec1::<i64>()?.first().copied().unwrap_or(0);
                self.num_batches_tracked.insert(prefix.to_string(), n);
            }
        }
        Ok(())
    }

    /// Every tensor of Ultralytics' `state_dict` for this model: parameters and running statistics in float32,
    /// `num_batches_tracked` as int64 scalars and the fixed DFL projection.
    pub fn state_dict(&self) -> Result<HashMap<String, Tensor>> {
        if self.is_fused() {
            return Err(ModelError::Fused("exporting weights"));
        }
        let cpu = candle_core::Device::Cpu;
        let mut out = HashMap::new();
        {
            #[allow(clippy::unwrap_used)]
            let data = self.varmap().data().lock().unwrap();
            for (k, v) in data.iter() {
                out.insert(k.clone(), v.as_tensor().detach().to_dtype(DType::F32)?.to_device(&cpu)?);
            }
        }
        for (prefix, n) in &self.num_batches_tracked {
            out.insert(format!("{prefix}.num_batches_tracked"), Tensor::new(*n, &cpu)?);
        }
        if self.config().family.reg_max() > 1 {
            let proj = Tensor::arange(0f32, REG_MAX as f32, &cpu)?.reshape((1, REG_MAX, 1, 1))?;
            out.insert(dfl_key(self.config().family), proj);
        }
        Ok(out)
    }

    /// Writes [`Yolo::state_dict`] as a safetensors file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let sd = self.state_dict()?;
        candle_core::safetensors::save(&sd, path)
            .map_err(|source| ModelError::WeightsIo { file: path.to_path_buf(), source })
    }
}

/// The class branch's hidden width in a state dict: the input channels of the first level's last class convolution
/// (`<prefix>model.<head>.cv3.0.2.weight`, shape `(nc, width, 1, 1)`, in every family), whatever the prefix.
pub fn cls_width_of<'a>(shapes: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Option<usize> {
    shapes.into_iter().find(|(k, s)| k.ends_with(".cv3.0.2.weight") && s.len() == 4).map(|(_, s)| s[1])
}

/// The input channels of the head's box branches, level by level (`….cv2.<i>.0.conv.weight`), when the state dict
/// has all three.
pub fn head_inputs_of<'a>(shapes: impl IntoIterator<Item = (&'a str, &'a [usize])>) -> Option<[usize; 3]> {
    let mut out = [0usize; 3];
    for (k, s) in shapes {
        for (i, o) in out.iter_mut().enumerate() {
            if k.ends_with(&format!(".cv2.{i}.0.conv.weight")) && !k.contains("one2one") && s.len() == 4 {
                *o = s[1];
            }
        }
    }
    out.iter().all(|&c| c > 0).then_some(out)
}

/// The names and shapes of a weights file's tensors under `prefix` (stripped): a safetensors file, a training
/// checkpoint (with its `ema.` or `model.` prefix) or an Ultralytics `.pt`.
pub fn file_shapes(path: &Path, prefix: &str) -> Result<Vec<(String, Vec<usize>)>> {
    if crate::pt::is_pt(path) {
        let ckpt = crate::pt::read_pt(path)?;
        return Ok(ckpt.tensors.iter().map(|(k, t)| (k.clone(), t.dims().to_vec())).collect());
    }
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io { file: path.to_path_buf(), source })?;
    let st = candle_core::safetensors::SliceSafetensors::new(&bytes)
        .map_err(|source| ModelError::WeightsIo { file: path.to_path_buf(), source })?;
    Ok(st
        .tensors()
        .into_iter()
        .filter_map(|(name, view)| name.strip_prefix(prefix).map(|k| (k.to_string(), view.shape().to_vec())))
        .collect())
}

impl crate::config::YoloConfig {
    /// The configuration a fine-tuning run from the weights in `path` builds, as Ultralytics 8.4's
    /// `DetectionModel.load` rebuilds it: when the file's head has this model's input widths, the class branch keeps
    /// the file's hidden width (its hidden layers transfer, the last convolution is new for another class count);
    /// otherwise this configuration as it is.
    pub fn for_transfer(self, path: &Path) -> Result<Self> {
        let shapes = file_shapes(path, "")?;
        let view = || shapes.iter().map(|(k, s)| (k.as_str(), s.as_slice()));
        Ok(match (head_inputs_of(view()), cls_width_of(view())) {
            (Some(inputs), Some(w)) if inputs == self.head_channels() => self.with_cls_width(w),
            _ => self,
        })
    }

    /// This configuration with the class-branch width of the weights in `path` under `prefix`, so that a model
    /// Ultralytics fine-tuned from weights for another class count (whose branch keeps the source's width) loads.
    pub fn fit_to_weights(self, path: &Path, prefix: &str) -> Result<Self> {
        let shapes = file_shapes(path, prefix)?;
        Ok(match cls_width_of(shapes.iter().map(|(k, s)| (k.as_str(), s.as_slice()))) {
            Some(w) => self.with_cls_width(w),
            None => self,
        })
    }
}

/// The DFL projection must be 0, 1, …, 15 shaped (1, 16, 1, 1).
fn check_dfl(file: &Path, key: &str, t: &Tensor) -> Result<()> {
    let bad = |reason: String| ModelError::BadWeight { file: file.to_path_buf(), key: key.into(), reason };
    if t.dims() != [1, REG_MAX, 1, 1] {
        return Err(bad(format!("shape {:?}, expected [1, {REG_MAX}, 1, 1]", t.dims())));
    }
    let v = t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    if v.iter().enumerate().any(|(i, &x)| x != i as f32) {
        return Err(bad(format!("values {v:?}, expected 0..{}", REG_MAX - 1)));
    }
    Ok(())
}
