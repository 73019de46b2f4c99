//! YOLOv8 scales (depth, width, max channels from Ultralytics' `yolov8.yaml`) and the channel arithmetic.

use crate::error::{ModelError, Result};

/// One of the five YOLOv8 scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scale {
    /// yolov8n: depth 0.33, width 0.25, max channels 1024.
    N,
    /// yolov8s: depth 0.33, width 0.50, max channels 1024.
    S,
    /// yolov8m: depth 0.67, width 0.75, max channels 768.
    M,
    /// yolov8l: depth 1.00, width 1.00, max channels 512.
    L,
    /// yolov8x: depth 1.00, width 1.25, max channels 512.
    X,
}

impl Scale {
    /// `(depth, width, max_channels)` as in `yolov8.yaml`.
    pub fn multipliers(self) -> (f64, f64, usize) {
        match self {
            Scale::N => (0.33, 0.25, 1024),
            Scale::S => (0.33, 0.50, 1024),
            Scale::M => (0.67, 0.75, 768),
            Scale::L => (1.00, 1.00, 512),
            Scale::X => (1.00, 1.25, 512),
        }
    }

    /// Parses `n`, `yolov8n`, `N`, … .
    pub fn parse(name: &str) -> Result<Self> {
        let lower = name.to_ascii_lowercase();
        let s = lower.strip_prefix("yolov8").unwrap_or(&lower);
        match s {
            "n" => Ok(Scale::N),
            "s" => Ok(Scale::S),
            "m" => Ok(Scale::M),
            "l" => Ok(Scale::L),
            "x" => Ok(Scale::X),
            _ => Err(ModelError::UnknownModel(name.to_string())),
        }
    }

    /// The letter of the scale (`n`, `s`, …).
    pub fn letter(self) -> char {
        match self {
            Scale::N => 'n',
            Scale::S => 's',
            Scale::M => 'm',
            Scale::L => 'l',
            Scale::X => 'x',
        }
    }
}

/// Architecture of one YOLOv8 detection model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YoloConfig {
    /// The scale.
    pub scale: Scale,
    /// Number of classes.
    pub nc: usize,
}

/// DFL bins per box side.
pub const REG_MAX: usize = 16;
/// Strides of the three detection levels P3, P4, P5.
pub const STRIDES: [usize; 3] = [8, 16, 32];

impl YoloConfig {
    /// A configuration.
    pub fn new(scale: Scale, nc: usize) -> Self {
        Self { scale, nc }
    }

    /// Output channels of a layer whose yaml row asks for `c` (Ultralytics `make_divisible(min(c, max) * width, 8)`).
    pub fn ch(&self, c: usize) -> usize {
        let (_, width, max_ch) = self.scale.multipliers();
        let x = c.min(max_ch) as f64 * width;
        ((x / 8.0).ceil() as usize) * 8
    }

    /// Repeats of a block whose yaml row asks for `n` (Ultralytics `max(round(n * depth), 1)`).
    pub fn depth(&self, n: usize) -> usize {
        let (depth, _, _) = self.scale.multipliers();
        if n > 1 { ((n as f64 * depth).round() as usize).max(1) } else { n }
    }

    /// Input channels of the Detect head (outputs of layers 15, 18, 21).
    pub fn head_channels(&self) -> [usize; 3] {
        [self.ch(256), self.ch(512), self.ch(1024)]
    }

    /// Hidden channels of the box branch: `max(16, ch[0] / 4, 4 * reg_max)`.
    pub fn box_hidden(&self) -> usize {
        16.max(self.head_channels()[0] / 4).max(4 * REG_MAX)
    }

    /// Hidden channels of the legacy class branch: `max(ch[0], min(nc, 100))`.
    pub fn cls_hidden(&self) -> usize {
        self.head_channels()[0].max(self.nc.min(100))
    }

    /// Number of anchors for a square input of side `imgsz`.
    pub fn num_anchors(imgsz_h: usize, imgsz_w: usize) -> usize {
        STRIDES.iter().map(|s| (imgsz_h / s) * (imgsz_w / s)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yolov8n_channels_match_the_fixture_shapes() {
        let c = YoloConfig::new(Scale::N, 80);
        assert_eq!(c.head_channels(), [64, 128, 256]);
        assert_eq!(c.depth(3), 1);
        assert_eq!(c.depth(6), 2);
        assert_eq!(c.box_hidden(), 64);
        assert_eq!(c.cls_hidden(), 80);
    }

    #[test]
    fn other_scales_follow_the_yaml() {
        assert_eq!(YoloConfig::new(Scale::M, 80).ch(1024), 576);
        assert_eq!(YoloConfig::new(Scale::X, 80).ch(1024), 640);
        assert_eq!(YoloConfig::new(Scale::L, 80).ch(1024), 512);
        assert_eq!(YoloConfig::new(Scale::M, 80).depth(3), 2);
        assert_eq!(YoloConfig::new(Scale::X, 80).box_hidden(), 80);
        assert_eq!(Scale::parse("yolov8s").ok(), Some(Scale::S));
        assert!(Scale::parse("yolov9").is_err());
    }
}
