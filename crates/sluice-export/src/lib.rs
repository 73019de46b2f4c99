//! Sluice models written for other runtimes. Today: ONNX in Ultralytics' layout (input `images` `(B, 3, H, W)` in
//! `[0, 1]`, output `output0` `(B, 4 + nc, anchors)`, Ultralytics' metadata properties), from the family-neutral
//! evaluation graph a model describes (`sluice_model::Graph`: convolutions with BatchNorm folded, slices, concats,
//! pools, upsamples, the detection decode), so a new model family needs no change here.
//!
//! ```no_run
//! use sluice_export::{Metadata, OnnxOptions, to_onnx_bytes};
//! # fn run(model: &sluice_model::Yolo, meta: &Metadata) -> sluice_export::Result<()> {
//! let bytes = to_onnx_bytes(&model.graph()?, &OnnxOptions { imgsz: (640, 640), ..Default::default() }, meta)?;
//! std::fs::write("yolov8n.onnx", bytes).ok();
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod error;
pub mod metadata;
pub mod onnx;
pub mod pb;

pub use error::{ExportError, Result};
pub use metadata::{ExportArgs, Metadata};
pub use onnx::{OPSETS, OnnxOptions, to_model_proto, to_onnx_bytes};
