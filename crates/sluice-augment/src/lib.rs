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
//!
//! How a loader uses it (training): per sample position `i` of epoch `e`, draw
//! `RecipeSampler::draw(id, imgsz, hyp.mosaic_active(e, epochs), &mut sluice_core::sampler::sample_rng(seed, e, i))`
//! in the sampler, and let a worker call `TrainAugment.apply(&recipe, &cache, &mut batch)` on a batch of shape
//! `(3, imgsz, imgsz)`. With multi-scale, draw the batch's side once with
//! `draw_multiscale(imgsz, range, 32, &mut sluice_core::batch_rng(seed, e, k))`, set it on every recipe of the batch
//! with `TrainRecipe::with_size` and give the batch that shape: each sample is rendered straight at that size.
//! Validation: `RectPlan::new(sizes, batch, imgsz, 32, 0.5)` once, then per image
//! `ValLetterbox.apply(&ValRecipe { id, imgsz, canvas: plan.shapes[b] }, ...)` into a batch of that canvas;
//! `ValTransform::unmap_box` maps predictions back to the source image.
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
pub use recipe::{Geometry, Layout, Mixup, RecipeSampler, TrainRecipe, draw_multiscale, multiscale_bounds};
