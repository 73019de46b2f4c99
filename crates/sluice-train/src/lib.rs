//! Sluice's trainer library: the training loop in phases (train epoch, validate, end of epoch) with telemetry,
//! checkpoints and resume ([`train`]), the optimizer, its parameter groups, schedules, EMA and checkpoint files
//! ([`optim`]); models are loaded, devices opened and epochs validated through `sluice-infer`. It reports through the [`train::Observer`]
//! callbacks and returns [`Error`]s; the `sluice` binary (sluice-cli) draws, prints and parses arguments.
#![warn(missing_docs)]

pub mod dist;
pub mod error;
pub mod train;

pub use error::{Error, Result};
/// Optimisation (the `sluice-optim` crate): the trainer's optimizer, schedule, EMA and checkpoints.
pub use sluice_optim as optim;
