//! Sluice's augmentations, with Ultralytics' semantics and default hyperparameters, executed from recipes.
//!
//! * [`Hyp`]: the hyperparameters (Ultralytics' keys and defaults), [`RecipeSampler`]: draws a [`TrainRecipe`]
//!   (every random decision of one sample) from a caller-owned RNG, so a sample is a pure function of the stream
//!   the caller seeds for it.
//! * [`TrainAugment`] / [`TrainPlan`]: the fused sampler: mosaic-4 (or letterbox) + random perspective + mixup +
//!   HSV + flips, each output pixel gathered once through the inverse transform from its source tile and written
//!   straight into a batch's CHW u8 slot; boxes through the forward transform, clipped and filtered by
//!   Ultralytics' `box_candidates`.
//! * [`Letterbox`], [`letterbox_into`], [`RectPlan`], [`ValLetterbox`]: Ultralytics' `LetterBox` (including its
//!   rounding), the validation transform and the rectangular validation batches.
//! * [`HsvLut`]: OpenCV/Ultralytics HSV augmentation through lookup tables.
#![warn(missing_docs)]

pub mod affine;
mod augment;
mod canvas;
pub mod error;
mod fused;
pub mod hsv;
pub mod hyp;
pub mod letterbox;
pub mod recipe;
pub mod resample;

pub use affine::{Mat3, PerspectiveParams, box_candidate, transform_box};
pub use augment::{TrainAugment, ValLetterbox, ValRecipe, ValTransform};
pub use error::{AugmentError, Result};
pub use fused::TrainPlan;
pub use hsv::{HsvGains, HsvLut, hsv_reference};
pub use hyp::Hyp;
pub use letterbox::{FILL, Letterbox, LetterboxOpts, RectPlan, letterbox_into, load_size};
pub use recipe::{Geometry, Layout, Mixup, RecipeSampler, TrainRecipe, draw_multiscale};
