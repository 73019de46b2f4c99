//! The fused training sample: mosaic-4 (or letterbox) + random perspective + optional mixup + HSV + flips in one
//! pass. Each output pixel is mapped once through the inverse transform (flips folded in) onto the described
//! canvas, sampled bilinearly from the source tile that owns that position (grey 114 outside every tile), blended
//! with the mixup partner, passed through the HSV lookup tables and written straight into the batch's CHW u8 slot.
//! No `2 imgsz` canvas, resized tile or intermediate image is ever allocated.
//!
//! Two ways through the same definition, byte for byte. Affine recipes (Ultralytics' defaults: no perspective)
//! take the row path: along an output row the canvas position is affine in `x`, so the row splits into a few
//! spans that each lie in one tile or in the grey (located exactly, by the same comparisons the per-pixel test
//! makes), and a tile's span is sampled in runs — source positions, then a vertical pass over the two source rows,
//! then the horizontal taps — with HSV applied afterwards over the channel rows of each stretch of adjacent tile
//! spans (a mixup partner's row is rendered the same way and blended in first). Perspective recipes take the
//! generic per-pixel path, the definition the row path is tested against. On x86-64 CPUs with AVX2 the row path
//! runs as an AVX2 build of the same code, chosen at run time (the binary itself targets baseline x86-64): the
//! same bytes, wider vectors.
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

use std::ops::Range;

use sluice_core::{BoxXyxy, Label, SampleId, SourceImage};

use crate::affine::{Mat3, box_candidate, transform_box};
use crate::canvas::{Canvas, MAX_SPANS, RowMap, flip_box};
use crate::error::{AugmentError, Result};
use crate::hsv::HsvLut;
use crate::letterbox::FILL;
use crate::recipe::{Geometry, TrainRecipe};
use crate::resample::RunScratch;

/// Widest output the row path blends a mixup partner at (its row buffer lives on the stack); wider mixup samples
/// take the per-pixel path.
const MIX_ROW: usize = 2048;

/// One geometry ready to sample: its canvas and the output → canvas map.
#[derive(Debug, Clone, Copy)]
struct Warp<'a> {
    canvas: Canvas<'a>,
    /// Canvas → output (before flips), for boxes.
    forward: Mat3,
    /// Output pixel → canvas position (flips folded in), single precision for the pixel loop.
    inverse: [[f32; 3]; 3],
    affine: bool,
    /// Affine with coefficients small enough that no row position overflows: [`TrainPlan::render`] takes the
    /// row path.
    rows: bool,
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
        // On the single-precision matrix: a last row that rounds to exactly (0, 0, 1) makes the perspective
        // divisor exactly 1, so skipping the division changes no pixel (a rotation leaves it within a rounding
        // error of (0, 0, 1) in double precision).
        let affine = inverse[2] == [0.0, 0.0, 1.0];
        // |m| <= 1e20 keeps every `m x + m y + m` of a pixel (x, y < 2^32) finite: no NaN breaks the monotonicity
        // the spans rely on.
        let rows = affine && inverse[..2].iter().flatten().all(|v| v.abs() <= 1e20);
        Ok(Self { canvas, forward, inverse, affine, rows, scale: geometry.perspective.scale as f32 })
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

    /// Renders output row `row` (this warp's row map) into the channel rows `rgb`: tile spans sampled, then
    /// mapped through `hsv` when given (once per stretch of adjacent tile spans); grey spans set to `fill`.
    #[inline(always)]
    fn render_row(
        &self,
        row: &RowMap,
        spans: &mut [(usize, usize, Option<usize>); MAX_SPANS],
        scratch: &mut RunScratch,
        [r_row, g_row, b_row]: [&mut [u8]; 3],
        fill: [u8; 3],
        hsv: Option<&HsvLut>,
    ) {
        let k = self.canvas.spans(row, r_row.len(), spans);
        // HSV runs once over each stretch of adjacent tile spans (the spans cover the row in order), not span by
        // span: `apply_planes` pads its last partial run, so fewer calls waste less.
        let mut tiles_from = None;
        for &(a, e, owner) in &spans[..k] {
            match owner {
                None => {
                    if let (Some(lut), Some(t)) = (hsv, tiles_from.take()) {
                        lut.apply_planes(&mut r_row[t..a], &mut g_row[t..a], &mut b_row[t..a]);
                    }
                    r_row[a..e].fill(fill[0]);
                    g_row[a..e].fill(fill[1]);
                    b_row[a..e].fill(fill[2]);
                }
                Some(q) => {
                    let (r, g, b) = (&mut r_row[a..e], &mut g_row[a..e], &mut b_row[a..e]);
                    self.canvas.render_span(q, row, a, scratch, r, g, b);
                    tiles_from.get_or_insert(a);
                }
            }
        }
        if let (Some(lut), Some(t)) = (hsv, tiles_from) {
            let e = spans[..k].last().map_or(t, |s| s.1);
            lut.apply_planes(&mut r_row[t..e], &mut g_row[t..e], &mut b_row[t..e]);
        }
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

/// The warps of `recipe` (its layout, and its mixup partner's with the blend ratio) over their source images.
fn warps<'a>(
    recipe: &TrainRecipe,
    images: &[&'a SourceImage],
    mix_images: &[&'a SourceImage],
) -> Result<(Warp<'a>, Option<(Warp<'a>, f32)>)> {
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
    Ok((main, mix))
}

impl<'a> TrainPlan<'a> {
    /// Binds `recipe` to the decoded images of its layout (`images`, in [`crate::Layout::ids`] order) and of its
    /// mixup partner's layout (`mix_images`, empty without mixup).
    pub fn new(recipe: &TrainRecipe, images: &[&'a SourceImage], mix_images: &[&'a SourceImage]) -> Result<Self> {
        let (main, mix) = warps(recipe, images, mix_images)?;
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

    /// Reports through `f` the rows of each source image that rendering `recipe` reads, as `(id, rows)` (an image
    /// that appears twice in a layout is reported twice), without rendering: a superset of the rows
    /// [`Self::render`] touches, found from the inverse transform's corners. Arguments as for [`Self::new`].
    pub fn source_rows(
        recipe: &TrainRecipe,
        images: &[&SourceImage],
        mix_images: &[&SourceImage],
        f: &mut dyn FnMut(SampleId, Range<u32>),
    ) -> Result<()> {
        let (main, mix) = warps(recipe, images, mix_images)?;
        for w in std::iter::once(&main).chain(mix.as_ref().map(|(w, _)| w)) {
            w.canvas.source_rows(&w.inverse, w.affine, recipe.size, f);
        }
        Ok(())
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
        let mix_rows = match &self.mix {
            None => true,
            Some((mix, _)) => mix.rows && self.size as usize <= MIX_ROW,
        };
        if self.main.rows && mix_rows && self.size < 1 << 24 {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                unsafe { self.render_rows_avx2(out) };
                return Ok(());
            }
            self.render_rows(out);
        } else {
            self.render_pixels(out);
        }
        Ok(())
    }

    /// The row path (affine geometries): each output row is split into spans of one owning tile or of grey
    /// ([`Canvas::spans`]); a tile's span is sampled in runs without the per-pixel ownership test and grey spans
    /// are filled. Without mixup HSV runs over each stretch of adjacent tile spans and grey spans get the
    /// HSV-mapped grey; with mixup the partner's row is rendered the same way into a row buffer, blended in, and
    /// HSV runs over the whole row. Byte-identical to [`Self::render_pixels`].
    #[inline(always)]
    fn render_rows(&self, out: &mut [u8]) {
        let n = self.size as usize;
        let plane = n * n;
        let (rp, rest) = out.split_at_mut(plane);
        let (gp, bp) = rest.split_at_mut(plane);
        let mut spans = [(0, 0, None); MAX_SPANS];
        let mut scratch = RunScratch::new();
        let rows = rp.chunks_exact_mut(n).zip(gp.chunks_exact_mut(n)).zip(bp.chunks_exact_mut(n).zip(0..));
        match &self.mix {
            None => {
                let fill = match &self.hsv {
                    Some(lut) => lut.apply([FILL; 3]),
                    None => [FILL; 3],
                };
                for ((r, g), (b, y)) in rows {
                    let row = RowMap::new(&self.main.inverse, y as f32);
                    let rgb = [r, g, b];
                    self.main.render_row(&row, &mut spans, &mut scratch, rgb, fill, self.hsv.as_ref());
                }
            }
            Some((mix, ratio)) => {
                let mut partner = [[0u8; MIX_ROW]; 3];
                for ((r, g), (b, y)) in rows {
                    let [pr, pg, pb] = &mut partner;
                    let (pr, pg, pb) = (&mut pr[..n], &mut pg[..n], &mut pb[..n]);
                    let row = RowMap::new(&self.main.inverse, y as f32);
                    self.main.render_row(&row, &mut spans, &mut scratch, [&mut *r, &mut *g, &mut *b], [FILL; 3], None);
                    let row = RowMap::new(&mix.inverse, y as f32);
                    mix.render_row(&row, &mut spans, &mut scratch, [&mut *pr, &mut *pg, &mut *pb], [FILL; 3], None);
                    // The per-pixel path's blend, channel by channel.
                    for (a, b) in [(&mut *r, &*pr), (&mut *g, &*pg), (&mut *b, &*pb)] {
                        for (a, &b) in a.iter_mut().zip(b) {
                            *a = (f32::from(*a) * ratio + f32::from(b) * (1.0 - ratio)) as u8;
                        }
                    }
                    if let Some(lut) = &self.hsv {
                        lut.apply_planes(r, g, b);
                    }
                }
            }
        }
    }

    /// [`Self::render_rows`] compiled for AVX2 (everything it calls in the pixel loops is `inline(always)`, so the
    /// staged loops vectorise 8 floats / 32 bytes wide instead of baseline x86-64's 4 / 16). Rust's float and
    /// integer semantics do not depend on the target features (no fused multiply-add is ever formed), so the
    /// bytes are those of the baseline build; the equivalence tests run this path where the CPU has AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn render_rows_avx2(&self, out: &mut [u8]) {
        self.render_rows(out);
    }

    /// The generic path: every output pixel through [`Warp::pixel`] (ownership test per pixel), mixup and
    /// perspective included.
    fn render_pixels(&self, out: &mut [u8]) {
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

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use sluice_core::{ImageLabels, ImageRgb8};

    use super::*;
    use crate::hyp::Hyp;
    use crate::recipe::RecipeSampler;

    /// Random pixels (some rows padded past `3 w`, as a decoder's stride may be), in runs so neighbours repeat.
    fn noise(w: u32, h: u32, rng: &mut ChaCha8Rng) -> SourceImage {
        let stride = w as usize * 3 + if rng.random::<bool>() { 5 } else { 0 };
        let mut data = vec![0u8; stride * h as usize];
        let mut v = [0u8; 3];
        for (i, b) in data.iter_mut().enumerate() {
            if i % 3 == 0 && rng.random::<u8>() < 100 {
                v = rng.random();
            }
            *b = v[i % 3];
        }
        let image = ImageRgb8::from_raw(w, h, stride, data).expect("image");
        SourceImage { image, labels: ImageLabels { width: w, height: h, objects: Vec::new() } }
    }

    /// The row path against the per-pixel path over many random affine recipes: mosaic and single layouts, flips,
    /// multi-scale output sides, odd and tiny sizes, tiles partly or wholly outside, rotation and shear, mixup,
    /// with and without HSV. Every byte must agree.
    #[test]
    fn row_path_equals_per_pixel_path() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let dims = [(1, 1), (2, 3), (3, 2), (1, 9), (640, 480), (37, 91), (200, 13), (5, 300), (64, 64)];
        let images: Vec<SourceImage> = dims.iter().map(|&(w, h)| noise(w, h, &mut rng)).collect();
        let (mut rows, mut rotated, mut single, mut plain, mut varied, mut mixed) = (0, 0, 0, 0, 0, 0);
        for case in 0..400 {
            let hyp = Hyp {
                degrees: if case % 3 == 0 { rng.random_range(0.0..180.0) } else { 0.0 },
                shear: if case % 5 == 0 { rng.random_range(0.0..30.0) } else { 0.0 },
                translate: rng.random_range(0.0..0.5),
                scale: rng.random_range(0.0..0.99),
                perspective: 0.0,
                mosaic: if case % 4 == 0 { 0.0 } else { 1.0 },
                mixup: if case % 8 == 0 { 1.0 } else { 0.0 },
                fliplr: 0.5,
                flipud: 0.5,
                ..Hyp::default()
            };
            let sampler = RecipeSampler::new(hyp, images.len() as u64).expect("sampler");
            let imgsz =
                [1, 2, 3, 7, 32, 33, 64, 97, 160, 320, 640][rng.random_range(0..if case % 10 == 0 { 11 } else { 9 })];
            let id = rng.random_range(0..images.len() as u64);
            let mut recipe = sampler.draw(id, imgsz, true, &mut rng);
            if rng.random_range(0..3) == 0 {
                recipe = recipe.with_size(rng.random_range(1..=2 * imgsz + 1));
            }
            if rng.random_range(0..4) == 0 {
                recipe.hsv = None;
            }
            if case % 7 == 0 {
                // Far outside the usual range: tiny, huge and mirrored scales.
                recipe.geometry.perspective.scale = [0.01, 0.3, 4.0, -1.2][rng.random_range(0..4)];
            }
            let ids =
                |g: &Geometry| -> Vec<&SourceImage> { g.layout.ids().iter().map(|&i| &images[i as usize]).collect() };
            let refs = ids(&recipe.geometry);
            let mix_refs = recipe.mixup.as_ref().map(|m| ids(&m.geometry)).unwrap_or_default();
            let plan = TrainPlan::new(&recipe, &refs, &mix_refs).expect("plan");
            if !plan.main.rows || plan.mix.as_ref().is_some_and(|(m, _)| !m.rows) {
                // Scales far from 1 can leave the inverse's last row a rounding error away from (0, 0, 1).
                assert!(case % 7 == 0, "case {case}: an affine recipe takes the row path");
                continue;
            }
            let mut fast = vec![0u8; plan.slot_len()];
            let mut slow = vec![1u8; plan.slot_len()];
            plan.render(&mut fast).expect("render");
            plan.render_pixels(&mut slow);
            assert!(fast == slow, "case {case}: row path differs from the per-pixel path for {recipe:?}");
            // `render` takes the AVX2 build where the CPU has it; the baseline build must give the same bytes.
            let mut base = vec![2u8; plan.slot_len()];
            plan.render_rows(&mut base);
            assert!(base == slow, "case {case}: baseline row path differs from the per-pixel path for {recipe:?}");
            varied += usize::from(fast.iter().any(|&v| v != fast[0]));
            rows += 1;
            rotated += usize::from(plan.main.inverse[1][0] != 0.0);
            single += usize::from(matches!(recipe.geometry.layout, crate::Layout::Single { .. }));
            plain += usize::from(recipe.hsv.is_none());
            mixed += usize::from(recipe.mixup.is_some());
        }
        assert!(rotated > 50 && single > 50 && plain > 50 && mixed > 20, "{rotated} {single} {plain} {mixed}");
        assert!(rows > 370, "{rows} of 400 recipes took the row path");
        assert!(varied > 300, "only {varied} samples show any image content");
    }

    /// `TrainPlan::source_rows` holds every row the render reads: each image's rows outside the reported ranges
    /// are inverted, and the sample must come out the same, byte for byte, over random recipes (mosaic and single,
    /// rotation, shear, perspective, mixup, flips, multi-scale, sources larger and smaller than `imgsz`). With
    /// Ultralytics' default hyperparameters the reported rows are about half of a mosaic's images.
    #[test]
    fn source_rows_hold_every_row_the_render_reads() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let dims = [(2, 3), (40, 30), (64, 64), (97, 61), (160, 120), (300, 200), (33, 250)];
        let varied: Vec<SourceImage> = dims.iter().map(|&(w, h)| noise(w, h, &mut rng)).collect();
        // Images already at `imgsz`, as a disk cache holds them, for the default recipes' share.
        let squares: Vec<SourceImage> = (0..6).map(|_| noise(160, 160, &mut rng)).collect();
        let (mut reported, mut held, mut narrowed) = (0u64, 0u64, 0);
        for case in 0..300 {
            let default = case % 3 == 0;
            let hyp = if default {
                Hyp { mixup: 0.0, ..Hyp::default() }
            } else {
                Hyp {
                    degrees: if case % 2 == 0 { rng.random_range(0.0..180.0) } else { 0.0 },
                    shear: if case % 5 == 0 { rng.random_range(0.0..30.0) } else { 0.0 },
                    perspective: if case % 7 == 0 { 0.001 } else { 0.0 },
                    translate: rng.random_range(0.0..0.5),
                    scale: rng.random_range(0.0..0.99),
                    mosaic: if case % 4 == 1 { 0.0 } else { 1.0 },
                    mixup: if case % 8 == 1 { 1.0 } else { 0.0 },
                    fliplr: 0.5,
                    flipud: 0.5,
                    ..Hyp::default()
                }
            };
            let images = if default { &squares } else { &varied };
            let sampler = RecipeSampler::new(hyp, images.len() as u64).expect("sampler");
            let imgsz = if default { 160 } else { [7, 32, 64, 97, 160][rng.random_range(0..5)] };
            let mut recipe = sampler.draw(rng.random_range(0..images.len() as u64), imgsz, true, &mut rng);
            if !default && rng.random_range(0..3) == 0 {
                recipe = recipe.with_size(rng.random_range(1..=2 * imgsz + 1));
            }
            let mut rows: Vec<Vec<bool>> = images.iter().map(|i| vec![false; i.image.height() as usize]).collect();
            let pick = |g: &Geometry, set: &[SourceImage]| -> Vec<SourceImage> {
                g.layout.ids().iter().map(|&i| set[i as usize].clone()).collect()
            };
            let mix_geometry = recipe.mixup.as_ref().map(|m| m.geometry);
            let (main, mix) = (pick(&recipe.geometry, images), mix_geometry.map(|g| pick(&g, images)));
            let (main_refs, mix_refs): (Vec<&SourceImage>, Vec<&SourceImage>) =
                (main.iter().collect(), mix.iter().flatten().collect());
            TrainPlan::source_rows(&recipe, &main_refs, &mix_refs, &mut |id, r| {
                rows[id as usize][r.start as usize..r.end as usize].fill(true);
            })
            .expect("rows");
            // The same images with every row outside the reported ranges inverted.
            let poisoned: Vec<SourceImage> = images
                .iter()
                .zip(&rows)
                .map(|(img, keep)| {
                    let mut p = img.clone();
                    for (y, _) in keep.iter().enumerate().filter(|(_, k)| !**k) {
                        p.image.row_mut(y as u32).iter_mut().for_each(|b| *b = !*b);
                    }
                    p
                })
                .collect();
            let (p_main, p_mix) = (pick(&recipe.geometry, &poisoned), mix_geometry.map(|g| pick(&g, &poisoned)));
            let render = |main: &[SourceImage], mix: &Option<Vec<SourceImage>>| {
                let refs: Vec<&SourceImage> = main.iter().collect();
                let mix_refs: Vec<&SourceImage> = mix.iter().flatten().collect();
                let plan = TrainPlan::new(&recipe, &refs, &mix_refs).expect("plan");
                let mut out = vec![0u8; plan.slot_len()];
                plan.render(&mut out).expect("render");
                out
            };
            assert!(render(&main, &mix) == render(&p_main, &p_mix), "case {case}: a row read was not reported");
            if default {
                let ids = recipe.geometry.layout.ids();
                let used: std::collections::BTreeSet<_> = ids.iter().collect();
                reported += used.iter().map(|&&i| rows[i as usize].iter().filter(|&&k| k).count() as u64).sum::<u64>();
                held += used.iter().map(|&&i| u64::from(images[i as usize].image.height())).sum::<u64>();
                narrowed += usize::from(rows.iter().flatten().any(|k| !k));
            }
        }
        // The output square's preimage is `imgsz / scale` rows tall, split between the upper and the lower tiles
        // and met by both of a row's two tiles: about `2 E[1 / scale] imgsz = 2 ln 3 imgsz` of the mosaic's
        // `4 imgsz` rows (scale uniform in 0.5..1.5), 0.55, less where a tile's edge cuts it.
        let share = reported as f64 / held as f64;
        assert!(narrowed > 80 && share < 0.6, "default recipes report {share:.2} of their images' rows");
    }

    #[test]
    fn perspective_keeps_the_per_pixel_path() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let images: Vec<SourceImage> = (0..4).map(|i| noise(40 + i, 30, &mut rng)).collect();
        let refs: Vec<&SourceImage> = images.iter().collect();
        let hyp = Hyp { perspective: 0.001, mixup: 1.0, mosaic: 1.0, ..Hyp::default() };
        let recipe = RecipeSampler::new(hyp, 4).expect("sampler").draw(0, 32, true, &mut rng);
        let plan = TrainPlan::new(&recipe, &refs, &refs).expect("plan");
        assert!(!plan.main.rows && plan.mix.as_ref().is_some_and(|(m, _)| !m.rows));
        let mut out = vec![0u8; plan.slot_len()];
        plan.render(&mut out).expect("render");
    }
}
