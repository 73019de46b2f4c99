//! Inference: a model from whichever weights file the user has ([`weights`]: a `sluice train` checkpoint, an
//! Ultralytics `.pt`, plain safetensors), the device a name asks for ([`device`]), and prediction on image files
//! as Ultralytics' `yolo predict` does it ([`predict`]: sources, decode ahead of the model, letterbox, the fused
//! forward, NMS or the end-to-end head, boxes in original pixels, COCO results). The trainer validates through the
//! same loading; `sluice predict`, `sluice val` and `sluice export` start here.
#![warn(missing_docs)]

pub mod device;
pub mod error;
pub mod predict;
pub mod weights;

pub use device::{device_list, device_of, rank_device};
pub use error::{InferError, Result};
pub use predict::{PredictOptions, Prediction, Predictor};
pub use weights::{checkpoint_model, load_model};
