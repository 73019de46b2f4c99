//! YOLOv8 and YOLO11 detection in candle, matched to Ultralytics 8.4: the models at every scale (n, s, m, l, x) and
//! any class count, weights in safetensors with Ultralytics' key names, Conv+BN folding, and the
//! v8 detection loss with the task-aligned assigner.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use sluice_model::{Scale, YoloConfig, Yolo};
//! # fn main() -> sluice_model::Result<()> {
//! let model = Yolo::load(YoloConfig::new(Scale::N, 80), "yolov8n.safetensors", DType::F32, &Device::Cpu)?;
//! let x = Tensor::zeros((1, 3, 320, 320), DType::F32, &Device::Cpu)?;
//! let out = model.forward(&x)?; // out.y: (1, 84, 2100)
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod bench;
mod blocks;
pub mod config;
pub mod error;
pub mod graph;
pub mod head;
pub mod layers;
pub mod loss;
pub mod model;
pub mod ops;
mod params;
pub mod pt;
pub mod run;
mod stats;
pub mod weights;

pub use bench::{BenchOptions, BenchReport, bench_model, bench_model_with, peak_rss_bytes};
/// The candle version this crate is built on (for devices and tensors in the public API).
pub use candle_core;
pub use config::{Arch, Family, REG_MAX, STRIDES, Scale, YoloConfig, parse_model, parse_model_yaml};
pub use error::{ModelError, Result};
pub use graph::{Activation, AttentionOp, ConvOp, DetectDecode, Graph, Node, Op, ValueId};
pub use head::RawHead;
pub use layers::Mode;
pub use loss::{DenseLoss, DenseTargets, DetectionLoss, LossGains, LossOutput, padded_targets};
pub use model::{Detections, PackedVars, Yolo, dfl_key};
pub use pt::{PtCheckpoint, is_pt, read_pt, read_pt_bytes};
pub use run::{RunOptions, RunSummary, run_npy};
pub use stats::Segment;
pub use weights::{LoadMode, Transferred};
