//! The error type shared by every stage: each variant names the file, line or sample that caused it.

use std::path::PathBuf;

use crate::labels::SampleId;

/// Boxed error of a stage implementation (decoder backend, reader, user closure).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Result alias used across Sluice's library crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the core types, the stage traits and the runner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file being read or written.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// An image could not be decoded.
    #[error("{what}: cannot decode image: {reason}")]
    Decode {
        /// The file or sample that failed.
        what: String,
        /// Why decoding failed.
        reason: String,
    },
    /// A label row is invalid.
    #[error("{}:{line}: {reason}", path.display())]
    Label {
        /// The label file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the row.
        reason: String,
    },
    /// A value does not fit the shape or range a type requires.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid (e.g. "image stride").
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A pipeline stage failed on one item; `id` is the sample id the source gave that item.
    #[error("stage `{stage}` failed on item #{seq} (sample {id}): {source}")]
    Stage {
        /// The stage's name.
        stage: &'static str,
        /// Position of the item in the pipeline's input order (0-based).
        seq: u64,
        /// Sample id of the item.
        id: SampleId,
        /// The stage's own error.
        source: BoxError,
    },
    /// A pipeline stage panicked on one item.
    #[error("stage `{stage}` panicked on item #{seq} (sample {id}): {message}")]
    Panic {
        /// The stage's name.
        stage: &'static str,
        /// Position of the item in the pipeline's input order.
        seq: u64,
        /// Sample id of the item.
        id: SampleId,
        /// The panic payload, when it was a string.
        message: String,
    },
    /// The operation was cancelled because the pipeline shut down.
    #[error("cancelled: the pipeline is shutting down")]
    Cancelled,
    /// Any other stage error.
    #[error(transparent)]
    Other(BoxError),
}

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    /// Wraps any error type as [`Error::Other`].
    pub fn other(err: impl Into<BoxError>) -> Self {
        Self::Other(err.into())
    }
}

/// `From` impls that box each cause into its variant of an error enum (`Variant(Box<Cause>)`), so that the enum
/// stays small however large its causes are (candle's errors are). Used by the crates whose errors wrap many others:
/// `boxed_from!(MyError { Candle: candle_core::Error, Model: ModelError });`.
#[macro_export]
macro_rules! boxed_from {
    ($error:ty { $($variant:ident: $cause:ty),* $(,)? }) => {
        $(impl From<$cause> for $error {
            fn from(e: $cause) -> Self {
                Self::$variant(Box::new(e))
            }
        })*
    };
}
