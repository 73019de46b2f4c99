//! Decode to the training size: ask the backend for a reduced DCT scale (when the source is at least twice the
//! target), then resize the long side to `imgsz` exactly as Ultralytics' `load_image` does. Available as a
//! function with caller-owned buffers and as a [`Decoder`] wrapper for the pipeline.

use std::cell::RefCell;

use sluice_core::{DecodeHint, DecodeInfo, Decoder, ImageRgb8};

use crate::resize::{Interpolation, target_size};

/// How to reach the training size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOptions {
    /// The training size: the long side after resizing.
    pub imgsz: u32,
    /// Ultralytics resizes with linear interpolation while augmenting (training) and with area interpolation
    /// when shrinking otherwise.
    pub augment: bool,
    /// Let the backend decode at 1/2, 1/4 or 1/8 scale when the source is at least twice `imgsz`.
    pub dct_scaling: bool,
}

impl TargetOptions {
    /// Long side `imgsz`, no augmentation, DCT scaling on.
    pub fn new(imgsz: u32) -> Self {
        Self { imgsz, augment: false, dct_scaling: true }
    }
}

/// What [`decode_to_target`] produced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TargetInfo {
    /// Original width after EXIF orientation (the frame labels refer to).
    pub orig_width: u32,
    /// Original height after EXIF orientation.
    pub orig_height: u32,
    /// The DCT scale the backend decoded at (1, 1/2, 1/4, 1/8).
    pub dct_scale: f32,
    /// Ultralytics' ratio `imgsz / max(orig_width, orig_height)`.
    pub ratio: f64,
}

/// Decodes `bytes` with `decoder` into `scratch`, then resizes into `out` to Ultralytics' target size for
/// `opts.imgsz` (`out` receives the decoded pixels unchanged when they already have that size).
pub fn decode_to_target(
    decoder: &dyn Decoder,
    bytes: &[u8],
    opts: TargetOptions,
    scratch: &mut ImageRgb8,
    out: &mut ImageRgb8,
) -> sluice_core::Result<TargetInfo> {
    let hint = DecodeHint { min_long_side: opts.dct_scaling.then_some(opts.imgsz) };
    let info = decoder.decode(bytes, hint, scratch)?;
    let (ratio, w, h) = target_size(info.orig_width, info.orig_height, opts.imgsz);
    if (scratch.width(), scratch.height()) == (w, h) {
        std::mem::swap(scratch, out);
    } else {
        // The exact region the decoded pixels stand for (see `resize_region`).
        let s = f64::from(info.scale);
        let ew = (f64::from(info.orig_width) * s).min(f64::from(scratch.width()));
        let eh = (f64::from(info.orig_height) * s).min(f64::from(scratch.height()));
        let interp = Interpolation::ultralytics(ratio, opts.augment);
        crate::resize::resize_region(scratch, ew, eh, w, h, interp, out)?;
    }
    Ok(TargetInfo { orig_width: info.orig_width, orig_height: info.orig_height, dct_scale: info.scale, ratio })
}

thread_local! {
    static DECODED: RefCell<ImageRgb8> = RefCell::new(ImageRgb8::default());
}

/// A [`Decoder`] that decodes to the training size (see [`decode_to_target`]); its intermediate full/DCT-scaled
/// image lives in a per-thread buffer. [`DecodeInfo::scale`] is Ultralytics' ratio `r`; the hint passed to
/// `decode` is ignored (the wrapper's own `imgsz` decides).
///
/// It holds a `Box<dyn Decoder>` because sluice-core's blanket `Decoder` impl for closures rules out forwarding
/// impls for `Box`/`Arc`/`&` (they could overlap), so a generic wrapper could not take a boxed backend.
pub struct TargetDecoder {
    inner: Box<dyn Decoder>,
    opts: TargetOptions,
    name: String,
}

impl std::fmt::Debug for TargetDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetDecoder").field("name", &self.name).field("opts", &self.opts).finish()
    }
}

impl TargetDecoder {
    /// Wraps `inner` (e.g. `Backend::Image.decoder()?`).
    pub fn new(inner: Box<dyn Decoder>, opts: TargetOptions) -> Self {
        let name = format!("{}@{}{}", inner.name(), opts.imgsz, if opts.dct_scaling { "" } else { "-nodct" });
        Self { inner, opts, name }
    }

    /// The options.
    pub fn options(&self) -> TargetOptions {
        self.opts
    }
}

impl Decoder for TargetDecoder {
    fn decode(&self, bytes: &[u8], _hint: DecodeHint, out: &mut ImageRgb8) -> sluice_core::Result<DecodeInfo> {
        DECODED.with(|cell| {
            // A decoder never calls itself, so the per-thread buffer is never borrowed twice; fall back to a
            // fresh buffer rather than panic if a user-supplied inner decoder ever does.
            let mut fresh = ImageRgb8::default();
            let mut guard = cell.try_borrow_mut();
            let scratch = match guard.as_deref_mut() {
                Ok(s) => s,
                Err(_) => &mut fresh,
            };
            let t = decode_to_target(&*self.inner, bytes, self.opts, scratch, out)?;
            Ok(DecodeInfo { orig_width: t.orig_width, orig_height: t.orig_height, scale: t.ratio as f32 })
        })
    }

    fn name(&self) -> &str {
        &self.name
    }
}
