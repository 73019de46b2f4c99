//! Resizing to the training size the way Ultralytics' `BaseDataset.load_image` does: the long side becomes
//! `imgsz`, each side `min(ceil(side * r), imgsz)` with `r = imgsz / max(w, h)`, area interpolation when shrinking
//! and linear when enlarging (or always linear, as Ultralytics does while augmenting). Linear resampling and
//! area resampling by integer factors use `fast_image_resize` (SIMD; its fixed-kernel bilinear interpolation is
//! OpenCV's `INTER_LINEAR`, its box filter at integer factors is `INTER_AREA`); area resampling by fractional
//! factors uses OpenCV's exact coverage weights (`area.rs`). All agree with `cv2.resize` within one level.

use std::cell::RefCell;

use fast_image_resize::images::{TypedImage, TypedImageRef};
use fast_image_resize::pixels::U8x3;
use fast_image_resize::{FilterType, ResizeAlg, ResizeOptions, Resizer};
use sluice_core::ImageRgb8;

use crate::error::{DecodeError, Result};

/// How pixels are resampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// Average over the covered source area (OpenCV `INTER_AREA`); for shrinking.
    Area,
    /// Bilinear interpolation between the four nearest pixels (OpenCV `INTER_LINEAR`).
    Linear,
}

impl Interpolation {
    /// Ultralytics' choice: linear when enlarging (`r > 1`) or augmenting, area otherwise.
    pub fn ultralytics(r: f64, augment: bool) -> Self {
        if augment || r > 1.0 { Self::Linear } else { Self::Area }
    }
}

/// Ultralytics' resize ratio and target size for a `w x h` image and training size `imgsz`: `r = imgsz / max(w,
/// h)` and `(min(ceil(w * r), imgsz), min(ceil(h * r), imgsz))`, in `f64` exactly as Python computes it. Returns
/// the input size when `r == 1`.
pub fn target_size(w: u32, h: u32, imgsz: u32) -> (f64, u32, u32) {
    let r = f64::from(imgsz) / f64::from(w.max(h).max(1));
    if r == 1.0 {
        return (r, w, h);
    }
    let side = |s: u32| ((f64::from(s) * r).ceil() as u32).clamp(1, imgsz.max(1));
    (r, side(w), side(h))
}

thread_local! {
    /// One resizer (with its internal buffers) and one packing buffer per thread, reused across calls.
    static RESIZER: RefCell<(Resizer, Vec<u8>)> = RefCell::new((Resizer::new(), Vec::new()));
}

/// Resamples `src` to `width x height` into `out` (reshaped; its allocation is reused).
pub fn resize(src: &ImageRgb8, width: u32, height: u32, interp: Interpolation, out: &mut ImageRgb8) -> Result<()> {
    resize_region(src, f64::from(src.width()), f64::from(src.height()), width, height, interp, out)
}

/// Resamples the region `[0, extent_w) x [0, extent_h)` of `src` (extents in pixels, at most the image size, may
/// be fractional) to `width x height` into `out`. A DCT-scaled decode of an odd-sized image has a last row or
/// column that stands for half a pixel (libjpeg rounds the scaled size up): resampling the exact region
/// `orig * scale` keeps it aligned with a full-size decode.
pub fn resize_region(
    src: &ImageRgb8,
    extent_w: f64,
    extent_h: f64,
    width: u32,
    height: u32,
    interp: Interpolation,
    out: &mut ImageRgb8,
) -> Result<()> {
    let err = |reason: String| DecodeError::Resize {
        from_w: src.width(),
        from_h: src.height(),
        to_w: width,
        to_h: height,
        reason,
    };
    if width == 0 || height == 0 || src.width() == 0 || src.height() == 0 {
        return Err(err("zero-sized image".to_owned()));
    }
    let (sw, sh) = (f64::from(src.width()), f64::from(src.height()));
    if !(extent_w > 0.0 && extent_w <= sw && extent_h > 0.0 && extent_h <= sh) {
        return Err(err(format!("region {extent_w}x{extent_h} outside the source")));
    }
    out.reset(width, height);
    let whole = extent_w == sw && extent_h == sh;
    if whole && (src.width(), src.height()) == (width, height) {
        for y in 0..height {
            out.row_mut(y).copy_from_slice(src.row(y));
        }
        return Ok(());
    }
    let integer_factor = |extent: f64, dst: u32| {
        let f = extent / f64::from(dst);
        f >= 1.0 && f == f.trunc()
    };
    let alg = match interp {
        Interpolation::Area if integer_factor(extent_w, width) && integer_factor(extent_h, height) => {
            ResizeAlg::Convolution(FilterType::Box)
        }
        Interpolation::Area if extent_w >= f64::from(width) && extent_h >= f64::from(height) => {
            crate::area::resize_area(src, extent_w, extent_h, width, height, out);
            return Ok(());
        }
        // OpenCV's INTER_AREA falls back to linear when enlarging.
        Interpolation::Area | Interpolation::Linear => ResizeAlg::Interpolation(FilterType::Bilinear),
    };
    let mut options = ResizeOptions::new().resize_alg(alg);
    if !whole {
        options = options.crop(0.0, 0.0, extent_w, extent_h);
    }
    RESIZER.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (resizer, packed) = &mut *guard;
        let row = src.width() as usize * 3;
        let src_bytes: &[u8] = if src.stride() == row {
            &src.as_bytes()[..row * src.height() as usize]
        } else {
            packed.clear();
            for y in 0..src.height() {
                packed.extend_from_slice(src.row(y));
            }
            packed
        };
        // The typed API instantiates the RGB8 kernels only (the untyped one compiles every pixel type).
        let src_img =
            TypedImageRef::<U8x3>::from_buffer(src.width(), src.height(), src_bytes).map_err(|e| err(e.to_string()))?;
        let dst_len = width as usize * height as usize * 3;
        let mut dst_img = TypedImage::<U8x3>::from_buffer(width, height, &mut out.as_bytes_mut()[..dst_len])
            .map_err(|e| err(e.to_string()))?;
        resizer.resize_typed(&src_img, &mut dst_img, &options).map_err(|e| err(e.to_string()))
    })
}

/// Resizes `src` (decoded from an original of `orig_w x orig_h`, possibly at a reduced DCT scale) to Ultralytics'
/// target size for `imgsz`, with the interpolation Ultralytics picks for the original. Returns `r`.
pub fn resize_long_side(
    src: &ImageRgb8,
    orig_w: u32,
    orig_h: u32,
    imgsz: u32,
    augment: bool,
    out: &mut ImageRgb8,
) -> Result<f64> {
    let (r, w, h) = target_size(orig_w, orig_h, imgsz);
    resize(src, w, h, Interpolation::ultralytics(r, augment), out)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_size_matches_ultralytics_arithmetic() {
        assert_eq!(target_size(640, 480, 640), (1.0, 640, 480));
        assert_eq!(target_size(500, 375, 320), (0.64, 320, 240));
        let (r, w, h) = target_size(423, 640, 320);
        assert_eq!((r, w, h), (0.5, 212, 320)); // ceil(211.5) = 212.
        let (r, w, h) = target_size(100, 30, 640);
        assert!(r > 1.0);
        assert_eq!((w, h), (640, 192));
        // Thin images never collapse to zero.
        assert_eq!(target_size(10_000, 1, 320).2, 1);
    }

    #[test]
    fn area_halving_is_the_mean_of_each_2x2_block() {
        let mut src = ImageRgb8::new(4, 2);
        let vals: [u8; 8] = [0, 10, 20, 30, 40, 50, 60, 70];
        for (i, v) in vals.iter().enumerate() {
            let (x, y) = ((i % 4) as u32, (i / 4) as u32);
            src.row_mut(y)[x as usize * 3..x as usize * 3 + 3].fill(*v);
        }
        let mut out = ImageRgb8::default();
        resize(&src, 2, 1, Interpolation::Area, &mut out).expect("resize");
        // (0 + 10 + 40 + 50) / 4 = 25 and (20 + 30 + 60 + 70) / 4 = 45.
        assert_eq!(out.as_bytes(), &[25, 25, 25, 45, 45, 45]);
    }

    #[test]
    fn strided_sources_and_zero_sizes() {
        let src = ImageRgb8::from_raw(2, 2, 8, vec![9; 16]).expect("valid");
        let mut out = ImageRgb8::default();
        resize(&src, 4, 4, Interpolation::Linear, &mut out).expect("resize");
        assert!(out.as_bytes().iter().all(|&v| v == 9));
        assert!(resize(&src, 0, 4, Interpolation::Linear, &mut out).is_err());
        assert!(resize(&ImageRgb8::default(), 4, 4, Interpolation::Area, &mut out).is_err());
    }
}
