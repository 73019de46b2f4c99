//! 3x3 projective matrices for the random perspective: how Ultralytics composes `M = T·S·R·P·C`, the inverse the
//! fused sampler gathers through, the forward box transform (4 corners → min/max) and the box-candidate filter.

use serde::{Deserialize, Serialize};
use sluice_core::BoxXyxy;

/// A row-major 3x3 matrix acting on column vectors `(x, y, 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mat3(pub [[f64; 3]; 3]);

impl Mat3 {
    /// The identity.
    pub const IDENTITY: Self = Self([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]);

    /// A translation by `(dx, dy)`.
    pub fn translation(dx: f64, dy: f64) -> Self {
        Self([[1.0, 0.0, dx], [0.0, 1.0, dy], [0.0, 0.0, 1.0]])
    }

    /// `self · rhs` (apply `rhs` first).
    pub fn mul(&self, rhs: &Self) -> Self {
        let (a, b) = (&self.0, &rhs.0);
        let mut out = [[0.0; 3]; 3];
        for (i, row) in out.iter_mut().enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = a[i][0] * b[0][j] + a[i][1] * b[1][j] + a[i][2] * b[2][j];
            }
        }
        Self(out)
    }

    /// The inverse, or `None` when the matrix is singular (or not finite).
    pub fn inverse(&self) -> Option<Self> {
        let m = &self.0;
        let c00 = m[1][1] * m[2][2] - m[1][2] * m[2][1];
        let c01 = m[1][2] * m[2][0] - m[1][0] * m[2][2];
        let c02 = m[1][0] * m[2][1] - m[1][1] * m[2][0];
        let det = m[0][0] * c00 + m[0][1] * c01 + m[0][2] * c02;
        if !det.is_finite() || det.abs() < 1e-12 {
            return None;
        }
        let inv = 1.0 / det;
        Some(Self([
            [c00 * inv, (m[0][2] * m[2][1] - m[0][1] * m[2][2]) * inv, (m[0][1] * m[1][2] - m[0][2] * m[1][1]) * inv],
            [c01 * inv, (m[0][0] * m[2][2] - m[0][2] * m[2][0]) * inv, (m[0][2] * m[1][0] - m[0][0] * m[1][2]) * inv],
            [c02 * inv, (m[0][1] * m[2][0] - m[0][0] * m[2][1]) * inv, (m[0][0] * m[1][1] - m[0][1] * m[1][0]) * inv],
        ]))
    }

    /// Maps a point, with the perspective divide.
    pub fn apply(&self, x: f64, y: f64) -> (f64, f64) {
        let m = &self.0;
        let w = m[2][0] * x + m[2][1] * y + m[2][2];
        ((m[0][0] * x + m[0][1] * y + m[0][2]) / w, (m[1][0] * x + m[1][1] * y + m[1][2]) / w)
    }

    /// Whether the last row is `(0, 0, 1)` (no perspective divide needed).
    pub fn is_affine(&self) -> bool {
        self.0[2] == [0.0, 0.0, 1.0]
    }
}

/// The random parameters of one perspective transform, as Ultralytics' `RandomPerspective.affine_transform` draws
/// them (angles in degrees, translation as a fraction of the output size).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PerspectiveParams {
    /// Perspective coefficient `P[2][0]` (x perspective, about y).
    pub perspective_x: f64,
    /// Perspective coefficient `P[2][1]` (y perspective, about x).
    pub perspective_y: f64,
    /// Rotation in degrees, counter-clockwise as displayed (OpenCV's `getRotationMatrix2D`).
    pub angle_deg: f64,
    /// Scale factor.
    pub scale: f64,
    /// x shear angle in degrees (`S[0][1] = tan`).
    pub shear_x_deg: f64,
    /// y shear angle in degrees (`S[1][0] = tan`).
    pub shear_y_deg: f64,
    /// Where the canvas centre lands, as a fraction of the output width (0.5 = centred).
    pub translate_x: f64,
    /// Where the canvas centre lands, as a fraction of the output height.
    pub translate_y: f64,
}

impl PerspectiveParams {
    /// No rotation, scale 1, centred: maps the canvas centre onto the output centre.
    pub const CENTRED: Self = Self {
        perspective_x: 0.0,
        perspective_y: 0.0,
        angle_deg: 0.0,
        scale: 1.0,
        shear_x_deg: 0.0,
        shear_y_deg: 0.0,
        translate_x: 0.5,
        translate_y: 0.5,
    };

    /// `M = T · S · R · P · C`: canvas pixel → output pixel, for a `canvas_w x canvas_h` canvas and an
    /// `out_w x out_h` output (Ultralytics: `C` centres the canvas, `T` translates by `translate * out_size`).
    pub fn matrix(&self, canvas_w: f64, canvas_h: f64, out_w: f64, out_h: f64) -> Mat3 {
        let c = Mat3::translation(-canvas_w / 2.0, -canvas_h / 2.0);
        let p = Mat3([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [self.perspective_x, self.perspective_y, 1.0]]);
        let (sin, cos) = self.angle_deg.to_radians().sin_cos();
        let (a, b) = (self.scale * cos, self.scale * sin);
        let r = Mat3([[a, b, 0.0], [-b, a, 0.0], [0.0, 0.0, 1.0]]);
        let s = Mat3([
            [1.0, self.shear_x_deg.to_radians().tan(), 0.0],
            [self.shear_y_deg.to_radians().tan(), 1.0, 0.0],
            [0.0, 0.0, 1.0],
        ]);
        let t = Mat3::translation(self.translate_x * out_w, self.translate_y * out_h);
        t.mul(&s).mul(&r).mul(&p).mul(&c)
    }
}

/// Maps a box through `m` the way Ultralytics does: its 4 corners, then their min/max.
pub fn transform_box(m: &Mat3, b: &BoxXyxy) -> BoxXyxy {
    let corners = [(b.x1, b.y1), (b.x2, b.y2), (b.x1, b.y2), (b.x2, b.y1)];
    let (mut x1, mut y1, mut x2, mut y2) = (f64::INFINITY, f64::INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY);
    for (x, y) in corners {
        let (u, v) = m.apply(f64::from(x), f64::from(y));
        x1 = x1.min(u);
        y1 = y1.min(v);
        x2 = x2.max(u);
        y2 = y2.max(v);
    }
    BoxXyxy::new(x1 as f32, y1 as f32, x2 as f32, y2 as f32)
}

/// Ultralytics' `box_candidates` with its defaults (`wh_thr 2, ar_thr 100, area_thr 0.1`): keeps a transformed box
/// `after` when both sides exceed 2 px, its aspect ratio stays under 100 and it keeps over 10% of the area of
/// `before` (the box before the transform, already multiplied by the transform's scale).
pub fn box_candidate(before: &BoxXyxy, after: &BoxXyxy) -> bool {
    const WH_THR: f32 = 2.0;
    const AR_THR: f32 = 100.0;
    const AREA_THR: f32 = 0.1;
    const EPS: f32 = 1e-16;
    let (w1, h1) = (before.width(), before.height());
    let (w2, h2) = (after.width(), after.height());
    let ar = (w2 / (h2 + EPS)).max(h2 / (w2 + EPS));
    w2 > WH_THR && h2 > WH_THR && w2 * h2 / (w1 * h1 + EPS) > AREA_THR && ar < AR_THR
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centred_params_map_canvas_centre_to_output_centre() {
        let m = PerspectiveParams::CENTRED.matrix(1280.0, 1280.0, 640.0, 640.0);
        assert_eq!(m.apply(640.0, 640.0), (320.0, 320.0));
        assert_eq!(m.apply(0.0, 0.0), (-320.0, -320.0));
    }

    #[test]
    fn rotation_follows_opencv_sign() {
        // getRotationMatrix2D(angle=90, centre 0, scale 1) = [[0, 1], [-1, 0]]: (1, 0) -> (0, -1).
        let p = PerspectiveParams { angle_deg: 90.0, translate_x: 0.0, translate_y: 0.0, ..PerspectiveParams::CENTRED };
        let m = p.matrix(0.0, 0.0, 100.0, 100.0);
        let (x, y) = m.apply(1.0, 0.0);
        assert!(x.abs() < 1e-12 && (y + 1.0).abs() < 1e-12, "{x} {y}");
    }

    #[test]
    fn inverse_round_trips_with_perspective() {
        let p = PerspectiveParams {
            perspective_x: 4e-4,
            perspective_y: -3e-4,
            angle_deg: 17.0,
            scale: 1.3,
            shear_x_deg: 5.0,
            shear_y_deg: -2.0,
            translate_x: 0.42,
            translate_y: 0.57,
        };
        let m = p.matrix(1280.0, 1280.0, 640.0, 640.0);
        let inv = m.inverse().expect("invertible");
        for (x, y) in [(0.0, 0.0), (100.5, 700.25), (1279.0, 3.0)] {
            let (u, v) = m.apply(x, y);
            let (a, b) = inv.apply(u, v);
            assert!((a - x).abs() < 1e-9 && (b - y).abs() < 1e-9);
        }
        assert!(Mat3([[0.0; 3]; 3]).inverse().is_none());
    }

    #[test]
    fn box_candidates_thresholds() {
        let before = BoxXyxy::new(0.0, 0.0, 10.0, 10.0);
        assert!(box_candidate(&before, &BoxXyxy::new(0.0, 0.0, 10.0, 10.0)));
        // Too thin (<= 2 px).
        assert!(!box_candidate(&before, &BoxXyxy::new(0.0, 0.0, 2.0, 10.0)));
        // Area 9% of the original.
        assert!(!box_candidate(&before, &BoxXyxy::new(0.0, 0.0, 3.0, 3.0)));
        // Aspect ratio 100.
        let long = BoxXyxy::new(0.0, 0.0, 1000.0, 1000.0);
        assert!(!box_candidate(&long, &BoxXyxy::new(0.0, 0.0, 1000.0, 10.0)));
        assert!(box_candidate(&long, &BoxXyxy::new(0.0, 0.0, 1000.0, 200.0)));
    }

    #[test]
    fn transform_box_takes_corner_extremes() {
        let p = PerspectiveParams { angle_deg: 45.0, translate_x: 0.0, translate_y: 0.0, ..PerspectiveParams::CENTRED };
        let m = p.matrix(0.0, 0.0, 1.0, 1.0);
        let b = transform_box(&m, &BoxXyxy::new(-1.0, -1.0, 1.0, 1.0));
        let r = 2f32.sqrt();
        assert!((b.x1 + r).abs() < 1e-5 && (b.x2 - r).abs() < 1e-5 && (b.y1 + r).abs() < 1e-5);
    }
}
