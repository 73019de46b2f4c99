//! Training: the configuration ([`config`]), the loop with validation, checkpoints and resume ([`run`]), the
//! per-epoch records ([`results`]), where the time went ([`telemetry`]) and the validation pass ([`validate`]).

pub mod autobatch;
pub mod config;
pub mod loss_path;
pub mod results;
pub mod run;
pub mod telemetry;
pub mod validate;

pub use config::{CacheMode, TrainConfig, parse_multi_scale};
pub use run::{BatchEvent, EpochEvent, FinalEvalEvent, Metrics, Observer, Quiet, TrainSummary, Trainer, find_resume};
