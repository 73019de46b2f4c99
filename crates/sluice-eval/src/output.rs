//! One validation batch's output on its way to the post-process workers, in either form a device step makes it:
//! the predictions above the validation conf ([`Shrunk`], for NMS on the workers) or the rows an NMS where the
//! predictions are kept ([`KeptRows`]). Either packs into one tensor for one copy to the host
//! ([`ValOutput::pack`], which the caller may read back asynchronously), and the validator takes that host copy
//! through its one submit ([`crate::StreamingValidator::submit_output`]). On the CPU the packed tensor is read in place
//! ([`ValOutput::with_host`]).

use candle_core::Tensor;

use crate::error::Result;
use crate::masknms::{KeptDims, KeptRows};
use crate::shrink::{PackedDims, Shrunk, with_host_slice};

/// A validation batch's output on its device.
#[derive(Debug)]
pub enum ValOutput {
    /// The predictions above the validation conf, for NMS on the post-process workers ([`crate::shrink`]).
    Shrunk(Shrunk),
    /// The rows NMS on the device kept ([`crate::masknms::nms_tensor`]); the workers need
    /// [`crate::ValPost::Kept`].
    Kept(KeptRows),
}

/// The shape of a [`ValOutput::pack`]ed batch, which says how to unpack its host copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packed {
    /// Packed [`Shrunk`] predictions.
    Shrunk(PackedDims),
    /// Packed [`KeptRows`].
    Kept(KeptDims),
}

impl ValOutput {
    /// The output packed into one flat float32 tensor on its device, and its shape.
    pub fn pack(&self) -> Result<(Tensor, Packed)> {
        Ok(match self {
            ValOutput::Shrunk(s) => s.pack().map(|(p, d)| (p, Packed::Shrunk(d)))?,
            ValOutput::Kept(k) => k.pack().map(|(p, d)| (p, Packed::Kept(d)))?,
        })
    }

    /// `f` of the packed output on the host: read in place on the CPU, one blocking (counted) copy off it.
    pub fn with_host<R>(&self, f: impl FnOnce(&[f32], Packed) -> R) -> Result<R> {
        let (packed, dims) = self.pack()?;
        with_host_slice(&packed, |v: &[f32]| f(v, dims))
    }
}
