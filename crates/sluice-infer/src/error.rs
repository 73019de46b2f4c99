//! The inference crate's error: each variant names the file, image or device it concerns.

use std::fmt::Display;
use std::path::PathBuf;

use sluice_model::ModelError;

/// What can go wrong while loading a model, predicting or validating.
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
    /// A failure described in words.
    #[error("{0}")]
    Msg(String),
    /// What validation was doing when `inner` happened.
    #[error("{context}: {inner}")]
    Context {
        /// What was being done.
        context: String,
        /// The cause (its message is part of this one's, so it is not also reported as `source`).
        inner: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(Box<sluice_model::candle_core::Error>),
    /// The model could not be built or run.
    #[error(transparent)]
    ModelOp(Box<ModelError>),
    /// Post-processing or the metric failed.
    #[error(transparent)]
    Eval(Box<sluice_eval::Error>),
    /// A loader stage or the transfer failed (the message names the sample).
    #[error(transparent)]
    Stage(Box<sluice_core::Error>),
    /// A split could not be indexed or read.
    #[error(transparent)]
    Data(Box<sluice_loader::DataError>),
}

// Causes from the crates validation runs on, boxed so that the error stays small.
sluice_core::boxed_from!(InferError {
    Candle: sluice_model::candle_core::Error,
    ModelOp: ModelError,
    Eval: sluice_eval::Error,
    Stage: sluice_core::Error,
    Data: sluice_loader::DataError,
});

/// Wraps an error in what was being done when it happened (the message holds both).
pub(crate) fn ctx<E: std::error::Error + Send + Sync + 'static>(context: impl Display) -> impl FnOnce(E) -> InferError {
    move |e| InferError::Context { context: context.to_string(), inner: Box::new(e) }
}

/// This crate's result type.
pub type Result<T, E = InferError> = std::result::Result<T, E>;
