//! Training: the configuration ([`config`], with the opt-in [`device_paths`]), the run and its phases ([`run`], [`epoch`]), what it tells its caller
//! ([`events`]), its state on disk and checkpoints ([`state`]), the per-epoch records ([`results`]), where the time
//! went ([`telemetry`]), the validation pass ([`validate`]) and the pieces a run is built from ([`setup`]).

pub mod autobatch;
pub mod config;
pub mod device_paths;
pub mod epoch;
pub mod events;
pub mod loss_path;
pub mod results;
pub mod run;
pub mod setup;
pub mod state;
pub mod telemetry;
pub mod validate;

pub use config::{Amp, CacheMode, ReadFrom, TrainConfig, parse_multi_scale};
pub use device_paths::{CudnnSearch, DevicePaths, parse_device_paths};
pub use events::{BatchEvent, EpochEvent, FinalEvalEvent, FirstBatchEvent, Observer, Quiet};
pub use run::Trainer;
pub use setup::{ValRequest, ValSettings, validate_weights};
pub use state::{Metrics, Progress, RunPaths, TrainSummary, checkpoint_config, find_resume};
