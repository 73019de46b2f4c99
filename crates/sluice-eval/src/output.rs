//! One validation batch's output on its way to the post-process workers, in either form a device step makes it:
//! the predictions above the validation conf ([`Shrunk`], for NMS on the workers) or the rows an NMS where the
//! predictions are kept ([`KeptRows`]). Either packs into one tensor for one copy to the host
//! ([`ValOutput::pack`], which the caller may read back asynchronously), and the validator takes that host copy
//! through its one submit ([`crate::StreamingValidator::submit_output`]). On the CPU nothing is packed: the output is
//! copied straight into the validator's pooled buffer ([`ValOutput::copy_into`],
//! [`crate::StreamingValidator::submit_on_host`]), so a CPU pass allocates nothing per batch for it.

use candle_core::Tensor;

use crate::ValBatch;
use crate::error::Result;
use crate::masknms::{KeptDims, KeptRows, unpack_kept};
use crate::shrink::{PackedDims, Shrunk, with_host_slice};

/// A validation batch's output on its device.
#[derive(Debug)]
pub enum ValOutput {
    /// The predictions above the validation conf, for NMS on the post-process workers
    /// ([`crate::shrink`](fn@crate::shrink)).
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

    /// Copies the output into `dst` (everything but its `ids` and `targets`). Shrunk predictions on the CPU are
    /// copied tensor by tensor into `dst`'s kept vectors; off the CPU, or for kept rows, the output is packed and
    /// copied to the host once (one blocking, counted copy) and unpacked.
    pub fn copy_into(&self, dst: &mut ValBatch) -> Result<()> {
        match self {
            ValOutput::Shrunk(s) => s.copy_into(dst),
            ValOutput::Kept(k) => {
                let (packed, d) = k.pack()?;
                with_host_slice(&packed, |v: &[f32]| unpack_kept(v, d, dst))?
            }
        }
    }
}
