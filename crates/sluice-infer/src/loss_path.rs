//! Which loss path a step takes: the host assigner on the CPU ([`DetectionLoss::compute`]), or the tensor-op
//! assigner and loss on the device ([`DetectionLoss::compute_dense`]) elsewhere, so a GPU step copies nothing
//! but the three loss items to the host. The config's `dense_loss` takes the device path on the CPU too (the two
//! agree to float rounding; the tests check it), which is how the GPU path is exercised end to end here.

use crate::error::Result;
use sluice_core::Batch;
use sluice_core::syncs::{self, Site};
use sluice_model::candle_core::{DType, Device, Tensor};
use sluice_model::{DenseTargets, DetectionLoss, RawHead};
use sluice_transfer::DeviceBatch;

/// Whether steps on `device` take the dense (device) loss path: always off the CPU, on the CPU when `forced`.
pub fn dense_on(device: &Device, forced: bool) -> bool {
    !device.is_cpu() || forced
}

/// A step's loss: what to call `backward` on and the loss items.
#[derive(Debug)]
pub struct StepLoss {
    /// `(box + cls + dfl) · batch size`.
    pub total: Tensor,
    /// The items on the host (CPU path) or still on the device (`(3,)` f32, dense path).
    pub items: Items,
}

/// Loss items, where they are.
#[derive(Debug)]
pub enum Items {
    /// Read already.
    Host([f64; 3]),
    /// A `(3,)` f32 tensor on the device.
    Device(Tensor),
}

impl Items {
    /// The items on the host: a device read (counted) on the dense path.
    pub fn read(&self) -> Result<[f64; 3]> {
        match self {
            Items::Host(v) => Ok(*v),
            Items::Device(t) => {
                syncs::record_if(!t.device().is_cpu(), Site::LossItems);
                let v: Vec<f32> = t.to_dtype(DType::F32)?.to_vec1()?;
                if v.len() != 3 {
                    return Err(crate::InferError::Msg(format!("loss items: {} values", v.len())));
                }
                Ok([f64::from(v[0]), f64::from(v[1]), f64::from(v[2])])
            }
        }
    }
}

/// The loss of one transferred batch on the path for its device.
pub fn step_loss(loss: &DetectionLoss, raw: &RawHead, batch: &Batch, x: &DeviceBatch, dense: bool) -> Result<StepLoss> {
    if dense {
        let gt = DenseTargets { classes: &x.gt_classes, boxes: &x.gt_boxes, mask: &x.gt_mask };
        let out = loss.compute_dense(raw, gt)?;
        Ok(StepLoss { total: out.total, items: Items::Device(out.items) })
    } else {
        let out = loss.compute(raw, &batch.targets)?;
        Ok(StepLoss { total: out.total, items: Items::Host(out.items) })
    }
}
