//! Augmentation hyperparameters, with Ultralytics' defaults and key names (`hsv_h`, `degrees`, `fliplr`, ...), so
//! the augmentation part of an Ultralytics `args.yaml` / `default.yaml` deserialises into [`Hyp`] as it is.

use serde::{Deserialize, Serialize};

use crate::error::{AugmentError, Result};

/// Augmentation hyperparameters. Missing keys take Ultralytics' defaults ([`Hyp::default`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Hyp {
    /// Hue gain: the hue shift is `U(-1, 1) * hsv_h` of the full circle (Ultralytics 0.015).
    pub hsv_h: f64,
    /// Saturation gain: saturation is multiplied by `1 + U(-1, 1) * hsv_s` (0.7).
    pub hsv_s: f64,
    /// Value gain: value is multiplied by `1 + U(-1, 1) * hsv_v` (0.4).
    pub hsv_v: f64,
    /// Rotation range in degrees, `U(-degrees, degrees)` (0).
    pub degrees: f64,
    /// Translation as a fraction of the output size, centre at `U(0.5 - t, 0.5 + t) * imgsz` (0.1).
    pub translate: f64,
    /// Scale gain, `U(1 - scale, 1 + scale)` (0.5).
    pub scale: f64,
    /// Shear range in degrees, per axis (0).
    pub shear: f64,
    /// Perspective coefficient range, per axis (0; typical 0..0.001).
    pub perspective: f64,
    /// Probability of an up-down flip (0).
    pub flipud: f64,
    /// Probability of a left-right flip (0.5).
    pub fliplr: f64,
    /// Probability of a 4-image mosaic (1.0).
    pub mosaic: f64,
    /// Probability of mixing in a second (mosaic + perspective) sample (0).
    pub mixup: f64,
    /// Number of final epochs trained without mosaic (and mixup), Ultralytics' `close_mosaic` (10).
    pub close_mosaic: u32,
}

impl Default for Hyp {
    fn default() -> Self {
        Self {
            hsv_h: 0.015,
            hsv_s: 0.7,
            hsv_v: 0.4,
            degrees: 0.0,
            translate: 0.1,
            scale: 0.5,
            shear: 0.0,
            perspective: 0.0,
            flipud: 0.0,
            fliplr: 0.5,
            mosaic: 1.0,
            mixup: 0.0,
            close_mosaic: 10,
        }
    }
}

impl Hyp {
    /// Checks every value's range; the error names the key.
    pub fn validate(&self) -> Result<()> {
        let checks: [(&'static str, f64, f64, f64); 12] = [
            ("hyp.hsv_h", self.hsv_h, 0.0, 1.0),
            ("hyp.hsv_s", self.hsv_s, 0.0, 1.0),
            ("hyp.hsv_v", self.hsv_v, 0.0, 1.0),
            ("hyp.degrees", self.degrees, 0.0, 180.0),
            ("hyp.translate", self.translate, 0.0, 0.5),
            ("hyp.scale", self.scale, 0.0, 0.99),
            ("hyp.shear", self.shear, 0.0, 89.0),
            ("hyp.perspective", self.perspective, 0.0, 0.01),
            ("hyp.flipud", self.flipud, 0.0, 1.0),
            ("hyp.fliplr", self.fliplr, 0.0, 1.0),
            ("hyp.mosaic", self.mosaic, 0.0, 1.0),
            ("hyp.mixup", self.mixup, 0.0, 1.0),
        ];
        for (what, v, lo, hi) in checks {
            if !(lo..=hi).contains(&v) {
                return Err(AugmentError::Config { what, reason: format!("{v} is outside [{lo}, {hi}]") });
            }
        }
        Ok(())
    }

    /// Whether mosaic (and mixup) are still on in `epoch` (0-based) of `epochs`. Ultralytics switches them off when
    /// `epoch == epochs - close_mosaic`, so with `close_mosaic > epochs` that epoch never comes and mosaic stays on
    /// for the whole run (a short run keeps mosaic); this reproduces that.
    pub fn mosaic_active(&self, epoch: u32, epochs: u32) -> bool {
        match epochs.checked_sub(self.close_mosaic) {
            Some(off_from) => epoch < off_from,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ultralytics_and_partial_yaml_keeps_them() {
        let h: Hyp = serde_json::from_str(r#"{"degrees": 10.0, "mixup": 0.1}"#).expect("parse");
        assert_eq!(h.degrees, 10.0);
        assert_eq!(h.mixup, 0.1);
        assert_eq!((h.hsv_h, h.hsv_s, h.hsv_v), (0.015, 0.7, 0.4));
        assert_eq!((h.translate, h.scale, h.fliplr, h.flipud, h.mosaic), (0.1, 0.5, 0.5, 0.0, 1.0));
        assert!(h.validate().is_ok());
        let bad = Hyp { scale: 1.5, ..Hyp::default() };
        let err = bad.validate().expect_err("out of range").to_string();
        assert!(err.contains("hyp.scale"), "{err}");
    }

    #[test]
    fn close_mosaic_switches_off_the_last_epochs() {
        let h = Hyp::default();
        assert!(h.mosaic_active(89, 100));
        assert!(!h.mosaic_active(90, 100));
        // Ultralytics never reaches `epoch == epochs - close_mosaic` when it is negative: mosaic stays on.
        assert!(h.mosaic_active(4, 5));
        assert!(!h.mosaic_active(0, 10));
    }
}
