//! The error type of `sluice-eval`: every variant names the file, the JSON entry or the image it is about.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of NMS, the COCO evaluator and the metrics.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A JSON document is not valid JSON or does not have the expected shape.
    #[error("{what}: {source}")]
    Json {
        /// The file (or "ground truth" / "detections" for in-memory input).
        what: String,
        /// The parser's error, with line and column.
        source: serde_json::Error,
    },
    /// One entry of a COCO document is invalid.
    #[error("{what}: {entry}: {reason}")]
    Entry {
        /// The file (or "ground truth" / "detections").
        what: String,
        /// The entry, e.g. `annotations[17] (id 18)`.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A prediction holds a NaN or infinite value where NMS needs a number.
    #[error("image {image}: non-finite value {value} at anchor {anchor}, row {row} of the prediction")]
    NonFinite {
        /// Image index in the batch.
        image: usize,
        /// Anchor (column) index.
        anchor: usize,
        /// Row: 0-3 box, 4.. class scores.
        row: usize,
        /// The offending value.
        value: f32,
    },
    /// An image was added twice to a streaming evaluator.
    #[error("image {0} was added twice to the evaluator")]
    DuplicateImage(i64),
    /// Post-processing one sample of a validation batch failed (NMS on a NaN score, a bad class, ...).
    #[error("sample {id}: {source}")]
    Sample {
        /// The sample's id (its index in the dataset's sample index).
        id: sluice_core::SampleId,
        /// What went wrong.
        source: Box<Error>,
    },
    /// Post-processing one validation batch failed in a way that names no single image.
    #[error("validation batch {batch}: {source}")]
    Batch {
        /// 0-based position of the batch in submission order.
        batch: u64,
        /// What went wrong.
        source: Box<Error>,
    },
    /// A post-process or metric stage of another crate failed (see [`Error::from_stage`]).
    #[error(transparent)]
    Stage(sluice_core::Error),
    /// A post-process worker thread panicked or the streaming validator stopped after an earlier error.
    #[error("streaming validator: {0}")]
    Stream(String),
    /// A tensor operation of the shrink step failed.
    #[cfg(feature = "candle")]
    #[error("tensor op: {0}")]
    Candle(#[source] candle_core::Error),
    /// A parameter or input shape is invalid.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl From<Error> for sluice_core::Error {
    fn from(e: Error) -> Self {
        match e {
            Error::Stage(e) => e,
            e => sluice_core::Error::other(e),
        }
    }
}

impl Error {
    /// The error a `sluice-core` stage returned, as this crate's error: an error of this crate that a stage
    /// wrapped on its way out (e.g. [`Error::NonFinite`] from [`crate::Nms`]) comes back as itself, anything
    /// else as [`Error::Stage`].
    pub fn from_stage(e: sluice_core::Error) -> Self {
        match e {
            sluice_core::Error::Other(b) => match b.downcast::<Error>() {
                Ok(e) => *e,
                Err(b) => Error::Stage(sluice_core::Error::Other(b)),
            },
            e => Error::Stage(e),
        }
    }
}
