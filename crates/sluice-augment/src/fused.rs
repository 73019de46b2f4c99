//! The fused training sample: mosaic-4 (or letterbox) + random perspective + optional mixup + HSV + flips in one
//! pass. Each output pixel is mapped once through the inverse transform (flips folded in) onto the described
//! canvas, sampled bilinearly from the source tile that owns that position (grey 114 outside every tile), blended
//! with the mixup partner, passed through the HSV lookup tables and written straight into the batch's CHW u8 slot.
//! No `2 imgsz` canvas, resized tile or intermediate image is ever allocated.
//!
//! Where this differs from Ultralytics' separate passes (resize each tile → paste into the canvas → `warpAffine`
//! → HSV → flip): the source is sampled directly (one bilinear interpolation instead of two, so slightly sharper,
//! and without `warpAffine`'s 1/32-pixel position quantisation), and at a tile's edge the sample does not blend
//! with the neighbouring tile or the grey border over the last half pixel. Boxes follow Ultralytics exactly:
//! tile placement, canvas clip (mosaic), the forward transform of the 4 corners, min/max, clip to the output,
//! `box_candidates`, flips.
//!
//! Multi-scale: Ultralytics augments at `imgsz`, then resizes the whole batch to the drawn size (bilinear,
//! `align_corners=False`). Here the output pixel → `imgsz` pixel map of that resize, `x = (x' + 0.5) r - 0.5` with
//! `r = imgsz / size`, is folded into the inverse transform, so the sample is gathered straight at the drawn size
//! (still one interpolation, where Ultralytics' path makes three; when shrinking, a single bilinear tap instead of
//! two in a row, so slightly more aliasing). The boxes are Ultralytics' `imgsz` boxes (same clip and candidate
//! filter) scaled by `size / imgsz`: its targets are normalised, so its resize scales them the same way.

use sluice_core::{BoxXyxy, Label, SourceImage};

use crate::affine::{Mat3, box_candidate, transform_box};
use crate::canvas::{Canvas, flip_box};
use crate::error::{AugmentError, Result};
use crate::hsv::HsvLut;
use crate::recipe::{Geometry, TrainRecipe};

/// One geometry ready to sample: its canvas and the output → canvas map.
#[derive(Debug, Clone, Copy)]
struct Warp<'a> {
    canvas: Canvas<'a>,
    /// Canvas → output (before flips), for boxes.
    forward: Mat3,
    /// Output pixel → canvas position (flips folded in), single precision for the pixel loop.
    inverse: [[f32; 3]; 3],
    affine: bool,
    /// The perspective's scale (for `box_candidates`).
    scale: f32,
}

impl<'a> Warp<'a> {
    /// `post` maps output pixels to the `imgsz` frame before the flips (identity without multi-scale).
    fn new(geometry: &Geometry, imgsz: u32, images: &[&'a SourceImage], flip: &Mat3, post: &Mat3) -> Result<Self> {
        let canvas = Canvas::new(&geometry.layout, imgsz, images)?;
        let s = f64::from(imgsz);
        let forward = geometry.perspective.matrix(f64::from(canvas.width), f64::from(canvas.height), s, s);
        let inv = forward.inverse().ok_or_else(|| AugmentError::Config {
            what: "recipe perspective",
            reason: format!("sample {}: singular transform {:?}", geometry.layout.ids()[0], geometry.perspective),
        })?;
        let total = inv.mul(flip).mul(post);
        let inverse = total.0.map(|row| row.map(|v| v as f32));
        Ok(Self { canvas, forward, inverse, affine: total.is_affine(), scale: geometry.perspective.scale as f32 })
    }

    /// The colour of output pixel `(x, y)` (before HSV).
    #[inline(always)]
    fn pixel(&self, x: f32, y: f32) -> [u8; 3] {
        let m = &self.inverse;
        let (mut cx, mut cy) = (m[0][0] * x + m[0][1] * y + m[0][2], m[1][0] * x + m[1][1] * y + m[1][2]);
        if !self.affine {
            let w = m[2][0] * x + m[2][1] * y + m[2][2];
            cx /= w;
            cy /= w;
        }
        self.canvas.gather(cx, cy)
    }

    /// Labels after the transform: Ultralytics' `apply_bboxes`, clip, `box_candidates`, then the flips.
    fn labels(&self, imgsz: f32, lr: bool, ud: bool, f: &mut impl FnMut(Label)) {
        self.canvas.labels(|l| {
            let after = transform_box(&self.forward, &l.bbox).clip(imgsz, imgsz);
            let before = l.bbox.scale_shift(self.scale, self.scale, 0.0, 0.0);
            if after.is_finite() && box_candidate(&before, &after) {
                f(Label { class: l.class, bbox: flip_box(&after, imgsz, imgsz, lr, ud) });
            }
        });
    }
}

/// A training recipe bound to its source images, ready to render. Build it, [`render`](Self::render) the pixels
/// into a slot, then take the [`labels`](Self::labels): the two steps borrow different parts of a batch.
#[derive(Debug, Clone)]
pub struct TrainPlan<'a> {
    imgsz: u32,
    size: u32,
    main: Warp<'a>,
    mix: Option<(Warp<'a>, f32)>,
    hsv: Option<HsvLut>,
    flip_lr: bool,
    flip_ud: bool,
}

impl<'a> TrainPlan<'a> {
    /// Binds `recipe` to the decoded images of its layout (`images`, in [`crate::Layout::ids`] order) and of its
    /// mixup partner's layout (`mix_images`, empty without mixup).
    pub fn new(recipe: &TrainRecipe, images: &[&'a SourceImage], mix_images: &[&'a SourceImage]) -> Result<Self> {
        let s = f64::from(recipe.imgsz);
        if recipe.imgsz == 0 || recipe.size == 0 {
            return Err(AugmentError::Config {
                what: "recipe imgsz",
                reason: format!("sample {}: size 0 (imgsz {}, output {})", recipe.id(), recipe.imgsz, recipe.size),
            });
        }
        // Output pixel -> pre-flip pixel (the flips act on the final image, pixel i -> imgsz - 1 - i).
        let mut flip = Mat3::IDENTITY;
        if recipe.flip_lr {
            flip.0[0] = [-1.0, 0.0, s - 1.0];
        }
        if recipe.flip_ud {
            flip.0[1] = [0.0, -1.0, s - 1.0];
        }
        // Output pixel -> `imgsz` pixel: the inverse of a bilinear resize with `align_corners=False`.
        let post = if recipe.size == recipe.imgsz {
            Mat3::IDENTITY
        } else {
            let r = s / f64::from(recipe.size);
            let t = 0.5 * r - 0.5;
            Mat3([[r, 0.0, t], [0.0, r, t], [0.0, 0.0, 1.0]])
        };
        let main = Warp::new(&recipe.geometry, recipe.imgsz, images, &flip, &post)?;
        let mix = match &recipe.mixup {
            Some(m) => Some((Warp::new(&m.geometry, recipe.imgsz, mix_images, &flip, &post)?, m.ratio)),
            None => None,
        };
        Ok(Self {
            imgsz: recipe.imgsz,
            size: recipe.size,
            main,
            mix,
            hsv: recipe.hsv.map(HsvLut::new),
            flip_lr: recipe.flip_lr,
            flip_ud: recipe.flip_ud,
        })
    }

    /// Bytes of the CHW slot this plan fills (`3 * size * size`, the recipe's output side).
    pub fn slot_len(&self) -> usize {
        3 * self.size as usize * self.size as usize
    }

    /// Writes the sample into `out`, a CHW u8 slot of [`Self::slot_len`] bytes.
    pub fn render(&self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.slot_len() {
            return Err(AugmentError::Config {
                what: "slot length",
                reason: format!("{} bytes for a {}x{} RGB sample", out.len(), self.size, self.size),
            });
        }
        match (&self.mix, &self.hsv) {
            (None, None) => self.render_with(out, |x, y| self.main.pixel(x, y)),
            (None, Some(lut)) => self.render_with(out, |x, y| lut.apply(self.main.pixel(x, y))),
            (Some((mix, r)), hsv) => self.render_with(out, |x, y| {
                let (a, b) = (self.main.pixel(x, y), mix.pixel(x, y));
                let px = std::array::from_fn(|c| (f32::from(a[c]) * r + f32::from(b[c]) * (1.0 - r)) as u8);
                match hsv {
                    Some(lut) => lut.apply(px),
                    None => px,
                }
            }),
        }
        Ok(())
    }

    #[inline(always)]
    fn render_with(&self, out: &mut [u8], px: impl Fn(f32, f32) -> [u8; 3]) {
        let n = self.size as usize;
        let plane = n * n;
        let (rp, rest) = out.split_at_mut(plane);
        let (gp, bp) = rest.split_at_mut(plane);
        for ((r_row, g_row), (b_row, y)) in
            rp.chunks_exact_mut(n).zip(gp.chunks_exact_mut(n)).zip(bp.chunks_exact_mut(n).zip(0..))
        {
            let yf = y as f32;
            for (x, ((r, g), b)) in r_row.iter_mut().zip(g_row.iter_mut()).zip(b_row.iter_mut()).enumerate() {
                let [pr, pg, pb] = px(x as f32, yf);
                *r = pr;
                *g = pg;
                *b = pb;
            }
        }
    }

    /// The sample's labels in output pixels (the main image's first, then the mixup partner's).
    pub fn labels(&self, mut f: impl FnMut(Label)) {
        let s = self.imgsz as f32;
        let mut out = |l: Label| f(self.to_output(l));
        self.main.labels(s, self.flip_lr, self.flip_ud, &mut out);
        if let Some((mix, _)) = &self.mix {
            mix.labels(s, self.flip_lr, self.flip_ud, &mut out);
        }
    }

    /// An `imgsz` label scaled to the output side (and clipped to it, against rounding).
    fn to_output(&self, l: Label) -> Label {
        if self.size == self.imgsz {
            return l;
        }
        let (n, s) = (self.size as f32, self.imgsz as f32);
        let b = l.bbox;
        let bbox = BoxXyxy::new(b.x1 * n / s, b.y1 * n / s, b.x2 * n / s, b.y2 * n / s).clip(n, n);
        Label { bbox, ..l }
    }
}
