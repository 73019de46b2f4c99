//! The `Augment` stage implementations: [`TrainAugment`] executes a [`TrainRecipe`] (fused mosaic + perspective +
//! mixup + HSV + flip), [`ValLetterbox`] a [`ValRecipe`] (plain letterbox into a rect-batch canvas). Both fetch
//! their source images from the caller's [`ImageSource`], write into the next slot of the batch and append the
//! sample's boxes to the batch's targets table.

use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::{Augment, Batch, BoxXyxy, ImageSource, SampleId, SourceImage, Target};

use crate::error::{AugmentError, Result};
use crate::fused::TrainPlan;
use crate::letterbox::{Letterbox, LetterboxOpts, letterbox_into, load_size};
use crate::recipe::TrainRecipe;

/// Fetches the images of `ids` (at most 4), repeating the first to fill the array.
fn fetch(ids: &[SampleId], source: &dyn ImageSource) -> Result<[Arc<SourceImage>; 4]> {
    let get = |id: SampleId| source.get(id).map_err(|source| AugmentError::Source { id, source });
    let first_id =
        ids.first().copied().ok_or(AugmentError::Config { what: "recipe layout", reason: "no source image".into() })?;
    let first = get(first_id)?;
    let more = |i: usize| match ids.get(i) {
        Some(&id) => get(id),
        None => Ok(first.clone()),
    };
    Ok([first.clone(), more(1)?, more(2)?, more(3)?])
}

fn check_shape(batch: &Batch, id: SampleId, want_w: usize, want_h: usize) -> Result<()> {
    let s = batch.shape();
    if s.channels != 3 || s.width != want_w || s.height != want_h {
        return Err(AugmentError::BatchShape {
            id,
            batch_w: s.width,
            batch_h: s.height,
            batch_c: s.channels,
            want_w,
            want_h,
        });
    }
    Ok(())
}

/// The training augmentation (stateless: everything random is in the recipe).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrainAugment;

impl TrainAugment {
    /// Fetches `recipe`'s source images (its layout's, then its mixup partner's layout's, each in
    /// [`crate::Layout::ids`] order) and hands them to `f`.
    fn with_images<T>(
        recipe: &TrainRecipe,
        source: &dyn ImageSource,
        f: impl FnOnce(&[&SourceImage], &[&SourceImage]) -> Result<T>,
    ) -> Result<T> {
        let ids = recipe.geometry.layout.ids();
        let held = fetch(ids, source)?;
        let refs: [&SourceImage; 4] = [&held[0], &held[1], &held[2], &held[3]];
        let mix_held = match &recipe.mixup {
            Some(m) => Some(fetch(m.geometry.layout.ids(), source)?),
            None => None,
        };
        let mix_refs: Option<[&SourceImage; 4]> = mix_held.as_ref().map(|h| [&*h[0], &*h[1], &*h[2], &*h[3]]);
        let mix_slice: &[&SourceImage] = match (&recipe.mixup, &mix_refs) {
            (Some(m), Some(r)) => &r[..m.geometry.layout.ids().len()],
            _ => &[],
        };
        f(&refs[..ids.len()], mix_slice)
    }

    fn run(recipe: &TrainRecipe, source: &dyn ImageSource, batch: &mut Batch) -> Result<()> {
        let id = recipe.id();
        let n = recipe.size as usize;
        check_shape(batch, id, n, n)?;
        Self::with_images(recipe, source, |images, mix| {
            let plan = TrainPlan::new(recipe, images, mix)?;
            let (b, slot) = batch.push_slot(id).map_err(|source| AugmentError::Slot { id, source })?;
            plan.render(slot)?;
            plan.labels(|l| batch.targets.push(Target { image: b, class: l.class, bbox: l.bbox }));
            Ok(())
        })
    }
}

impl Augment for TrainAugment {
    type Recipe = TrainRecipe;

    fn apply(&self, recipe: &TrainRecipe, source: &dyn ImageSource, batch: &mut Batch) -> sluice_core::Result<()> {
        Ok(Self::run(recipe, source, batch)?)
    }

    /// The rows under the inverse transform of the output square ([`TrainPlan::source_rows`]): for Ultralytics'
    /// default scale range about half of a mosaic's four images.
    fn source_rows(
        &self,
        recipe: &TrainRecipe,
        source: &dyn ImageSource,
        f: &mut dyn FnMut(SampleId, Range<u32>),
    ) -> sluice_core::Result<()> {
        Ok(Self::with_images(recipe, source, |images, mix| TrainPlan::source_rows(recipe, images, mix, f))?)
    }
}

/// One validation sample: which image, at which size, into which rect-batch canvas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValRecipe {
    /// The image.
    pub id: SampleId,
    /// Validation size (`load_image` resizes the long side to it).
    pub imgsz: u32,
    /// The batch canvas `(w, h)` ([`crate::RectPlan`] shape, or `(imgsz, imgsz)` without rect).
    pub canvas: (u32, u32),
}

/// How a validation image of `w0 x h0` maps onto its canvas: `load_image`'s resize to `imgsz`, then
/// `LetterBox(canvas, scaleup=False)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ValTransform {
    /// The letterbox of the loaded (long side `imgsz`) image.
    pub letterbox: Letterbox,
    /// Source pixel → loaded pixel scale `(w1 / w0, h1 / h0)`.
    pub pre_scale: (f64, f64),
}

impl ValTransform {
    /// The transform of a `w0 x h0` image for `recipe`.
    pub fn new(w0: u32, h0: u32, imgsz: u32, canvas: (u32, u32)) -> Self {
        let (w1, h1) = load_size(w0, h0, imgsz);
        let opts = LetterboxOpts { scaleup: false, ..LetterboxOpts::default() };
        let letterbox = Letterbox::new(w1, h1, canvas.0, canvas.1, opts);
        let pre_scale = (f64::from(w1) / f64::from(w0.max(1)), f64::from(h1) / f64::from(h0.max(1)));
        Self { letterbox, pre_scale }
    }

    /// A source box → canvas box.
    pub fn map_box(&self, b: &BoxXyxy) -> BoxXyxy {
        let (sx, sy) = (self.pre_scale.0 as f32, self.pre_scale.1 as f32);
        self.letterbox.map_box(&b.scale_shift(sx, sy, 0.0, 0.0))
    }

    /// A canvas box (a prediction) → source box.
    pub fn unmap_box(&self, b: &BoxXyxy) -> BoxXyxy {
        let l = self.letterbox.unmap_box(b);
        let (sx, sy) = (self.pre_scale.0 as f32, self.pre_scale.1 as f32);
        BoxXyxy::new(l.x1 / sx, l.y1 / sy, l.x2 / sx, l.y2 / sy)
    }
}

/// The validation transform: letterbox into the rect-batch canvas, boxes mapped (none dropped).
#[derive(Debug, Clone, Copy, Default)]
pub struct ValLetterbox;

impl ValLetterbox {
    fn run(recipe: &ValRecipe, source: &dyn ImageSource, batch: &mut Batch) -> Result<()> {
        let id = recipe.id;
        check_shape(batch, id, recipe.canvas.0 as usize, recipe.canvas.1 as usize)?;
        let img = source.get(id).map_err(|source| AugmentError::Source { id, source })?;
        let (w0, h0) = (img.image.width(), img.image.height());
        if w0 == 0 || h0 == 0 {
            return Err(AugmentError::EmptyImage { id, width: w0, height: h0 });
        }
        let t = ValTransform::new(w0, h0, recipe.imgsz, recipe.canvas);
        let (b, slot) = batch.push_slot(id).map_err(|source| AugmentError::Slot { id, source })?;
        letterbox_into(&img.image, &t.letterbox, slot);
        for l in &img.labels.objects {
            batch.targets.push(Target { image: b, class: l.class, bbox: t.map_box(&l.bbox) });
        }
        Ok(())
    }
}

impl Augment for ValLetterbox {
    type Recipe = ValRecipe;

    fn apply(&self, recipe: &ValRecipe, source: &dyn ImageSource, batch: &mut Batch) -> sluice_core::Result<()> {
        Ok(Self::run(recipe, source, batch)?)
    }

    /// Every row: the letterbox resizes the whole image.
    fn source_rows(
        &self,
        recipe: &ValRecipe,
        source: &dyn ImageSource,
        f: &mut dyn FnMut(SampleId, Range<u32>),
    ) -> sluice_core::Result<()> {
        let img = source.get(recipe.id)?;
        f(recipe.id, 0..img.image.height());
        Ok(())
    }
}
