//! Sluice's foundation: the domain types every stage shares (images, boxes, labels, batches), the small
//! object-safe stage traits that let each pipeline stage be swapped and benchmarked alone, the bounded
//! multi-threaded pipeline runner with its buffer pool and telemetry, the deterministic sampler, and the counters of
//! host-blocking device reads ([`syncs`]).
//!
//! Nothing here touches candle or the GPU: stages before the transfer work on plain byte buffers.
#![warn(missing_docs)]

pub mod batch;
pub mod error;
pub mod geometry;
pub mod image;
pub mod labels;
pub mod pool;
pub mod runner;
pub mod sampler;
pub mod stage;
pub mod syncs;
pub mod telemetry;

pub use batch::{Batch, BatchShape, Target, TargetTable};
pub use error::{Error, Result};
pub use geometry::BoxXyxy;
pub use image::{ImageRgb8, SharedBytes};
pub use labels::{ClassId, Detection, ImageLabels, Label, SampleId};
pub use pool::{Pool, Pooled};
pub use runner::{CancelSource, CancelToken, Pipeline, PipelineIter, StageCtx};
pub use sampler::{DistributedSampler, RngStream, batch_rng, sample_rng};
pub use stage::{
    Augment, DecodeHint, DecodeInfo, Decoder, ImageSource, MergeMetric, Metric, PostProcess, Reader, SourceImage,
    Transfer,
};
pub use telemetry::{PipelineReport, StageReport};
