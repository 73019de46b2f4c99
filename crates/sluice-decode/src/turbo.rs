//! The libjpeg-turbo backend (feature `turbojpeg`): SIMD JPEG decoding with DCT-domain scaling (1/2, 1/4, 1/8)
//! straight into the caller's buffer. One TurboJPEG handle per thread. Non-JPEG input goes to the `image` backend
//! when that is compiled in, and is refused otherwise.

use std::cell::RefCell;

use sluice_core::{DecodeHint, DecodeInfo, Decoder, ImageRgb8};
use turbojpeg::{Colorspace, Decompressor, PixelFormat, ScalingFactor};

use crate::DEFAULT_MAX_PIXELS;
use crate::error::{DecodeError, Result};
use crate::format::{dct_denominator, jpeg_orientation};
use crate::orient::{Orientation, convert_into};

const NAME: &str = "turbojpeg";

thread_local! {
    static HANDLE: RefCell<Option<Decompressor>> = const { RefCell::new(None) };
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The libjpeg-turbo backend. Share one across threads; each thread lazily gets its own TurboJPEG handle.
#[derive(Debug, Clone, Copy)]
pub struct TurboJpegDecoder {
    max_pixels: u64,
}

impl Default for TurboJpegDecoder {
    fn default() -> Self {
        Self { max_pixels: DEFAULT_MAX_PIXELS }
    }
}

impl TurboJpegDecoder {
    /// A decoder with the default pixel limit ([`DEFAULT_MAX_PIXELS`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Refuses images with more than `max_pixels` pixels.
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Self {
        self.max_pixels = max_pixels;
        self
    }

    /// Decodes `bytes` into `out`, at a reduced DCT scale when `hint` allows it.
    pub fn decode_rgb(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> Result<DecodeInfo> {
        if bytes.is_empty() {
            return Err(DecodeError::Empty { backend: NAME });
        }
        if let Some(other) = crate::format::non_jpeg(NAME, bytes, self.max_pixels, out) {
            return other;
        }
        let corrupt = |e: turbojpeg::Error| DecodeError::Corrupt {
            backend: NAME,
            format: "JPEG",
            len: bytes.len(),
            reason: e.to_string(),
        };
        HANDLE.with(|cell| {
            let mut slot = cell.borrow_mut();
            let decompressor = match &mut *slot {
                Some(d) => d,
                none => none.insert(Decompressor::new().map_err(corrupt)?),
            };
            let header = decompressor.read_header(bytes).map_err(corrupt)?;
            let (w, h) = (header.width as u64, header.height as u64);
            if w * h > self.max_pixels || w > u64::from(u32::MAX) || h > u64::from(u32::MAX) {
                return Err(DecodeError::TooLarge { backend: NAME, width: w, height: h, limit: self.max_pixels });
            }
            let orientation = jpeg_orientation(bytes);
            let (ow, oh) = orientation.apply_to_size(w as u32, h as u32);
            let denom = if header.is_lossless { 1 } else { dct_denominator(ow.max(oh), hint.min_long_side) } as usize;
            let factor = ScalingFactor::new(1, denom);
            decompressor.set_scaling_factor(factor).map_err(corrupt)?;
            let scaled = header.scaled(factor);
            let (sw, sh) = (scaled.width, scaled.height);
            let cmyk = matches!(header.colorspace, Colorspace::CMYK | Colorspace::YCCK);
            if !cmyk && orientation == Orientation::Normal {
                out.reset(sw as u32, sh as u32);
                let image = turbojpeg::Image {
                    pixels: &mut out.as_bytes_mut()[..sw * sh * 3],
                    width: sw,
                    pitch: sw * 3,
                    height: sh,
                    format: PixelFormat::RGB,
                };
                decompressor.decompress(bytes, image).map_err(corrupt)?;
            } else {
                SCRATCH.with(|scratch| -> Result<()> {
                    let mut scratch = scratch.borrow_mut();
                    let channels = if cmyk { 4 } else { 3 };
                    scratch.resize(sw * sh * channels, 0);
                    let image = turbojpeg::Image {
                        pixels: &mut scratch[..],
                        width: sw,
                        pitch: sw * channels,
                        height: sh,
                        format: if cmyk { PixelFormat::CMYK } else { PixelFormat::RGB },
                    };
                    decompressor.decompress(bytes, image).map_err(corrupt)?;
                    if cmyk {
                        cmyk_to_rgb_in_place(&mut scratch);
                    }
                    convert_into(&scratch, sw as u32, sh as u32, 3, orientation, out);
                    Ok(())
                })?;
            }
            Ok(DecodeInfo { orig_width: ow, orig_height: oh, scale: 1.0 / denom as f32 })
        })
    }
}

/// Converts libjpeg's CMYK output (Adobe-style inverted values, as Photoshop and Pillow write them) to packed RGB
/// in place, with Pillow's arithmetic (`CMYK;I` unpacking, then `R = (255 - K) - (C * (255 - K)) / 255` with its
/// rounded division), so both agree exactly.
fn cmyk_to_rgb_in_place(buf: &mut Vec<u8>) {
    let muldiv255 = |a: u32, b: u32| {
        let t = a * b + 128;
        (t + (t >> 8)) >> 8
    };
    let n = buf.len() / 4;
    for i in 0..n {
        let nk = u32::from(buf[4 * i + 3]); // Stored inverted: 255 - K.
        for ch in 0..3 {
            let c = 255 - u32::from(buf[4 * i + ch]);
            buf[3 * i + ch] = (nk - muldiv255(c, nk)) as u8;
        }
    }
    buf.truncate(n * 3);
}

impl Decoder for TurboJpegDecoder {
    fn decode(&self, bytes: &[u8], hint: DecodeHint, out: &mut ImageRgb8) -> sluice_core::Result<DecodeInfo> {
        Ok(self.decode_rgb(bytes, hint, out)?)
    }

    fn name(&self) -> &str {
        NAME
    }
}
