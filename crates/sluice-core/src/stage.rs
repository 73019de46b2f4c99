//! The stage traits. Each has one job, is object-safe (except [`MergeMetric`], whose `merge` takes a whole
//! part by value), and writes into buffers the caller owns, so an implementation can be swapped by a feature or a
//! config value and benchmarked alone. `Arc`/`Box` forward, and closures implement [`Decoder`] directly.

use std::ops::Range;
use std::sync::Arc;

use crate::batch::Batch;
use crate::error::Result;
use crate::image::ImageRgb8;
use crate::labels::{Detection, ImageLabels, SampleId};

/// Sample id → encoded bytes. Returns a slice borrowed either from the reader itself (an mmap'd shard, a RAM
/// cache) or from `scratch` (a file read); the caller keeps `scratch` to avoid a per-sample allocation.
pub trait Reader: Send + Sync {
    /// The encoded bytes of sample `id`.
    fn read<'a>(&'a self, id: SampleId, scratch: &'a mut Vec<u8>) -> Result<&'a [u8]>;

    /// Number of samples this reader serves.
    fn len(&self) -> usize;

    /// Whether the reader serves no sample.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a decoder may do to save work: produce an image whose long side is at least `min_long_side` (e.g. a
/// reduced DCT scale for a JPEG much larger than the training size). `None` decodes at full size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeHint {
    /// The smallest long side the caller needs, in pixels.
    pub min_long_side: Option<u32>,
}

/// What a decode produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeInfo {
    /// Original width (after EXIF orientation), the frame labels refer to.
    pub orig_width: u32,
    /// Original height (after EXIF orientation).
    pub orig_height: u32,
    /// Decoded size / original size (1.0, or 1/2, 1/4, 1/8 for DCT scaling).
    pub scale: f32,
}

/// Encoded bytes → RGB8 pixels into a caller-owned image. No I/O.
pub trait Decoder: Send + Sync {
    /// Decodes `bytes` into `out` (reshaped as needed).
    fn decode(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> Result<DecodeInfo>;

    /// The backend's name, for bench and telemetry labels.
    fn name(&self) -> &str;
}

/// A decoded source image and its labels, as a cache hands it out.
#[derive(Debug, Clone)]
pub struct SourceImage {
    /// Pixels (possibly downscaled by the decoder).
    pub image: ImageRgb8,
    /// Labels in the pixel frame of `image`.
    pub labels: ImageLabels,
}

/// Where an augmentation gets its decoded source images (a cache, or read + decode on demand).
pub trait ImageSource: Send + Sync {
    /// The decoded image and labels of sample `id`.
    fn get(&self, id: SampleId) -> Result<Arc<SourceImage>>;
}

/// Executes one recipe: composes a training/validation sample straight into the next slot of `batch` and
/// appends its transformed boxes to the batch's targets table. All randomness is in the recipe.
pub trait Augment: Send + Sync {
    /// The recipe type (which source images, every random parameter).
    type Recipe;

    /// Writes one sample into `batch`.
    fn apply(&self, recipe: &Self::Recipe, source: &dyn ImageSource, batch: &mut Batch) -> Result<()>;

    /// Reports through `f` the rows of each source image that [`Augment::apply`] of `recipe` reads, as `(id,
    /// rows)` pairs (an image may come more than once), so that a source which reads lazily, such as a mapped
    /// file, can start reading them before the sample is composed. A hint: `apply` reads what it needs whatever
    /// was reported. The default reports nothing.
    fn source_rows(
        &self,
        recipe: &Self::Recipe,
        source: &dyn ImageSource,
        f: &mut dyn FnMut(SampleId, Range<u32>),
    ) -> Result<()> {
        let _ = (recipe, source, f);
        Ok(())
    }
}

/// A filled host batch → a device batch.
pub trait Transfer: Send + Sync {
    /// The device-side batch (tensor and targets).
    type Output;

    /// Sends `batch` to the device.
    fn transfer(&self, batch: &Batch) -> Result<Self::Output>;
}

/// Raw head output (already shrunk on the device) → detections per image, into caller-owned vectors. The
/// stage itself is shared between threads; its working memory is a `Scratch` that each calling thread owns and
/// passes back on every call, so a warm scratch makes `process` allocation-free.
pub trait PostProcess: Send + Sync {
    /// The raw output of one batch.
    type Input;

    /// Reusable working memory of [`process`](Self::process); keep one per thread.
    type Scratch: Default + Send;

    /// Fills `out[b]` with the detections of image `b` (clearing what was there), for every image of `input`.
    fn process(&self, input: &Self::Input, scratch: &mut Self::Scratch, out: &mut Vec<Vec<Detection>>) -> Result<()>;
}

/// A streaming metric: one `update` per image, one `finalize` at the end.
pub trait Metric: Send {
    /// The final report.
    type Report;

    /// Adds one image's detections and ground truth.
    fn update(&mut self, id: SampleId, detections: &[Detection], truth: &ImageLabels) -> Result<()>;

    /// Computes the report from everything added.
    fn finalize(&mut self) -> Result<Self::Report>;
}

/// A [`Metric`] whose state can be split across threads: each thread updates its own part (every image goes to
/// exactly one part) and the parts merge into one before `finalize`. The report does not depend on how the
/// images were split or in which order the parts merge.
pub trait MergeMetric: Metric + Sized {
    /// Adds the images of `other`, a part built on another thread. An image present in both is an error.
    fn merge(&mut self, other: Self) -> Result<()>;
}

impl<F> Decoder for F
where
    F: Fn(&[u8], DecodeHint, &mut ImageRgb8) -> Result<DecodeInfo> + Send + Sync,
{
    fn decode(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> Result<DecodeInfo> {
        self(bytes, hint, out)
    }

    fn name(&self) -> &str {
        "closure"
    }
}

macro_rules! forward_ptr {
    ($($ptr:ident),*) => {$(
        impl<T: Reader + ?Sized> Reader for $ptr<T> {
            fn read<'a>(&'a self, id: SampleId, scratch: &'a mut Vec<u8>) -> Result<&'a [u8]> {
                (**self).read(id, scratch)
            }
            fn len(&self) -> usize {
                (**self).len()
            }
        }
        impl<T: ImageSource + ?Sized> ImageSource for $ptr<T> {
            fn get(&self, id: SampleId) -> Result<Arc<SourceImage>> {
                (**self).get(id)
            }
        }
        impl<T: Augment + ?Sized> Augment for $ptr<T> {
            type Recipe = T::Recipe;
            fn apply(&self, recipe: &Self::Recipe, source: &dyn ImageSource, batch: &mut Batch) -> Result<()> {
                (**self).apply(recipe, source, batch)
            }
        }
        impl<T: Transfer + ?Sized> Transfer for $ptr<T> {
            type Output = T::Output;
            fn transfer(&self, batch: &Batch) -> Result<Self::Output> {
                (**self).transfer(batch)
            }
        }
        impl<T: PostProcess + ?Sized> PostProcess for $ptr<T> {
            type Input = T::Input;
            type Scratch = T::Scratch;
            fn process(
                &self,
                input: &Self::Input,
                scratch: &mut Self::Scratch,
                out: &mut Vec<Vec<Detection>>,
            ) -> Result<()> {
                (**self).process(input, scratch, out)
            }
        }
    )*};
}
forward_ptr!(Arc, Box);

impl<T: Metric + ?Sized> Metric for Box<T> {
    type Report = T::Report;
    fn update(&mut self, id: SampleId, detections: &[Detection], truth: &ImageLabels) -> Result<()> {
        (**self).update(id, detections, truth)
    }
    fn finalize(&mut self) -> Result<Self::Report> {
        (**self).finalize()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slices(Vec<Vec<u8>>);

    impl Reader for Slices {
        fn read<'a>(&'a self, id: SampleId, _scratch: &'a mut Vec<u8>) -> Result<&'a [u8]> {
            Ok(&self.0[id as usize])
        }
        fn len(&self) -> usize {
            self.0.len()
        }
    }

    #[test]
    fn traits_are_object_safe_and_forward() {
        let readers: Vec<Box<dyn Reader>> =
            vec![Box::new(Slices(vec![vec![1, 2], vec![3]])), Box::new(Arc::new(Slices(vec![vec![9]])))];
        let mut scratch = Vec::new();
        assert_eq!(readers[0].read(1, &mut scratch).expect("read"), &[3]);
        assert_eq!(readers[1].read(0, &mut scratch).expect("read"), &[9]);
        assert_eq!(readers[0].len(), 2);

        let grey = |_: &[u8], _: DecodeHint, out: &mut ImageRgb8| {
            out.reset(2, 1);
            out.as_bytes_mut().fill(128);
            Ok(DecodeInfo { orig_width: 2, orig_height: 1, scale: 1.0 })
        };
        let dec: Box<dyn Decoder> = Box::new(grey);
        let mut img = ImageRgb8::default();
        let info = dec.decode(&[], DecodeHint::default(), &mut img).expect("decode");
        assert_eq!((info.orig_width, img.pixel(1, 0)), (2, [128, 128, 128]));
        let _: Option<Box<dyn Transfer<Output = ()>>> = None;
        let _: Option<Box<dyn PostProcess<Input = (), Scratch = ()>>> = None;
        let _: Option<Box<dyn Metric<Report = ()>>> = None;
        let _: Option<Box<dyn Augment<Recipe = ()>>> = None;
    }
}
