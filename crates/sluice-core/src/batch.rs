//! A batch as it leaves the CPU stages: one contiguous u8 NCHW pixel buffer plus a targets table
//! `(image index, class, box)` in the layout the loss reads, reused from a pool across steps.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::geometry::BoxXyxy;
use crate::labels::{ClassId, SampleId};

/// The shape of a batch's pixel buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatchShape {
    /// Images per batch (capacity; the last batch of an epoch may fill fewer slots).
    pub batch: usize,
    /// Channels (3 for RGB).
    pub channels: usize,
    /// Canvas height in pixels.
    pub height: usize,
    /// Canvas width in pixels.
    pub width: usize,
}

impl BatchShape {
    /// An RGB batch shape.
    pub const fn rgb(batch: usize, height: usize, width: usize) -> Self {
        Self { batch, channels: 3, height, width }
    }

    /// Bytes of one image slot (`C * H * W`).
    pub const fn slot_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Bytes of the whole buffer.
    pub const fn len(&self) -> usize {
        self.batch * self.slot_len()
    }

    /// Whether the shape holds no pixels.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One row of the targets table.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Target {
    /// Index of the image within the batch.
    pub image: u32,
    /// Class index.
    pub class: ClassId,
    /// Box in pixels of the batch canvas.
    pub bbox: BoxXyxy,
}

/// All targets of a batch, image-major.
pub type TargetTable = Vec<Target>;

/// A filled (or being-filled) batch. Pixel buffer and tables keep their allocations across
/// [`Batch::reset`], so a pooled batch allocates nothing in steady state.
#[derive(Clone, PartialEq)]
pub struct Batch {
    shape: BatchShape,
    len: usize,
    pixels: Vec<u8>,
    /// Targets of every filled image, image-major.
    pub targets: TargetTable,
    /// Sample id of each filled slot (for a mosaic, the id of its first source image).
    pub sample_ids: Vec<SampleId>,
    /// Position of the batch within its epoch.
    pub index: u64,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("shape", &self.shape)
            .field("len", &self.len)
            .field("targets", &self.targets.len())
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Batch {
    /// An empty batch with room for `shape.batch` images and `targets_hint` targets.
    pub fn new(shape: BatchShape, targets_hint: usize) -> Self {
        Self {
            shape,
            len: 0,
            pixels: vec![0; shape.len()],
            targets: Vec::with_capacity(targets_hint),
            sample_ids: Vec::with_capacity(shape.batch),
            index: 0,
        }
    }

    /// Empties the batch for reuse with `shape`; reuses the allocations when the new shape fits (a batch created
    /// for the largest shape a loader can ask for, e.g. the top multi-scale size, never reallocates).
    pub fn reset(&mut self, shape: BatchShape, index: u64) {
        self.shape = shape;
        self.len = 0;
        self.pixels.resize(shape.len(), 0);
        self.targets.clear();
        self.sample_ids.clear();
        self.index = index;
    }

    /// The buffer's shape (capacity).
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// Number of filled slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no slot is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Claims the next slot for `id`: returns its index and its CHW pixels to write into.
    pub fn push_slot(&mut self, id: SampleId) -> Result<(u32, &mut [u8])> {
        if self.len == self.shape.batch {
            return Err(Error::Invalid {
                what: "batch slot",
                reason: format!("batch {} is full ({} slots)", self.index, self.shape.batch),
            });
        }
        let b = self.len;
        self.len += 1;
        self.sample_ids.push(id);
        let n = self.shape.slot_len();
        Ok((b as u32, &mut self.pixels[b * n..(b + 1) * n]))
    }

    /// The CHW pixels of slot `b`.
    pub fn slot(&self, b: usize) -> &[u8] {
        let n = self.shape.slot_len();
        &self.pixels[b * n..(b + 1) * n]
    }

    /// The CHW pixels of slot `b`, mutable.
    pub fn slot_mut(&mut self, b: usize) -> &mut [u8] {
        let n = self.shape.slot_len();
        &mut self.pixels[b * n..(b + 1) * n]
    }

    /// The filled part of the NCHW buffer (`len` images).
    pub fn pixels(&self) -> &[u8] {
        &self.pixels[..self.len * self.shape.slot_len()]
    }

    /// Targets of image `b` (a sub-slice; the table is image-major).
    pub fn targets_of(&self, b: u32) -> &[Target] {
        let start = self.targets.partition_point(|t| t.image < b);
        let end = self.targets.partition_point(|t| t.image <= b);
        &self.targets[start..end]
    }

    /// Bytes of pixels and targets held (for telemetry).
    pub fn byte_size(&self) -> usize {
        self.pixels().len() + self.targets.len() * std::mem::size_of::<Target>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_disjoint_and_full_batch_is_an_error() {
        let mut b = Batch::new(BatchShape::rgb(2, 2, 2), 4);
        let (i, s) = b.push_slot(7).expect("slot 0");
        assert_eq!(i, 0);
        s.fill(1);
        let (i, s) = b.push_slot(9).expect("slot 1");
        assert_eq!(i, 1);
        s.fill(2);
        assert!(b.push_slot(10).is_err());
        assert_eq!(b.slot(0), &[1; 12]);
        assert_eq!(b.slot(1), &[2; 12]);
        assert_eq!(b.sample_ids, vec![7, 9]);
    }

    #[test]
    fn targets_of_selects_one_image() {
        let mut b = Batch::new(BatchShape::rgb(3, 1, 1), 4);
        for image in [0, 0, 2] {
            b.targets.push(Target { image, class: image, bbox: BoxXyxy::default() });
        }
        assert_eq!(b.targets_of(0).len(), 2);
        assert!(b.targets_of(1).is_empty());
        assert_eq!(b.targets_of(2)[0].class, 2);
    }

    #[test]
    fn reset_keeps_allocation() {
        let mut b = Batch::new(BatchShape::rgb(4, 8, 8), 16);
        b.push_slot(0).expect("slot");
        let ptr = b.slot(0).as_ptr();
        b.reset(BatchShape::rgb(4, 8, 8), 1);
        assert!(b.is_empty());
        assert_eq!(b.slot(0).as_ptr(), ptr);
        assert_eq!(b.index, 1);
    }

    #[test]
    fn reset_to_smaller_and_back_keeps_allocation() {
        let mut b = Batch::new(BatchShape::rgb(2, 12, 12), 4);
        let ptr = b.slot(0).as_ptr();
        for side in [4, 12, 8, 12] {
            b.reset(BatchShape::rgb(2, side, side), 0);
            let (_, slot) = b.push_slot(0).expect("slot");
            assert_eq!(slot.len(), 3 * side * side);
            assert_eq!(slot.as_ptr(), ptr, "side {side}");
        }
    }
}
