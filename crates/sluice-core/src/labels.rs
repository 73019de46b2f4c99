//! Sample ids, class ids, labels (ground truth) and detections (predictions).

use serde::{Deserialize, Serialize};

use crate::geometry::BoxXyxy;

/// A sample's stable id: its index in the dataset's sample index.
pub type SampleId = u64;

/// A contiguous class index `0..nc`.
pub type ClassId = u32;

/// One ground-truth object.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Label {
    /// Class index.
    pub class: ClassId,
    /// Box in pixels of the image it belongs to.
    pub bbox: BoxXyxy,
}

/// The labels of one image, with the image's size in pixels (after EXIF orientation).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ImageLabels {
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// The objects; empty for a background image.
    pub objects: Vec<Label>,
}

/// One predicted object.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Detection {
    /// Box in pixels.
    pub bbox: BoxXyxy,
    /// Confidence in `[0, 1]`.
    pub score: f32,
    /// Class index.
    pub class: ClassId,
}
