//! Sluice's trainer library: the pieces the `sluice` binary wires together — the training and validation loaders
//! (the sampler's recipes executed on the pipeline runner, with a shared decoded-image cache), the optimizer, EMA
//! and checkpoints ([`optim`]), the training loop with validation, telemetry and resume ([`train`]), the dataset
//! tools (split indexing, packing, the augmented-batch preview: [`data`]) and the stage benchmarks ([`bench`]).
#![warn(missing_docs)]

pub mod bench;
pub mod data;
pub mod loader;
pub mod optim;
pub mod plots;
pub mod predict;
pub mod train;
