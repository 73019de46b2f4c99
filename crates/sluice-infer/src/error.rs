//! The inference crate's error: each variant names the file, image or device it concerns.

use std::path::PathBuf;

use sluice_model::ModelError;

/// What can go wrong while loading a model or predicting.
#[derive(Debug, thiserror::Error)]
pub enum InferError {
    /// A device name that is not one this build can open.
    #[error("device {name}: {reason}")]
    Device {
        /// The name asked for.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The weights file is unusable.
    #[error("weights {}: {reason}", path.display())]
    Weights {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The model failed to load or run.
    #[error("{context}: {source}")]
    Model {
        /// The weights file or the image being predicted.
        context: String,
        /// The cause (boxed: candle's errors are large).
        #[source]
        source: Box<ModelError>,
    },
    /// An image could not be decoded.
    #[error("{}: {reason}", path.display())]
    Decode {
        /// The image.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// NMS rejected the model output of an image.
    #[error("{}: NMS: {source}", path.display())]
    Nms {
        /// The image.
        path: PathBuf,
        /// The cause.
        #[source]
        source: sluice_eval::Error,
    },
    /// A setting or input is invalid.
    #[error("{what}: {reason}")]
    Invalid {
        /// What was checked.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// Listing the sources failed.
    #[error(transparent)]
    Dataset(#[from] sluice_dataset::DatasetError),
}

/// This crate's result type.
pub type Result<T, E = InferError> = std::result::Result<T, E>;
