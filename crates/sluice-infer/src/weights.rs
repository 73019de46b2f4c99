//! A model from a weights file, whichever kind the user has: a `sluice train` checkpoint (its EMA weights and the
//! architecture it trained), an Ultralytics `.pt` checkpoint (its own architecture), or plain safetensors with
//! Ultralytics' key names.

use std::path::Path;

use serde::Deserialize;
use sluice_model::candle_core::{DType, Device};
use sluice_model::{LoadMode, Yolo};

use crate::error::{InferError, Result};

/// The part of a training checkpoint's stored run configuration that inference and `sluice val` need.
#[derive(Debug, Deserialize)]
pub(crate) struct StoredRun {
    /// The model name.
    pub(crate) model: String,
    /// The dataset YAML.
    #[serde(default)]
    pub(crate) data: Option<std::path::PathBuf>,
    /// The training image size.
    #[serde(default)]
    pub(crate) imgsz: Option<u32>,
    /// The training batch (`-1`: AutoBatch).
    #[serde(default)]
    pub(crate) batch: Option<i64>,
    /// Where the run kept its caches.
    #[serde(default)]
    pub(crate) cache_dir: Option<std::path::PathBuf>,
}

/// The run configuration stored in a `sluice train` checkpoint: `None` for any other file, `Some(Err)` for a
/// checkpoint whose stored configuration is unreadable.
pub(crate) fn stored_run(weights: &Path) -> Option<Result<StoredRun>> {
    let user = sluice_optim::read_user_metadata(weights).ok()?;
    let bad = |reason: String| InferError::Weights { path: weights.to_path_buf(), reason };
    Some(match user.get("config").and_then(serde_json::Value::as_str) {
        Some(config) => {
            serde_yaml_ng::from_str::<StoredRun>(config).map_err(|e| bad(format!("the stored run configuration: {e}")))
        }
        None => Err(bad("a training checkpoint without its run configuration".into())),
    })
}

/// The model name a `sluice train` checkpoint was trained with (the `model` key of the run configuration that the
/// trainer stores in the checkpoint's metadata, as `config`): `None` for any other file, `Some(Err)` for a
/// checkpoint whose stored configuration does not say.
pub fn checkpoint_model(weights: &Path) -> Option<Result<String>> {
    stored_run(weights).map(|run| run.map(|r| r.model))
}

/// A model for validation or prediction from `weights`: a training checkpoint (its EMA weights, architecture from
/// the stored configuration unless `model` is given), an Ultralytics `.pt` checkpoint (its own architecture unless
/// `model` is given) or a plain weights file (Ultralytics key names; `model` required). `nc` is the dataset's class
/// count.
pub fn load_model(weights: &Path, model: Option<&str>, nc: usize, device: &Device) -> Result<Yolo> {
    let bad = |reason: String| InferError::Weights { path: weights.to_path_buf(), reason };
    let model_err = |source| InferError::Model { context: format!("loading {}", weights.display()), source };
    if model.is_none() && sluice_model::is_pt(weights) {
        // An Ultralytics checkpoint says its own architecture; its class count must be the dataset's.
        let m = Yolo::from_pt(weights, DType::F32, device).map_err(|e| model_err(Box::new(e)))?.0;
        if m.config().nc != nc {
            return Err(bad(format!("a model for {} classes, the dataset has {nc}", m.config().nc)));
        }
        return Ok(m);
    }
    let stored = checkpoint_model(weights).transpose()?;
    let checkpoint = stored.is_some();
    let name = match (model, stored) {
        (Some(m), _) => m.to_string(),
        (None, Some(m)) => m,
        (None, None) => return Err(bad("a plain weights file; say which architecture with --model".into())),
    };
    let arch = sluice_model::parse_model(&name).map_err(|e| {
        bad(format!(
            "model '{name}': expected yolov8n|s|m|l|x[.yaml], yolo11n|s|m|l|x[.yaml] or a model YAML with \
             multipliers ({e})"
        ))
    })?;
    let prefix = if checkpoint { "ema." } else { "" };
    let load = || -> sluice_model::Result<Yolo> {
        let config = arch.config(nc).fit_to_weights(weights, prefix)?;
        let mut m = Yolo::new(config, DType::F32, device)?;
        if checkpoint {
            m.load_weights_prefixed(weights, prefix, LoadMode::Strict)?;
        } else {
            m.load_weights(weights, LoadMode::Strict)?;
        }
        Ok(m)
    };
    load().map_err(|e| InferError::Model {
        context: format!("loading {} for {nc} classes", weights.display()),
        source: Box::new(e),
    })
}

#[cfg(test)]
mod tests {
    use sluice_model::{Scale, YoloConfig};

    use super::*;

    #[test]
    fn a_plain_weights_file_needs_its_architecture() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plain.safetensors");
        let saved = Yolo::new(YoloConfig::new(Scale::N, 3), DType::F32, &Device::Cpu).expect("model");
        saved.save(&path).expect("save");
        assert!(checkpoint_model(&path).is_none());
        let e = load_model(&path, None, 3, &Device::Cpu).expect_err("no architecture").to_string();
        assert!(e.contains("plain.safetensors") && e.contains("--model"), "{e}");
        let m = load_model(&path, Some("yolov8n"), 3, &Device::Cpu).expect("load");
        assert_eq!(m.config().nc, 3);
        let e = load_model(&path, Some("yolov9z"), 3, &Device::Cpu).expect_err("unknown model").to_string();
        assert!(e.contains("model 'yolov9z'"), "{e}");
    }
}
