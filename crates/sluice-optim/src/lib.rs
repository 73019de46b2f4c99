//! Optimisation of a training run, as Ultralytics 8.4's trainer does it: three parameter groups (decayed
//! conv weights, BatchNorm weights, biases), SGD with Nesterov momentum, Adam or AdamW (`auto` chosen from the
//! run length), gradient accumulation to the nominal batch 64 with the weight decay scaled to it, warmup of the
//! accumulation, learning rates and momentum, a linear or cosine schedule, clipping at gradient norm 10, the EMA
//! of the model used for validation and checkpoints, and checkpoints that resume a run exactly.
//!
//! The training loop drives one [`Optimization`]:
//!
//! ```no_run
//! use candle_core::{DType, Device};
//! use sluice_model::{DetectionLoss, Mode, Scale, YoloConfig, Yolo};
//! use sluice_optim::{OptimSettings, Optimization, RunShape};
//! # fn batches() -> Vec<(candle_core::Tensor, Vec<sluice_core::Target>)> { Vec::new() }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu)?;
//! let shape = RunShape { batch: 16, epochs: 3, batches_per_epoch: 8, train_images: 128 };
//! let mut opt = Optimization::new(&model, &OptimSettings::default(), shape)?;
//! let loss_fn = DetectionLoss::new(80);
//! for epoch in 0..shape.epochs {
//!     for (i, (images, targets)) in batches().into_iter().enumerate() {
//!         let (raw, _) = model.forward_raw(&images, Mode::Train)?;
//!         let loss = loss_fn.compute(&raw, &targets)?;
//!         let out = opt.batch(&model, &loss.total, i + shape.batches_per_epoch * epoch, epoch)?;
//!         if out.skipped_nonfinite { /* count it, warn with the batch number */ }
//!     }
//!     let lrs = opt.end_epoch(epoch)?; // lr/pg0, lr/pg1, lr/pg2 for results.csv
//!     // validate opt.ema_model(); then:
//!     opt.save_state(&model, "runs/exp/weights/last.safetensors", &serde_json::json!({ "epoch": epoch }))?;
//! }
//! # Ok(()) }
//! ```
//!
//! Resuming: [`read_user_metadata`] gives back the caller's JSON (to rebuild the configuration), then build the
//! model and the [`Optimization`] as for a new run and call [`Optimization::load_state`]. The checkpoint layout
//! is described in the `checkpoint` module; `Yolo::load_weights_prefixed(path, "ema.", LoadMode::Strict)`
//! loads the EMA weights of a checkpoint for validation or prediction.

#![warn(missing_docs)]

mod checkpoint;
mod driver;
pub mod ema;
mod error;
pub mod groups;
pub mod io;
pub mod optimizer;
pub mod scaler;
pub mod schedule;
pub mod settings;

pub use checkpoint::{FORMAT, read_user_metadata};
pub use driver::{BatchOutcome, GradReduce, Optimization, StepOptions, StepPath};
pub use ema::ModelEma;
pub use error::{OptimError, Result};
pub use groups::{Group, ParamGroups};
pub use optimizer::Optimizer;
pub use scaler::{LossScaler, ScalerSettings, ScalerState};
pub use schedule::Schedule;
pub use settings::{OptimSettings, OptimizerKind, Resolved, Rule, RunShape};
