//! The default, pure-Rust backend: JPEG (zune-jpeg), PNG, BMP and WebP through the `image` crate, decoding straight
//! into the caller's buffer when the source is RGB8 and upright, through a per-thread scratch buffer otherwise.
//!
//! zune-jpeg has no DCT-domain scaling. When the hint allows a 1/4 or 1/8 scale (the source is at least four times
//! the requested long side), a baseline or progressive 8-bit JPEG goes through jpeg-decoder's scaled IDCT instead
//! (IJG libjpeg 9's reduced transforms); at 1/2 it stays with zune-jpeg at full size, because jpeg-decoder's
//! 1/2-scale decode is no faster than zune-jpeg's full one, while its 1/4-scale decode is faster than zune-jpeg's
//! full decode before the resize is even counted (the figures and their command are in docs/bench-results.md).
//! CMYK, 12/16-bit and lossless JPEGs, and any file jpeg-decoder refuses, are decoded by zune-jpeg at
//! full size, so no image zune-jpeg reads is lost to the second decoder.

use std::cell::RefCell;
use std::io::Cursor;

use image::{ColorType, ImageDecoder as _, ImageReader, Limits};
use sluice_core::{DecodeHint, DecodeInfo, Decoder, ImageRgb8};

use crate::DEFAULT_MAX_PIXELS;
use crate::error::{DecodeError, Result};
use crate::format::{Format, JpegHeader, dct_denominator, jpeg_header};
use crate::orient::{Orientation, convert_into, orient_rgb};

const NAME: &str = "image";

/// The smallest DCT scale denominator decoded through jpeg-decoder (see the module header for the measurement).
const SCALED_MIN_DENOMINATOR: u32 = 4;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The `image`-crate backend. Stateless apart from its pixel limit; share one across threads.
#[derive(Debug, Clone, Copy)]
pub struct ImageDecoder {
    max_pixels: u64,
}

impl Default for ImageDecoder {
    fn default() -> Self {
        Self { max_pixels: DEFAULT_MAX_PIXELS }
    }
}

impl ImageDecoder {
    /// A decoder with the default pixel limit ([`DEFAULT_MAX_PIXELS`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses images with more than `max_pixels` pixels (decompression bombs, corrupt headers).
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// Decodes `bytes` into `out`: a JPEG at 1/4 or 1/8 scale when `hint` allows it (see the module header), any
    /// other image at full size.
    pub fn decode_rgb(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> Result<DecodeInfo> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty { backend: NAME });
        }
        let unsupported =
            || DecodeError::Unsupported { backend: NAME, len: bytes.len(), head: DecodeError::head(bytes) };
        let format = Format::sniff(bytes).ok_or_else(unsupported)?;
        // A JPEG's marker segments are walked once: the frame size for the reduced path, the orientation for both.
        let jpeg = (format == Format::Jpeg).then(|| jpeg_header(bytes));
        if let Some(head) = &jpeg
            && let Some(info) = self.decode_jpeg_scaled(bytes, head, hint, out)?
        {
            return Ok(info);
        }
        let image_format = match format {
            Format::Jpeg => image::ImageFormat::Jpeg,
            Format::Png => image::ImageFormat::Png,
            Format::Bmp => image::ImageFormat::Bmp,
            Format::WebP => image::ImageFormat::WebP,
            Format::Gif | Format::Tiff => return Err(unsupported()),
        };
        let corrupt = |e: image::ImageError| DecodeError::Corrupt {
            backend: NAME,
            format: format.name(),
            len: bytes.len(),
            reason: e.to_string(),
        };
        let mut reader = ImageReader::with_format(Cursor::new(bytes), image_format);
        let mut limits = Limits::default();
        limits.max_alloc = Some(self.max_pixels.saturating_mul(8));
        reader.limits(limits);
        let mut decoder = reader.into_decoder().map_err(corrupt)?;
        let (w, h) = decoder.dimensions();
        DecodeError::check_pixels(NAME, w, h, self.max_pixels)?;
        if w == 0 || h == 0 {
            return Err(DecodeError::Corrupt {
                backend: NAME,
                format: format.name(),
                len: bytes.len(),
                reason: format!("{w}x{h} image"),
            });
        }
        // A broken EXIF block must not fail an otherwise good image: it just means "upright".
        // A JPEG's orientation comes from the same marker walk and EXIF parser as the reduced path's and the
        // turbojpeg backend's (the `image` crate's own reader disagrees with it on some damaged EXIF blocks); other
        // formats' from `image`.
        let orientation = match &jpeg {
            Some(head) => head.orientation(),
            None => decoder.orientation().map(from_image_orientation).unwrap_or_default(),
        };
        let (ow, oh) = orientation.apply_to_size(w, h);
        let channels = match decoder.color_type() {
            ColorType::L8 => Some(1),
            ColorType::La8 => Some(2),
            ColorType::Rgb8 => Some(3),
            ColorType::Rgba8 => Some(4),
            _ => None,
        };
        match channels {
            Some(3) if orientation == Orientation::Normal => {
                out.reset(w, h);
                decoder.read_image(out.as_bytes_mut()).map_err(corrupt)?;
            }
            Some(c) => SCRATCH.with(|cell| -> Result<()> {
                let mut scratch = cell.borrow_mut();
                scratch.resize(w as usize * h as usize * c, 0);
                decoder.read_image(&mut scratch).map_err(corrupt)?;
                convert_into(&scratch, w, h, c, orientation, out);
                Ok(())
            })?,
            None => {
                // 16-bit and float images are rare: let `image` convert them.
                let rgb = image::DynamicImage::from_decoder(decoder).map_err(corrupt)?.into_rgb8();
                let rgb =
                    ImageRgb8::from_raw(w, h, w as usize * 3, rgb.into_raw()).map_err(|e| DecodeError::Corrupt {
                        backend: NAME,
                        format: format.name(),
                        len: bytes.len(),
                        reason: e.to_string(),
                    })?;
                orient_rgb(&rgb, orientation, out);
            }
        }
        Ok(DecodeInfo { orig_width: ow, orig_height: oh, scale: 1.0 })
    }
}

impl ImageDecoder {
    /// The reduced decode through jpeg-decoder: `Some` when the hint allows 1/4 or 1/8 and jpeg-decoder decoded the
    /// file at that scale; `None` for the full-size path (smaller reductions, formats it leaves to zune-jpeg, or a
    /// file it refuses: zune-jpeg then decodes it or reports why not).
    fn decode_jpeg_scaled(
        &self,
        bytes: &[u8],
        head: &JpegHeader<'_>,
        hint: DecodeHint,
        out: &mut ImageRgb8,
    ) -> Result<Option<DecodeInfo>> {
        use jpeg_decoder::{CodingProcess, PixelFormat};
        let Some((w, h)) = head.frame else { return Ok(None) };
        // The long side is the same whatever the EXIF orientation.
        let denom = dct_denominator(w.max(h), hint.min_long_side);
        if denom < SCALED_MIN_DENOMINATOR || w == 0 || h == 0 {
            return Ok(None);
        }
        DecodeError::check_pixels(NAME, w, h, self.max_pixels)?;
        let mut decoder = jpeg_decoder::Decoder::new(bytes);
        if decoder.read_info().is_err() {
            return Ok(None);
        }
        let Some(info) = decoder.info() else { return Ok(None) };
        let channels = match info.pixel_format {
            PixelFormat::L8 => 1,
            PixelFormat::RGB24 => 3,
            PixelFormat::L16 | PixelFormat::CMYK32 => return Ok(None),
        };
        if info.coding_process == CodingProcess::Lossless || (u32::from(info.width), u32::from(info.height)) != (w, h) {
            return Ok(None);
        }
        // jpeg-decoder picks the smallest scale whose size is at least the request; libjpeg rounds scaled sizes up.
        let (sw, sh) = (w.div_ceil(denom), h.div_ceil(denom));
        let Ok(scaled) = decoder.scale(sw as u16, sh as u16) else { return Ok(None) };
        if (u32::from(scaled.0), u32::from(scaled.1)) != (sw, sh) {
            return Ok(None);
        }
        let Ok(pixels) = decoder.decode() else { return Ok(None) };
        if pixels.len() != sw as usize * sh as usize * channels {
            return Ok(None);
        }
        let orientation = head.orientation();
        convert_into(&pixels, sw, sh, channels, orientation, out);
        let (ow, oh) = orientation.apply_to_size(w, h);
        Ok(Some(DecodeInfo { orig_width: ow, orig_height: oh, scale: 1.0 / denom as f32 }))
    }
}

fn from_image_orientation(o: image::metadata::Orientation) -> Orientation {
    use image::metadata::Orientation as O;
    match o {
        O::NoTransforms => Orientation::Normal,
        O::FlipHorizontal => Orientation::FlipHorizontal,
        O::Rotate180 => Orientation::Rotate180,
        O::FlipVertical => Orientation::FlipVertical,
        O::Rotate90FlipH => Orientation::Transpose,
        O::Rotate90 => Orientation::Rotate90,
        O::Rotate270FlipH => Orientation::Transverse,
        O::Rotate270 => Orientation::Rotate270,
    }
}

impl Decoder for ImageDecoder {
    fn decode(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> sluice_core::Result<DecodeInfo> {
        Ok(self.decode_rgb(bytes, hint, out)?)
    }

    fn name(&self) -> &str {
        NAME
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_orientation_mapping_agrees_with_exif_numbers() {
        for tag in 1..=8u8 {
            let o = image::metadata::Orientation::from_exif(tag).expect("valid tag");
            assert_eq!(from_image_orientation(o), Orientation::from_exif(u32::from(tag)), "tag {tag}");
        }
    }

    #[test]
    fn pixel_limit_is_enforced() {
        let png = include_bytes!("../tests/data/rgb.png");
        let mut out = ImageRgb8::default();
        let err = ImageDecoder::new()
            .with_max_pixels(100)
            .decode_rgb(png, DecodeHint::default(), &mut out)
            .expect_err("over the limit");
        assert!(matches!(err, DecodeError::TooLarge { width: 160, height: 120, .. }), "{err}");
    }
}
