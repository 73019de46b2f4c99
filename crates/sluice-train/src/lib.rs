//! Sluice's trainer library: the pieces the `sluice` binary wires together — the training and validation loaders
//! (the sampler's recipes executed on the pipeline runner, with a shared decoded-image cache), the optimizer, EMA
//! and checkpoints ([`optim`]), the training loop with validation, telemetry and resume ([`train`]), and the
//! dataset tools (split indexing, packing, the augmented-batch preview: [`data`]).
#![warn(missing_docs)]

pub mod data;
pub mod loader;
pub mod optim;
pub mod plots;
pub mod predict;
pub mod train;
