//! `sluice val`: a weights file validated on a split of a dataset, with the settings of the run that trained it
//! unless the request says otherwise.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_dataset::{IndexOptions, Split};
use sluice_loader::split::{RemoteConfig, load_split_with};
use sluice_loader::{DecodedSource, LoaderConfig, ValLoader, default_workers};
use sluice_model::DetectionLoss;
use sluice_model::candle_core::DType;
use sluice_transfer::DeviceTransfer;

use crate::error::{InferError, Result, ctx};
use crate::validate::{ValOptions, ValResult, validate};
use crate::weights::stored_run;
use crate::{DevicePaths, device_of, load_model};

/// What `sluice val` asks for. `None` takes the setting a training checkpoint was trained with (so the pass
/// repeats the trainer's own validation), else the default given with each field.
#[derive(Debug, Clone, Copy)]
pub struct ValRequest<'a> {
    /// A training checkpoint or a plain weights file.
    pub weights: &'a Path,
    /// The architecture; a checkpoint's own when `None` (required for a plain weights file).
    pub model: Option<&'a str>,
    /// The dataset YAML; a checkpoint's training data when `None` (required for a plain weights file).
    pub data: Option<&'a Path>,
    /// The split to validate.
    pub split: Split,
    /// The image size; a checkpoint's `imgsz` when `None`, else 640.
    pub imgsz: Option<u32>,
    /// Images per batch; a checkpoint's validation batch (twice its training batch, as the trainer validates) when
    /// `None`, else 32. Rect batches pad each batch to its own canvas, so the batch size changes the metrics a little.
    pub batch: Option<usize>,
    /// Loader workers (0: about 80% of the cores).
    pub workers: usize,
    /// Fail on the first image that cannot be read or decoded instead of skipping and counting it.
    pub strict: bool,
    /// Validate an end-to-end model (YOLO26) on its one-to-one head's top-k output without NMS (Ultralytics'
    /// `nms=False`).
    pub end2end: bool,
    /// The device ([`device_of`]: `cpu`, `cuda:N`).
    pub device: &'a str,
    /// The opt-in device paths: `device_nms` ([`ValOptions::device_nms`]) and `gpu_timer`
    /// ([`ValOptions::gpu_timer`]) apply to validation.
    pub paths: DevicePaths,
    /// Ultralytics' `half` ([`ValOptions::half`]), on any device (`sluice val` asks for it on CUDA devices only,
    /// as Ultralytics).
    pub half: bool,
    /// Object-store client settings for a dataset whose split is a URL.
    pub store_settings: &'a [(String, String)],
}

/// The settings a validation ran with, after [`ValRequest`]'s defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValSettings {
    /// The dataset YAML.
    pub data: PathBuf,
    /// The image size.
    pub imgsz: u32,
    /// Images per batch.
    pub batch: usize,
    /// Whether the model ran in half precision.
    pub half: bool,
}

/// Validates a weights file on a split of a dataset (`sluice val`); returns the pass, the class names and the
/// settings it used.
pub fn validate_weights(req: &ValRequest<'_>) -> Result<(ValResult, Vec<String>, ValSettings)> {
    let trained = stored_run(req.weights).transpose()?;
    let data = match (req.data, trained.as_ref().and_then(|t| t.data.clone())) {
        (Some(d), _) => d.to_path_buf(),
        (None, Some(d)) => d,
        (None, None) => {
            return Err(InferError::Msg(format!(
                "{}: a plain weights file names no dataset; say which with --data",
                req.weights.display()
            )));
        }
    };
    let imgsz = req.imgsz.or(trained.as_ref().and_then(|t| t.imgsz)).unwrap_or(640);
    // A training batch of -1 (AutoBatch) says nothing about the validation batch.
    let trained_batch =
        trained.as_ref().and_then(|t| t.batch).and_then(|b| usize::try_from(b).ok()).filter(|&b| b >= 1).map(|b| b * 2);
    let batch = req.batch.or(trained_batch).unwrap_or(32);
    let opts = IndexOptions { cache: true, find_orphans: false };
    let cache_dir = trained.as_ref().and_then(|t| t.cache_dir.clone());
    let remote = RemoteConfig { cache_dir, settings: req.store_settings.to_vec() };
    let loaded = load_split_with(&data, req.split, &opts, false, &remote).map_err(ctx(format!(
        "dataset {}, {} split",
        data.display(),
        req.split.as_str()
    )))?;
    let left_out = loaded.left_out();
    if let (true, Some(line)) = (req.strict, left_out.line(&format!("{} split", req.split.as_str()))) {
        return Err(InferError::Msg(format!("strict: {line}")));
    }
    let device = device_of(req.device)?;
    let half = req.half;
    let nc = loaded.config.nc();
    let m = load_model(req.weights, req.model, nc, &device)?;
    let workers = if req.workers == 0 { default_workers() } else { req.workers };
    let lcfg = LoaderConfig { workers, strict: req.strict, ..LoaderConfig::new(imgsz, batch, 0) };
    let source = DecodedSource::open(&loaded.source, loaded.indexed.index, imgsz, false, 0)?;
    let val = ValLoader::new(Arc::new(source), lcfg).with_left_out(left_out);
    let mut loss = DetectionLoss::new(nc);
    loss.assigner.fused_ciou = device.is_cuda() && req.paths.fused_ciou;
    loss.fused_bce = device.is_cuda() && req.paths.fused_bce;
    let opts = ValOptions { end2end: req.end2end, half, ..ValOptions::default() }.with_paths(&req.paths, false);
    let v = validate(&m, &val, &loss, &DeviceTransfer::new(&device, DType::F32)?, opts)?;
    Ok((v, loaded.config.names, ValSettings { data, imgsz, batch, half }))
}
