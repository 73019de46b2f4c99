//! Axis-aligned boxes in pixel `xyxy` coordinates (f32), the one box representation between stages.

use serde::{Deserialize, Serialize};

/// An axis-aligned box `(x1, y1, x2, y2)` in pixels, `x1 <= x2`, `y1 <= y2` when valid.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct BoxXyxy {
    /// Left edge.
    pub x1: f32,
    /// Top edge.
    pub y1: f32,
    /// Right edge.
    pub x2: f32,
    /// Bottom edge.
    pub y2: f32,
}

impl BoxXyxy {
    /// A box from its corners.
    pub const fn new(x1: f32, y1: f32, x2: f32, y2: f32) -> Self {
        Self { x1, y1, x2, y2 }
    }

    /// A box from centre, width and height.
    pub fn from_cxcywh(cx: f32, cy: f32, w: f32, h: f32) -> Self {
        Self::new(cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0)
    }

    /// A box from top-left corner, width and height (COCO's `bbox`).
    pub fn from_xywh(x: f32, y: f32, w: f32, h: f32) -> Self {
        Self::new(x, y, x + w, y + h)
    }

    /// `(cx, cy, w, h)`.
    pub fn to_cxcywh(&self) -> [f32; 4] {
        [(self.x1 + self.x2) / 2.0, (self.y1 + self.y2) / 2.0, self.width(), self.height()]
    }

    /// Width (may be negative for an invalid box).
    pub fn width(&self) -> f32 {
        self.x2 - self.x1
    }

    /// Height (may be negative for an invalid box).
    pub fn height(&self) -> f32 {
        self.y2 - self.y1
    }

    /// Area, zero for an empty or inverted box.
    pub fn area(&self) -> f32 {
        self.width().max(0.0) * self.height().max(0.0)
    }

    /// Whether every coordinate is finite.
    pub fn is_finite(&self) -> bool {
        self.x1.is_finite() && self.y1.is_finite() && self.x2.is_finite() && self.y2.is_finite()
    }

    /// The intersection area with `other`.
    pub fn intersection(&self, other: &Self) -> f32 {
        let w = (self.x2.min(other.x2) - self.x1.max(other.x1)).max(0.0);
        let h = (self.y2.min(other.y2) - self.y1.max(other.y1)).max(0.0);
        w * h
    }

    /// Intersection over union; 0 when both are empty.
    pub fn iou(&self, other: &Self) -> f32 {
        let inter = self.intersection(other);
        let union = self.area() + other.area() - inter;
        if union > 0.0 { inter / union } else { 0.0 }
    }

    /// The box clipped to `[0, width] x [0, height]`.
    pub fn clip(&self, width: f32, height: f32) -> Self {
        Self::new(
            self.x1.clamp(0.0, width),
            self.y1.clamp(0.0, height),
            self.x2.clamp(0.0, width),
            self.y2.clamp(0.0, height),
        )
    }

    /// The box scaled by `(sx, sy)` then shifted by `(dx, dy)`.
    pub fn scale_shift(&self, sx: f32, sy: f32, dx: f32, dy: f32) -> Self {
        Self::new(self.x1 * sx + dx, self.y1 * sy + dy, self.x2 * sx + dx, self.y2 * sy + dy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_round_trip() {
        let b = BoxXyxy::from_cxcywh(10.0, 20.0, 4.0, 6.0);
        assert_eq!(b, BoxXyxy::new(8.0, 17.0, 12.0, 23.0));
        assert_eq!(b.to_cxcywh(), [10.0, 20.0, 4.0, 6.0]);
        assert_eq!(BoxXyxy::from_xywh(8.0, 17.0, 4.0, 6.0), b);
    }

    #[test]
    fn iou_of_known_boxes() {
        let a = BoxXyxy::new(0.0, 0.0, 2.0, 2.0);
        let b = BoxXyxy::new(1.0, 1.0, 3.0, 3.0);
        assert!((a.iou(&b) - 1.0 / 7.0).abs() < 1e-7);
        assert_eq!(a.iou(&BoxXyxy::new(5.0, 5.0, 6.0, 6.0)), 0.0);
        assert_eq!(BoxXyxy::default().iou(&BoxXyxy::default()), 0.0);
    }

    #[test]
    fn clip_and_area() {
        let b = BoxXyxy::new(-5.0, 2.0, 15.0, 30.0).clip(10.0, 20.0);
        assert_eq!(b, BoxXyxy::new(0.0, 2.0, 10.0, 20.0));
        assert_eq!(b.area(), 180.0);
        assert_eq!(BoxXyxy::new(3.0, 3.0, 1.0, 1.0).area(), 0.0);
    }
}
