//! The trainer's error: every failure of the training loop, validation, configuration and checkpoints, with the
//! file, epoch, batch or sample it concerns in its message.
//!
//! Causes from the stage crates arrive through `From`; [`Context`] wraps any of them in a sentence saying what the
//! trainer was doing (`"dataset runs/x/data.yaml: …"`), and the message of [`Error::Context`] already holds the
//! whole chain, so a caller prints it with `{}` and loses nothing.

use std::fmt::Display;

/// What can go wrong in training, validation, configuration and checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A failure described in words (a bad setting, an unusable run folder, too many non-finite steps).
    #[error("{0}")]
    Msg(String),
    /// What the trainer was doing when `inner` happened.
    #[error("{context}: {inner}")]
    Context {
        /// What was being done.
        context: String,
        /// The cause (its message is part of this one's, so it is not also reported as `source`).
        inner: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A file could not be read or written.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The model could not be built, loaded or run.
    #[error(transparent)]
    Model(#[from] sluice_model::ModelError),
    /// The optimizer or a checkpoint failed.
    #[error(transparent)]
    Optim(#[from] crate::optim::OptimError),
    /// The dataset could not be read.
    #[error(transparent)]
    Dataset(#[from] sluice_dataset::DatasetError),
    /// A split could not be indexed, packed or read.
    #[error(transparent)]
    Data(#[from] sluice_loader::DataError),
    /// A loader stage failed (the message names the sample).
    #[error(transparent)]
    Stage(#[from] sluice_core::Error),
    /// Post-processing or the metric failed.
    #[error(transparent)]
    Eval(#[from] sluice_eval::Error),
    /// Loading a model or opening a device failed.
    #[error(transparent)]
    Infer(#[from] sluice_infer::InferError),
    /// A JSON document could not be written or read.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// The ranks of a data-parallel run could not meet or lost one another.
    #[error(transparent)]
    Dist(#[from] sluice_dist::DistError),
    /// A YAML document could not be written or read.
    #[error(transparent)]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error from a message.
    pub fn msg(message: impl Display) -> Self {
        Self::Msg(message.to_string())
    }
}

/// Adds what the trainer was doing to an error or a missing value, as `anyhow::Context` does.
pub trait Context<T> {
    /// Wraps the error in `context`.
    fn context(self, context: impl Display) -> Result<T>;
    /// Wraps the error in the context `f` makes (only called on error).
    fn with_context<C: Display, F: FnOnce() -> C>(self, f: F) -> Result<T>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Display) -> Result<T> {
        self.map_err(|e| Error::Context { context: context.to_string(), inner: Box::new(e) })
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.map_err(|e| Error::Context { context: f().to_string(), inner: Box::new(e) })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl Display) -> Result<T> {
        self.ok_or_else(|| Error::Msg(context.to_string()))
    }

    fn with_context<C: Display, F: FnOnce() -> C>(self, f: F) -> Result<T> {
        self.ok_or_else(|| Error::Msg(f().to_string()))
    }
}

/// Returns early with an [`Error::Msg`] made by `format!`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Msg(format!($($arg)*)))
    };
}

/// Returns early with an [`Error::Msg`] made by `format!` unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::bail!($($arg)*);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_keeps_the_whole_chain_in_the_message() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Err::<(), _>(io).context("reading a.yaml").context("dataset d.yaml").unwrap_err();
        assert_eq!(e.to_string(), "dataset d.yaml: reading a.yaml: no such file");
        assert!(std::error::Error::source(&e).is_none());
        let none: Option<u8> = None;
        assert_eq!(none.context("nothing here").unwrap_err().to_string(), "nothing here");
    }

    #[test]
    fn bail_and_ensure_format_their_message() {
        fn f(x: u32) -> Result<u32> {
            ensure!(x < 3, "x is {x}, at least 3");
            if x == 2 {
                bail!("two");
            }
            Ok(x)
        }
        assert_eq!(f(1).ok(), Some(1));
        assert_eq!(f(2).unwrap_err().to_string(), "two");
        assert_eq!(f(5).unwrap_err().to_string(), "x is 5, at least 3");
    }
}
