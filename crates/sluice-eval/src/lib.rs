//! Sluice's evaluation stage: non-maximum suppression matched bit for bit to Ultralytics / torchvision, the
//! COCOeval bbox algorithm of pycocotools 2.0.11 (12 summary stats equal to 1e-12), and Ultralytics-style
//! detection metrics (`ap_per_class`, the tp matrix, PR curves, fitness).
//!
//! Everything here is streaming and order-independent so that a bounded post-process worker queue can feed it:
//! each image is evaluated on its own ([`CocoAccumulator::add_image`], [`ApAccumulator::add_image`]), partial
//! accumulators built on different workers are [`merge`](CocoAccumulator::merge)d, and the final numbers do not
//! depend on the order images arrived in or on the number of workers. No per-image IoU matrix outlives its image.
//! [`StreamingValidator`] is that worker queue for the validation loop (see [`stream`]).
#![warn(missing_docs)]

pub mod coco;
pub mod error;
pub mod masknms;
pub mod metric;
pub mod nms;
pub mod numeric;
#[cfg(feature = "candle")]
pub mod output;
#[cfg(feature = "candle")]
pub mod shrink;
pub mod stream;
pub mod ultralytics;

pub use coco::{
    CocoAccumulator, CocoDataset, CocoEval, CocoParams, Detections, DtBox, GtBox, evaluate as coco_evaluate,
};
pub use error::{Error, Result};
pub use masknms::{MaskNms, MaskScratch, ValPost};
pub use metric::{CocoMetric, UltralyticsMetric};
pub use nms::{Layout, Nms, NmsMode, NmsParams, NmsScratch, PredBatch, PredView};
#[cfg(feature = "candle")]
pub use output::{Packed, ValOutput};
#[cfg(feature = "candle")]
pub use shrink::{PackedDims, ShrinkParams, Shrunk, shrink, unpack};
pub use stream::{KeptBatch, StreamConfig, StreamReport, StreamStats, StreamingValidator, ValBatch};
pub use ultralytics::{ApAccumulator, ApReport, ClassMetrics};
