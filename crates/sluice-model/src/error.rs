//! The crate's error type: every failure names the file, key or tensor it concerns.

use std::path::PathBuf;

/// Errors of the model, its weights I/O and the loss.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// A weights file lacks a key the model needs.
    #[error("{file}: missing weight `{key}`")]
    MissingKey {
        /// The weights file.
        file: PathBuf,
        /// The Ultralytics key name.
        key: String,
    },
    /// A weights file holds a key the model does not know.
    #[error("{file}: unexpected weight `{key}` (not part of this model: wrong scale or class count?)")]
    UnexpectedKey {
        /// The weights file.
        file: PathBuf,
        /// The Ultralytics key name.
        key: String,
    },
    /// A weight has another shape than the model expects.
    #[error("{file}: weight `{key}` has shape {got:?}, the model expects {expected:?}")]
    ShapeMismatch {
        /// The weights file.
        file: PathBuf,
        /// The Ultralytics key name.
        key: String,
        /// The shape the model expects.
        expected: Vec<usize>,
        /// The shape in the file.
        got: Vec<usize>,
    },
    /// A weights file could not be read or written.
    #[error("{file}: {source}")]
    WeightsIo {
        /// The weights file.
        file: PathBuf,
        /// What went wrong.
        source: candle_core::Error,
    },
    /// An `.npy` file could not be read or written.
    #[error("{file}: {source}")]
    Npy {
        /// The `.npy` file.
        file: PathBuf,
        /// What went wrong.
        source: candle_core::Error,
    },
    /// A file or folder could not be created.
    #[error("{file}: {source}")]
    Io {
        /// The path.
        file: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A weight has a value the model cannot use (e.g. a DFL projection other than 0..15).
    #[error("{file}: weight `{key}`: {reason}")]
    BadWeight {
        /// The weights file.
        file: PathBuf,
        /// The Ultralytics key name.
        key: String,
        /// Why it is unusable.
        reason: String,
    },
    /// An Ultralytics `.pt` checkpoint that cannot be read or is not a YOLOv8 detection model.
    #[error("{file}: {reason}")]
    Pt {
        /// The checkpoint.
        file: PathBuf,
        /// What was found.
        reason: String,
    },
    /// An input tensor has the wrong shape or type.
    #[error("bad input: {0}")]
    BadInput(String),
    /// An operation that needs the unfused model was called on a fused one.
    #[error("{0} needs the unfused model (Conv+BN folding is inference only)")]
    Fused(&'static str),
    /// A name that is not a YOLOv8 scale.
    #[error("unknown model `{0}` (expected yolov8n, yolov8s, yolov8m, yolov8l or yolov8x)")]
    UnknownModel(String),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, ModelError>;
