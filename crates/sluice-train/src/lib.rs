//! Sluice's trainer library: the pieces the `sluice` binary wires together. Today: the training and validation
//! loaders (the sampler's recipes executed on the pipeline runner, with a shared decoded-image cache).
#![warn(missing_docs)]

pub mod loader;
pub mod plots;
pub mod predict;
