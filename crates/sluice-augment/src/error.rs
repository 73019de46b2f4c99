//! The crate's error type: every variant names the sample (or the value) that caused it.

use sluice_core::SampleId;

/// Errors of the augmentation stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AugmentError {
    /// The image source failed for a sample.
    #[error("sample {id}: cannot get the source image: {source}")]
    Source {
        /// The sample whose image was requested.
        id: SampleId,
        /// The source's error.
        source: sluice_core::Error,
    },
    /// A source image has no pixels.
    #[error("sample {id}: source image is empty ({width}x{height})")]
    EmptyImage {
        /// The sample.
        id: SampleId,
        /// Its width.
        width: u32,
        /// Its height.
        height: u32,
    },
    /// The batch buffer's shape does not match what the recipe produces.
    #[error(
        "sample {id}: batch canvas is {batch_w}x{batch_h}x{batch_c} (WxHxC) but the recipe needs {want_w}x{want_h}x3"
    )]
    BatchShape {
        /// The sample.
        id: SampleId,
        /// Batch canvas width.
        batch_w: usize,
        /// Batch canvas height.
        batch_h: usize,
        /// Batch channels.
        batch_c: usize,
        /// Width the recipe produces.
        want_w: usize,
        /// Height the recipe produces.
        want_h: usize,
    },
    /// The batch refused a slot (it is full).
    #[error("sample {id}: {source}")]
    Slot {
        /// The sample.
        id: SampleId,
        /// The batch's error.
        source: sluice_core::Error,
    },
    /// A configuration value is out of range.
    #[error("invalid {what}: {reason}")]
    Config {
        /// The value (e.g. "hyp.scale").
        what: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}

impl From<AugmentError> for sluice_core::Error {
    fn from(err: AugmentError) -> Self {
        sluice_core::Error::other(err)
    }
}

/// Result alias of this crate.
pub type Result<T, E = AugmentError> = std::result::Result<T, E>;
