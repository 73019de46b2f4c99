//! Host batch → device tensors.
//!
//! The CPU path ([`CpuTransfer`]) turns a filled [`Batch`] (u8 NCHW pixels + targets table) into the tensors the
//! model and the loss read: images as `f32`/`bf16` in `[0, 1]`, and the targets as a padded per-image table
//! (`(B, M)` classes, `(B, M, 4)` pixel `xyxy` boxes, `(B, M)` mask), built on the host once per batch so the loss
//! never needs a per-image device→host round trip. The u8 → float conversion and the /255 happen in one pass.
//! The CUDA path (`CudaTransfer`, feature `cuda`) stages batches through a [`ring::Ring`] of pinned host and
//! device buffers, copies them on a dedicated copy stream, and converts on the device; [`DeviceTransfer`] picks
//! the path for a device. [`pool`] keeps the device's stream-ordered memory pool from handing memory back to the
//! driver at every synchronisation, and counts the steps in which it still had to grow. [`GpuTimer`] measures the
//! device time of work on the compute stream with CUDA events.
#![warn(missing_docs)]

#[cfg(feature = "cuda")]
mod cuda;
pub mod gpu_timer;
pub mod pool;
pub mod readback;
pub mod ring;

#[cfg(feature = "cuda")]
pub use cuda::{CudaTransfer, CudaTransferStats};
pub use gpu_timer::GpuTimer;
pub use pool::{PoolGrowth, device_pool_reserved, retain_device_pool};
pub use readback::Readback;

use candle_core::{DType, Device, Tensor};
use sluice_core::{Batch, Error, Result, Transfer};

/// A batch on the device, ready for the model and the loss.
#[derive(Debug, Clone)]
pub struct DeviceBatch {
    /// `(B, 3, H, W)` images in `[0, 1]`.
    pub images: Tensor,
    /// `(B, M)` class indices as floats (padding rows hold 0).
    pub gt_classes: Tensor,
    /// `(B, M, 4)` boxes in canvas pixels, `x1 y1 x2 y2` (padding rows hold 0).
    pub gt_boxes: Tensor,
    /// `(B, M)` 1.0 for a real box, 0.0 for padding.
    pub gt_mask: Tensor,
    /// Images in the batch (`B`).
    pub len: usize,
    /// Rows per image in the padded targets table (`M`, at least 1).
    pub max_boxes: usize,
    /// Position of the batch within its epoch.
    pub index: u64,
}

/// Copies batches to a candle device (the CPU, or a GPU through candle's own copy) as `dtype` images.
#[derive(Debug, Clone)]
pub struct CpuTransfer {
    device: Device,
    dtype: DType,
}

impl CpuTransfer {
    /// Transfers to `device`, converting images to `dtype` (`F32`, `BF16` or `F16`).
    pub fn new(device: Device, dtype: DType) -> Self {
        Self { device, dtype }
    }

    /// The target device.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

/// Converts u8 pixels to floats in `[0, 1]` in one pass.
pub fn u8_to_unit_f32(src: &[u8], dst: &mut Vec<f32>) {
    const INV: f32 = 1.0 / 255.0;
    dst.clear();
    dst.extend(src.iter().map(|&v| f32::from(v) * INV));
}

/// The padded per-image targets table of `batch`: `(classes, boxes, mask, max_boxes)` as flat host vectors.
pub fn padded_targets(batch: &Batch) -> (Vec<f32>, Vec<f32>, Vec<f32>, usize) {
    let n = batch.len();
    let mut counts = vec![0usize; n];
    for t in &batch.targets {
        if let Some(c) = counts.get_mut(t.image as usize) {
            *c += 1;
        }
    }
    let m = counts.iter().copied().max().unwrap_or(0).max(1);
    let mut classes = vec![0f32; n * m];
    let mut boxes = vec![0f32; n * m * 4];
    let mut mask = vec![0f32; n * m];
    let mut fill = vec![0usize; n];
    for t in &batch.targets {
        let b = t.image as usize;
        if b >= n {
            continue;
        }
        let row = b * m + fill[b];
        fill[b] += 1;
        classes[row] = t.class as f32;
        boxes[row * 4..row * 4 + 4].copy_from_slice(&[t.bbox.x1, t.bbox.y1, t.bbox.x2, t.bbox.y2]);
        mask[row] = 1.0;
    }
    (classes, boxes, mask, m)
}

/// Device memory in use (`total − free`, bytes, as the driver reports it, which includes what the stream-ordered
/// allocator keeps pooled) on a CUDA device; `None` on the CPU or in a build without `cuda`. A driver query,
/// not a stream synchronisation.
pub fn device_memory_in_use(device: &Device) -> Option<u64> {
    device_memory(device).map(|(used, _)| used)
}

/// `(in use, total)` device memory in bytes on a CUDA device ([`device_memory_in_use`]); `None` elsewhere.
pub fn device_memory(device: &Device) -> Option<(u64, u64)> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(d) = device {
        return d
            .cuda_stream()
            .context()
            .mem_get_info()
            .ok()
            .map(|(free, total)| ((total - free) as u64, total as u64));
    }
    let _ = device;
    None
}

/// An error naming the first target whose image index is outside the batch.
pub(crate) fn check_targets(batch: &Batch) -> Result<()> {
    let n = batch.len();
    if let Some(t) = batch.targets.iter().find(|t| t.image as usize >= n) {
        return Err(Error::Invalid {
            what: "batch targets",
            reason: format!("batch {}: target for image {} but only {n} images", batch.index, t.image),
        });
    }
    Ok(())
}

fn candle_err(what: &'static str) -> impl Fn(candle_core::Error) -> Error {
    move |e| Error::Invalid { what, reason: e.to_string() }
}

impl Transfer for CpuTransfer {
    type Output = DeviceBatch;

    fn transfer(&self, batch: &Batch) -> Result<DeviceBatch> {
        let shape = batch.shape();
        let n = batch.len();
        check_targets(batch)?;
        let mut pixels = Vec::with_capacity(batch.pixels().len());
        u8_to_unit_f32(batch.pixels(), &mut pixels);
        let images = Tensor::from_vec(pixels, (n, shape.channels, shape.height, shape.width), &self.device)
            .and_then(|t| if self.dtype == DType::F32 { Ok(t) } else { t.to_dtype(self.dtype) })
            .map_err(candle_err("image tensor"))?;
        let (classes, boxes, mask, m) = padded_targets(batch);
        let gt_classes = Tensor::from_vec(classes, (n, m), &self.device).map_err(candle_err("target classes"))?;
        let gt_boxes = Tensor::from_vec(boxes, (n, m, 4), &self.device).map_err(candle_err("target boxes"))?;
        let gt_mask = Tensor::from_vec(mask, (n, m), &self.device).map_err(candle_err("target mask"))?;
        Ok(DeviceBatch { images, gt_classes, gt_boxes, gt_mask, len: n, max_boxes: m, index: batch.index })
    }
}

/// The transfer for a device: [`CpuTransfer`] on the CPU (and on a CUDA device in a build without `cuda`, where
/// candle cannot make one anyway), `CudaTransfer` on a CUDA device.
#[derive(Debug)]
pub enum DeviceTransfer {
    /// The host path.
    Cpu(CpuTransfer),
    /// The pinned ring + copy stream.
    #[cfg(feature = "cuda")]
    Cuda(CudaTransfer),
}

impl DeviceTransfer {
    /// The transfer for `device`, producing `dtype` images.
    pub fn new(device: &Device, dtype: DType) -> Result<Self> {
        #[cfg(feature = "cuda")]
        if device.is_cuda() {
            return Ok(Self::Cuda(CudaTransfer::new(device, dtype)?));
        }
        Ok(Self::Cpu(CpuTransfer::new(device.clone(), dtype)))
    }

    /// The target device.
    pub fn device(&self) -> &Device {
        match self {
            Self::Cpu(t) => t.device(),
            #[cfg(feature = "cuda")]
            Self::Cuda(t) => t.device(),
        }
    }
}

impl Transfer for DeviceTransfer {
    type Output = DeviceBatch;

    fn transfer(&self, batch: &Batch) -> Result<DeviceBatch> {
        match self {
            Self::Cpu(t) => t.transfer(batch),
            #[cfg(feature = "cuda")]
            Self::Cuda(t) => t.transfer(batch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{BatchShape, BoxXyxy, Target};

    fn batch() -> Batch {
        let mut b = Batch::new(BatchShape::rgb(3, 2, 2), 8);
        for (i, v) in [0u8, 255, 51].into_iter().enumerate() {
            let (_, slot) = b.push_slot(i as u64).expect("slot");
            slot.fill(v);
        }
        b.targets.push(Target { image: 0, class: 4, bbox: BoxXyxy::new(1.0, 2.0, 3.0, 4.0) });
        b.targets.push(Target { image: 2, class: 1, bbox: BoxXyxy::new(0.0, 0.0, 1.0, 1.0) });
        b.targets.push(Target { image: 2, class: 7, bbox: BoxXyxy::new(0.5, 0.5, 2.0, 2.0) });
        b
    }

    #[test]
    fn images_are_scaled_to_unit_range() {
        let out = CpuTransfer::new(Device::Cpu, DType::F32).transfer(&batch()).expect("transfer");
        assert_eq!(out.images.dims(), &[3, 3, 2, 2]);
        let v = out.images.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("vec");
        assert_eq!(v[0], 0.0);
        assert_eq!(v[12], 1.0);
        assert!((v[24] - 0.2).abs() < 1e-7);
    }

    #[test]
    fn targets_are_padded_per_image() {
        let out = CpuTransfer::new(Device::Cpu, DType::F32).transfer(&batch()).expect("transfer");
        assert_eq!(out.max_boxes, 2);
        let classes = out.gt_classes.to_vec2::<f32>().expect("classes");
        assert_eq!(classes, vec![vec![4.0, 0.0], vec![0.0, 0.0], vec![1.0, 7.0]]);
        let mask = out.gt_mask.to_vec2::<f32>().expect("mask");
        assert_eq!(mask, vec![vec![1.0, 0.0], vec![0.0, 0.0], vec![1.0, 1.0]]);
        let boxes = out.gt_boxes.to_vec3::<f32>().expect("boxes");
        assert_eq!(boxes[0][0], vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(boxes[2][1], vec![0.5, 0.5, 2.0, 2.0]);
    }

    #[test]
    fn a_batch_without_targets_has_one_padding_row() {
        let mut b = batch();
        b.targets.clear();
        let out = CpuTransfer::new(Device::Cpu, DType::BF16).transfer(&b).expect("transfer");
        assert_eq!(out.max_boxes, 1);
        assert_eq!(out.images.dtype(), DType::BF16);
        assert_eq!(out.gt_mask.to_vec2::<f32>().expect("mask"), vec![vec![0.0]; 3]);
    }

    #[test]
    fn a_target_for_a_missing_image_is_an_error() {
        let mut b = batch();
        b.targets.push(Target { image: 5, class: 0, bbox: BoxXyxy::default() });
        let err = CpuTransfer::new(Device::Cpu, DType::F32).transfer(&b).expect_err("must fail");
        assert!(err.to_string().contains("image 5"), "{err}");
    }
}
