//! One module per `sluice` subcommand: its clap `Args` and its `run`.

pub(crate) mod bench;
pub(crate) mod data;
pub(crate) mod eval_coco;
pub(crate) mod export;
pub(crate) mod gpu;
pub(crate) mod info;
pub(crate) mod model;
pub(crate) mod pack;
pub(crate) mod predict;
pub(crate) mod step_cost;
pub(crate) mod train;
pub(crate) mod val;
