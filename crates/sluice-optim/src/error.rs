//! The optimisation module's error type: every failure names the setting, parameter or file it concerns.

use std::path::PathBuf;

/// Errors of the optimiser, the schedule, the EMA and the training checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The model refused an operation (e.g. a fused model, or weights that do not fit).
    #[error(transparent)]
    Model(#[from] sluice_model::ModelError),
    /// A setting is out of range or unknown.
    #[error("optimizer settings: {0}")]
    BadSettings(String),
    /// The caller passed something inconsistent (another model, an iteration counter that went backwards, …).
    #[error("optimizer: {0}")]
    BadInput(String),
    /// A checkpoint could not be written or read.
    #[error("{file}: {source}")]
    Io {
        /// The checkpoint (or its temporary file).
        file: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A checkpoint does not have the expected layout or does not fit this model and optimizer.
    #[error("{file}: {reason}")]
    BadCheckpoint {
        /// The checkpoint.
        file: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
}

/// The optimisation module's result type.
pub type Result<T> = std::result::Result<T, OptimError>;
