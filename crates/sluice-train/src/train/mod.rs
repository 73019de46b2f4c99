//! Training: the configuration ([`config`], with the opt-in device paths of `sluice_infer::device_paths`), the run and its phases ([`run`], [`epoch`]), what it tells its caller
//! ([`events`]), its state on disk and checkpoints ([`state`]), the per-epoch records ([`results`]), where the time
//! went ([`telemetry`]) and the pieces a run is built from ([`setup`]). The validation pass is `sluice_infer`'s.

pub mod autobatch;
pub mod config;
pub mod epoch;
pub mod events;
pub mod results;
pub mod run;
pub mod setup;
pub mod state;
pub mod telemetry;

pub use config::{Amp, CacheMode, ReadFrom, TrainConfig, parse_multi_scale};
pub use events::{BatchEvent, EpochEvent, FinalEvalEvent, FirstBatchEvent, Observer, Quiet, SetupEvent, SetupTask};
pub use run::Trainer;
pub use sluice_infer::{CudnnSearch, DevicePaths, parse_device_paths};
pub use state::{Metrics, Progress, RunPaths, TrainSummary, checkpoint_config, find_resume};
