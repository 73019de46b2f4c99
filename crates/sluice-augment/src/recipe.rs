//! Recipes: plain data holding every random decision of one training sample (which images, the mosaic centre,
//! the perspective parameters, the HSV gains, the flips), drawn from a caller-owned RNG so that a sample is a pure
//! function of `(seed, epoch, index)` when the caller seeds that RNG per sample. Workers only execute recipes.
//!
//! Draw order (one stream per sample): the mosaic decision (`U(0,1) <= mosaic`), then the 3 mosaic partners, each
//! uniform over the whole dataset (`0..len`, as Ultralytics 8.4's `Mosaic.get_indexes` draws them when the images
//! are cached in RAM; with `cache` off or on disk it draws them from its buffer of the `min(n, 8·batch, 1000)`
//! images its worker loaded last, a per-process stand-in for the whole set, which Sluice does not copy: here every
//! sample may meet every other one with equal probability whatever the cache), then the centre `yc`, `xc` (each
//! `int(U(imgsz/2, 3 imgsz/2))`), then the 8 perspective parameters; then, when mixup is configured, its decision,
//! its partner (uniform) with that partner's own mosaic and perspective, and the ratio `Beta(32, 32)`; then the 3
//! HSV gains (when any is configured) and the two flips.
//!
//! Multi-scale is a batch-level decision: [`draw_multiscale`] draws the batch's output side from the batch's own
//! stream, and [`TrainRecipe::with_size`] sets it on each recipe. The per-sample draws do not depend on it, so a
//! sample's geometry is the same with multi-scale on or off; only the size it is rendered at changes.

use rand::Rng;
use serde::{Deserialize, Serialize};
use sluice_core::SampleId;

use crate::affine::PerspectiveParams;
use crate::error::{AugmentError, Result};
use crate::hsv::HsvGains;
use crate::hyp::Hyp;

/// Where a sample's source images go before the perspective transform.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Layout {
    /// One image, resized so its long side is `imgsz` (`load_image`) and letterboxed onto an `imgsz` square
    /// (Ultralytics' path when mosaic is off).
    Single {
        /// The image.
        id: SampleId,
    },
    /// Ultralytics' 4-image mosaic on a `2 imgsz` square canvas: top-left, top-right, bottom-left, bottom-right
    /// around the centre.
    Mosaic4 {
        /// The images, the sample's own first.
        ids: [SampleId; 4],
        /// Mosaic centre `(xc, yc)` in canvas pixels, each in `imgsz/2 .. 3 imgsz/2`.
        centre: (i32, i32),
    },
}

impl Layout {
    /// The source images, in tile order.
    pub fn ids(&self) -> &[SampleId] {
        match self {
            Layout::Single { id } => std::slice::from_ref(id),
            Layout::Mosaic4 { ids, .. } => ids,
        }
    }
}

/// One composed image before colour and flips: the layout and its perspective transform.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Geometry {
    /// Source images and where they go.
    pub layout: Layout,
    /// The random perspective applied to the canvas.
    pub perspective: PerspectiveParams,
}

/// A second composed image blended into the first (Ultralytics' `MixUp`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mixup {
    /// The second image's own layout and perspective.
    pub geometry: Geometry,
    /// Weight of the first image: `out = first * ratio + second * (1 - ratio)`.
    pub ratio: f32,
}

/// Everything needed to produce one training sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainRecipe {
    /// The augmentation size: the mosaic canvas is `2 imgsz`, the perspective's output `imgsz x imgsz`, and the
    /// box filter works in its pixels (Ultralytics' `imgsz`).
    pub imgsz: u32,
    /// The output side (square `size x size`): `imgsz`, or the batch's multi-scale size. The `imgsz` image is
    /// rendered straight at this size, as Ultralytics' bilinear batch resize (`align_corners=False`) would give it,
    /// and its boxes are scaled by `size / imgsz`.
    pub size: u32,
    /// The sample's composition.
    pub geometry: Geometry,
    /// Optional mixup partner.
    pub mixup: Option<Mixup>,
    /// HSV gains; `None` when all configured gains are 0 (Ultralytics then skips the colour round trip).
    pub hsv: Option<HsvGains>,
    /// Left-right flip of the final image.
    pub flip_lr: bool,
    /// Up-down flip of the final image.
    pub flip_ud: bool,
}

impl TrainRecipe {
    /// The sample's own id (the first image of its layout).
    pub fn id(&self) -> SampleId {
        self.geometry.layout.ids()[0]
    }

    /// The same sample rendered at output side `size` (multi-scale); everything random stays as drawn.
    pub fn with_size(self, size: u32) -> Self {
        Self { size, ..self }
    }
}

/// Python's `random.uniform(a, b)`: `a + (b - a) * U[0, 1)`; never panics on an empty range.
fn uniform(rng: &mut impl Rng, a: f64, b: f64) -> f64 {
    a + (b - a) * rng.random::<f64>()
}

/// `Beta(32, 32)` as `G1 / (G1 + G2)`, each `Gamma(32, 1)` the sum of 32 unit exponentials (exact for an integer
/// shape).
fn beta_32_32(rng: &mut impl Rng) -> f64 {
    let mut gamma = || (0..32).map(|_| -(1.0 - rng.random::<f64>()).ln()).sum::<f64>();
    let (a, b) = (gamma(), gamma());
    a / (a + b)
}

/// Draws recipes for one dataset and image size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecipeSampler {
    hyp: Hyp,
    dataset_len: u64,
}

impl RecipeSampler {
    /// A sampler over a dataset of `dataset_len` images; fails on an empty dataset or an out-of-range hyp value.
    pub fn new(hyp: Hyp, dataset_len: u64) -> Result<Self> {
        hyp.validate()?;
        if dataset_len == 0 {
            return Err(AugmentError::Config { what: "dataset", reason: "no images to draw from".into() });
        }
        Ok(Self { hyp, dataset_len })
    }

    /// The hyperparameters.
    pub fn hyp(&self) -> &Hyp {
        &self.hyp
    }

    /// The recipe of sample `id` at output size `imgsz`. `mosaic_on` is the `close_mosaic` switch
    /// ([`Hyp::mosaic_active`]): when off, neither mosaic nor mixup is drawn (plain letterbox + perspective).
    pub fn draw(&self, id: SampleId, imgsz: u32, mosaic_on: bool, rng: &mut impl Rng) -> TrainRecipe {
        let h = &self.hyp;
        let geometry = self.geometry(id, imgsz, mosaic_on, rng);
        let mixup = if mosaic_on && h.mixup > 0.0 && rng.random::<f64>() <= h.mixup {
            let partner = rng.random_range(0..self.dataset_len);
            let geometry = self.geometry(partner, imgsz, true, rng);
            Some(Mixup { geometry, ratio: beta_32_32(rng) as f32 })
        } else {
            None
        };
        let hsv = (h.hsv_h != 0.0 || h.hsv_s != 0.0 || h.hsv_v != 0.0).then(|| HsvGains {
            h: uniform(rng, -1.0, 1.0) * h.hsv_h,
            s: uniform(rng, -1.0, 1.0) * h.hsv_s,
            v: uniform(rng, -1.0, 1.0) * h.hsv_v,
        });
        let flip_ud = h.flipud > 0.0 && rng.random::<f64>() < h.flipud;
        let flip_lr = h.fliplr > 0.0 && rng.random::<f64>() < h.fliplr;
        TrainRecipe { imgsz, size: imgsz, geometry, mixup, hsv, flip_lr, flip_ud }
    }

    fn geometry(&self, id: SampleId, imgsz: u32, mosaic_on: bool, rng: &mut impl Rng) -> Geometry {
        let h = &self.hyp;
        let layout = if mosaic_on && h.mosaic > 0.0 && rng.random::<f64>() <= h.mosaic {
            let mut ids = [id; 4];
            for slot in &mut ids[1..] {
                *slot = rng.random_range(0..self.dataset_len);
            }
            let s = f64::from(imgsz);
            let lo = f64::from(imgsz / 2);
            let hi = 2.0 * s - lo;
            let yc = uniform(rng, lo, hi) as i32;
            let xc = uniform(rng, lo, hi) as i32;
            Layout::Mosaic4 { ids, centre: (xc, yc) }
        } else {
            Layout::Single { id }
        };
        let perspective = PerspectiveParams {
            perspective_x: uniform(rng, -h.perspective, h.perspective),
            perspective_y: uniform(rng, -h.perspective, h.perspective),
            angle_deg: uniform(rng, -h.degrees, h.degrees),
            scale: uniform(rng, 1.0 - h.scale, 1.0 + h.scale),
            shear_x_deg: uniform(rng, -h.shear, h.shear),
            shear_y_deg: uniform(rng, -h.shear, h.shear),
            translate_x: uniform(rng, 0.5 - h.translate, 0.5 + h.translate),
            translate_y: uniform(rng, 0.5 - h.translate, 0.5 + h.translate),
        };
        Geometry { layout, perspective }
    }
}

/// The draw bounds of Ultralytics 8.4's `multi_scale` (`DetectionTrainer.preprocess_batch`): `lo = max(stride,
/// int(imgsz (1 - range)))`, `hi = int(imgsz (1 + range) + stride)`, the size `randrange(lo, hi) // stride * stride`.
fn multiscale_draw_range(imgsz: u32, range: f64, stride: u32) -> (u64, u64) {
    let stride = u64::from(stride.max(1));
    let s = f64::from(imgsz);
    let lo = ((s * (1.0 - range)) as u64).max(stride);
    let hi = ((s * (1.0 + range) + stride as f64) as u64).max(lo + 1);
    (lo, hi)
}

/// Multi-scale (Ultralytics 8.4's `multi_scale: range`, a fraction of `imgsz`): a batch side drawn uniformly from
/// the integers `max(stride, int(imgsz (1 - range))) .. int(imgsz (1 + range) + stride)` and rounded down to a
/// multiple of `stride`, exactly as `DetectionTrainer.preprocess_batch` does (so both ends are reachable, and the
/// smallest size may lie below `imgsz (1 - range)` when that is not a stride multiple). Draw it once per batch,
/// from the batch's own stream ([`sluice_core::batch_rng`]). `range` 0 gives `imgsz` for a stride-multiple `imgsz`.
pub fn draw_multiscale(imgsz: u32, range: f64, stride: u32, rng: &mut impl Rng) -> u32 {
    let (lo, hi) = multiscale_draw_range(imgsz, range, stride);
    let stride = u64::from(stride.max(1));
    let size = rng.random_range(lo..hi) / stride * stride;
    u32::try_from(size).unwrap_or(u32::MAX)
}

/// The smallest and largest side [`draw_multiscale`] can return (size the batch buffers for the largest).
pub fn multiscale_bounds(imgsz: u32, range: f64, stride: u32) -> (u32, u32) {
    let (lo, hi) = multiscale_draw_range(imgsz, range, stride);
    let stride = u64::from(stride.max(1));
    let clamp = |v: u64| u32::try_from(v / stride * stride).unwrap_or(u32::MAX);
    (clamp(lo), clamp(hi - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn same_stream_same_recipe() {
        let sampler = RecipeSampler::new(Hyp { mixup: 0.5, degrees: 5.0, ..Hyp::default() }, 128).expect("sampler");
        let a = sampler.draw(3, 640, true, &mut ChaCha8Rng::seed_from_u64(9));
        let b = sampler.draw(3, 640, true, &mut ChaCha8Rng::seed_from_u64(9));
        let c = sampler.draw(3, 640, true, &mut ChaCha8Rng::seed_from_u64(10));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.id(), 3);
    }

    #[test]
    fn close_mosaic_gives_single_images_without_mixup() {
        let sampler = RecipeSampler::new(Hyp { mixup: 1.0, ..Hyp::default() }, 10).expect("sampler");
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for i in 0..50 {
            let r = sampler.draw(i % 10, 320, false, &mut rng);
            assert_eq!(r.geometry.layout, Layout::Single { id: i % 10 });
            assert!(r.mixup.is_none());
        }
        let r = sampler.draw(0, 320, true, &mut rng);
        assert!(matches!(r.geometry.layout, Layout::Mosaic4 { .. }) && r.mixup.is_some());
    }

    #[test]
    fn bad_config_is_an_error() {
        assert!(RecipeSampler::new(Hyp::default(), 0).is_err());
        assert!(RecipeSampler::new(Hyp { fliplr: 2.0, ..Hyp::default() }, 5).is_err());
    }

    #[test]
    fn multiscale_sizes_are_stride_aligned_and_in_range() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        assert_eq!(multiscale_bounds(640, 0.5, 32), (320, 960));
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..4000 {
            let s = draw_multiscale(640, 0.5, 32, &mut rng);
            assert!(s % 32 == 0 && (320..=960).contains(&s), "{s}");
            seen.insert(s);
        }
        // Every stride multiple of the range, both ends included (randrange(320, 992) // 32 * 32).
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), (10..=30).map(|k| k * 32).collect::<Vec<_>>());
    }

    #[test]
    fn multiscale_bounds_follow_ultralytics_rounding() {
        // imgsz 64, range 0.25: randrange(48, 112) // 32 * 32 gives 32, 64 or 96.
        assert_eq!(multiscale_bounds(64, 0.25, 32), (32, 96));
        // Range 1 (Ultralytics' `multi_scale: True`): from one stride to 2 imgsz + the last partial stride.
        assert_eq!(multiscale_bounds(640, 1.0, 32), (32, 1280));
        // Range 0: always imgsz.
        assert_eq!(multiscale_bounds(640, 0.0, 32), (640, 640));
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        assert!((0..100).all(|_| draw_multiscale(640, 0.0, 32, &mut rng) == 640));
        for _ in 0..500 {
            let s = draw_multiscale(64, 0.25, 32, &mut rng);
            assert!([32, 64, 96].contains(&s), "{s}");
        }
    }

    #[test]
    fn with_size_changes_only_the_output_side() {
        let sampler = RecipeSampler::new(Hyp::default(), 16).expect("sampler");
        let r = sampler.draw(2, 640, true, &mut ChaCha8Rng::seed_from_u64(5));
        assert_eq!(r.size, 640);
        let m = r.with_size(384);
        assert_eq!((m.imgsz, m.size), (640, 384));
        assert_eq!(TrainRecipe { size: 640, ..m }, r);
    }
}
