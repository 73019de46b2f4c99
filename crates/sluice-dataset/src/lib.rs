//! Sluice's datasets: read an Ultralytics `data.yaml` (YOLO txt labels) or a COCO `instances_*.json` into a
//! validated [`SampleIndex`] (per sample: image path, size after EXIF orientation, pixel `xyxy` labels), with
//! Ultralytics' validation rules, a label index cache keyed by file sizes and mtimes, a dataset check report,
//! COCO JSON export, and the deterministic synthetic dataset generator used as the embedded default.
//!
//! The usual way in: [`DataConfig::load`] → [`DataConfig::index`] → [`IndexResult`] (the index, the problems
//! found, and what the cache did). [`check::check`] summarises that for `sluice data check`.
#![warn(missing_docs)]

pub mod cache;
pub mod check;
pub mod coco;
pub mod config;
pub mod error;
pub mod header;
pub mod index;
pub mod labels;
pub mod problem;
pub mod synth;

pub use check::{CheckReport, check};
pub use config::{DataConfig, DataYaml, IMG_FORMATS, MAX_CLASSES, Split, SplitSpec, img2label_path, is_url};
pub use error::{DatasetError, Result};
pub use header::{ImageFormat, ImageHeader, read_header};
pub use index::{IndexOptions, IndexResult, Sample, SampleIndex};
pub use labels::{ParsedLabels, YoloRow, parse_yolo_labels};
pub use problem::{Problem, ProblemKind, Severity};
