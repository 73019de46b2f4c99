//! Inference: a model from whichever weights file the user has ([`weights`]: a `sluice train` checkpoint, an
//! Ultralytics `.pt`, plain safetensors), the device a name asks for ([`device`]) and the opt-in device paths ([`device_paths`]), prediction on image files
//! as Ultralytics' `yolo predict` does it ([`predict`]: sources, decode ahead of the model, letterbox, the fused
//! forward, NMS or the end-to-end head, boxes in original pixels, COCO results), the validation pass that the
//! trainer runs every epoch ([`validate`](mod@validate), with the loss path of a step, [`loss_path`]) and
//! `sluice val`'s validation of a weights file ([`val`]), and the pass's figures ([`val_telemetry`]). `sluice predict`, `sluice val` and `sluice export` start here.
#![warn(missing_docs)]

pub mod device;
pub mod device_paths;
pub mod error;
pub mod loss_path;
pub mod predict;
pub mod val;
pub mod val_telemetry;
pub mod validate;
pub mod weights;

pub use device::{device_list, device_of, rank_device};
pub use device_paths::{CudnnSearch, DevicePaths, parse_device_paths};
pub use error::{InferError, Result};
pub use predict::{PredictOptions, Prediction, Predictor};
pub use val::{ValRequest, ValSettings, validate_weights};
pub use val_telemetry::ValTelemetry;
pub use validate::{Alone, FirstBatch, Ranks, ValOptions, ValResult, validate, validate_on};
pub use weights::{checkpoint_model, load_model};
