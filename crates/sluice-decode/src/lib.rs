//! Sluice's image decoders: encoded bytes → RGB8 pixels in a caller-owned [`ImageRgb8`], implementing
//! [`sluice_core::Decoder`].
//!
//! - Backends behind features: [`ImageDecoder`] (`image`, default, pure Rust: JPEG, PNG, BMP, WebP; JPEGs at
//!   least 4× the requested size decoded at 1/4 or 1/8 scale through jpeg-decoder),
//!   `TurboJpegDecoder` (`turbojpeg`, libjpeg-turbo with DCT-domain scaling) and `NvJpegDecoder` (`nvjpeg`,
//!   NVIDIA nvJPEG on the GPU, full-size decodes only; libnvjpeg and libcudart are loaded at run time, so the
//!   feature builds without CUDA). [`Backend`] lists them at run time; one that is not compiled in answers with a
//!   "built without feature X" error, one that is compiled in but cannot run here (nvjpeg without its libraries or
//!   a GPU) with [`DecodeError::Unavailable`], and [`Backend::preferred`] / [`Backend::available`] skip it, so the
//!   CPU backends remain the fallback.
//! - EXIF orientation is applied; grayscale, gray+alpha, RGBA and CMYK sources come out as RGB8 (alpha dropped).
//! - [`decode_to_target`] / [`TargetDecoder`]: decode at a reduced DCT scale when the source is at least twice the
//!   training size, then resize the long side to `imgsz` as Ultralytics' `load_image` does ([`resize`]).
//! - Bad input gives a [`DecodeError`] (converted to [`sluice_core::Error::Decode`]), never a panic.
#![warn(missing_docs)]
// A build without any backend still compiles (every request answers "built without feature X"); the shared
// pixel helpers are then unused.
#![cfg_attr(not(any(feature = "image", feature = "turbojpeg", feature = "nvjpeg")), allow(dead_code))]

mod area;
mod backend;
mod error;
mod format;
#[cfg(feature = "image")]
mod image_backend;
#[cfg(feature = "nvjpeg")]
mod nvjpeg;
mod orient;
pub mod resize;
mod target;
#[cfg(feature = "turbojpeg")]
mod turbo;

pub use backend::Backend;
pub use error::{DecodeError, Result};
pub use format::{Format, dct_denominator, jpeg_orientation};
#[cfg(feature = "image")]
pub use image_backend::ImageDecoder;
#[cfg(feature = "nvjpeg")]
pub use nvjpeg::NvJpegDecoder;
pub use orient::Orientation;
pub use sluice_core::{DecodeHint, DecodeInfo, Decoder, ImageRgb8};
pub use target::{TargetDecoder, TargetInfo, TargetOptions, decode_to_target};
#[cfg(feature = "turbojpeg")]
pub use turbo::TurboJpegDecoder;

/// The default pixel limit of every backend: 2^27 (134 million) pixels, about 400 MB of RGB8. Larger images are
/// refused with [`DecodeError::TooLarge`] before any pixel buffer is allocated.
pub const DEFAULT_MAX_PIXELS: u64 = 1 << 27;
