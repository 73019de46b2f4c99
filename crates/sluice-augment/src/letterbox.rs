//! Ultralytics' `LetterBox` (resize keeping the aspect ratio, pad with grey 114, optionally stride-aligned) as
//! parameters plus a kernel that writes straight into a batch's CHW slot; `load_image`'s long-side resize; and the
//! rectangular validation batches of `YOLODataset.set_rectangle` (images sorted by aspect ratio, one padded,
//! stride-aligned shape per batch).

use serde::{Deserialize, Serialize};
use sluice_core::{BoxXyxy, ImageRgb8};

use crate::resample::{ResizeSplit, Sampler, resize_split};

/// The grey of letterbox padding and of every border (Ultralytics' `padding_value`, `borderValue`).
pub const FILL: u8 = 114;

/// Ultralytics `LetterBox` options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LetterboxOpts {
    /// Minimum rectangle: pad only up to the next multiple of `stride` (`auto`).
    pub auto: bool,
    /// Stretch to the new shape without padding (`scale_fill`).
    pub scale_fill: bool,
    /// Allow enlarging (`scaleup`; validation uses `false`).
    pub scaleup: bool,
    /// Centre the image (else top-left).
    pub center: bool,
    /// Stride for `auto`.
    pub stride: u32,
}

impl Default for LetterboxOpts {
    /// Ultralytics' defaults: `auto=False, scale_fill=False, scaleup=True, center=True, stride=32`.
    fn default() -> Self {
        Self { auto: false, scale_fill: false, scaleup: true, center: true, stride: 32 }
    }
}

/// The resolved letterbox of one image: how it is resized and where it lands on the canvas.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Letterbox {
    /// Box scale `(rx, ry)` (Ultralytics' `ratio`).
    pub ratio: (f64, f64),
    /// Size of the resized image `(w, h)` (Ultralytics' `new_unpad`).
    pub new_unpad: (u32, u32),
    /// Padding `[left, top, right, bottom]` in pixels.
    pub pad: [u32; 4],
    /// Canvas size `(w, h)`: `new_unpad` plus the padding.
    pub canvas: (u32, u32),
}

impl Letterbox {
    /// Ultralytics' `LetterBox.__call__` arithmetic for a `src_w x src_h` image and a `new_w x new_h` target,
    /// including its rounding: `new_unpad = round(side * r)` (half to even, as Python's `round`), padding split as
    /// `round(d - 0.1)` before and `round(d + 0.1)` after when centred.
    pub fn new(src_w: u32, src_h: u32, new_w: u32, new_h: u32, opts: LetterboxOpts) -> Self {
        let (sw, sh) = (f64::from(src_w.max(1)), f64::from(src_h.max(1)));
        let (nw, nh) = (f64::from(new_w), f64::from(new_h));
        let mut r = (nh / sh).min(nw / sw);
        if !opts.scaleup {
            r = r.min(1.0);
        }
        let mut ratio = (r, r);
        let mut unpad = ((sw * r).round_ties_even(), (sh * r).round_ties_even());
        let (mut dw, mut dh) = ((nw - unpad.0).max(0.0), (nh - unpad.1).max(0.0));
        if opts.auto {
            let s = f64::from(opts.stride.max(1));
            dw = dw.rem_euclid(s);
            dh = dh.rem_euclid(s);
        } else if opts.scale_fill {
            dw = 0.0;
            dh = 0.0;
            unpad = (nw, nh);
            ratio = (nw / sw, nh / sh);
        }
        if opts.center {
            dw /= 2.0;
            dh /= 2.0;
        }
        let (top, bottom) =
            (if opts.center { (dh - 0.1).round_ties_even() } else { 0.0 }, (dh + 0.1).round_ties_even());
        let (left, right) =
            (if opts.center { (dw - 0.1).round_ties_even() } else { 0.0 }, (dw + 0.1).round_ties_even());
        let new_unpad = (unpad.0 as u32, unpad.1 as u32);
        let pad = [left as u32, top as u32, right as u32, bottom as u32];
        Self { ratio, new_unpad, pad, canvas: (new_unpad.0 + pad[0] + pad[2], new_unpad.1 + pad[1] + pad[3]) }
    }

    /// Maps a box of the source image onto the canvas (Ultralytics: scale by `ratio`, add `(left, top)`).
    pub fn map_box(&self, b: &BoxXyxy) -> BoxXyxy {
        let (rx, ry) = (self.ratio.0 as f32, self.ratio.1 as f32);
        b.scale_shift(rx, ry, self.pad[0] as f32, self.pad[1] as f32)
    }

    /// Maps a canvas box back to the source image (the inverse of [`Self::map_box`], e.g. for predictions).
    pub fn unmap_box(&self, b: &BoxXyxy) -> BoxXyxy {
        let (rx, ry) = (self.ratio.0 as f32, self.ratio.1 as f32);
        let (l, t) = (self.pad[0] as f32, self.pad[1] as f32);
        BoxXyxy::new((b.x1 - l) / rx, (b.y1 - t) / ry, (b.x2 - l) / rx, (b.y2 - t) / ry)
    }

    /// Maps a canvas box back to its `w0 x h0` source as Ultralytics 8.4's `scale_boxes` does for predictions:
    /// each axis by the gain of the rounded resize (`new_unpad / source`, which differs from [`Self::ratio`] by the
    /// rounding of the resized side), after removing the padding.
    pub fn unmap_box_rounded(&self, b: &BoxXyxy, w0: u32, h0: u32) -> BoxXyxy {
        let gx = (f64::from(self.new_unpad.0) / f64::from(w0.max(1))) as f32;
        let gy = (f64::from(self.new_unpad.1) / f64::from(h0.max(1))) as f32;
        let (l, t) = (self.pad[0] as f32, self.pad[1] as f32);
        BoxXyxy::new((b.x1 - l) / gx, (b.y1 - t) / gy, (b.x2 - l) / gx, (b.y2 - t) / gy)
    }
}

/// `BaseDataset.load_image`'s resize (`rect_mode`): the long side becomes `imgsz`, the other
/// `min(ceil(side * r), imgsz)`; unchanged when the long side already is `imgsz`.
pub fn load_size(w0: u32, h0: u32, imgsz: u32) -> (u32, u32) {
    let long = w0.max(h0);
    if long == 0 || long == imgsz {
        return (w0, h0);
    }
    let r = f64::from(imgsz) / f64::from(long);
    let side = |s: u32| ((f64::from(s) * r).ceil() as u32).min(imgsz);
    (side(w0), side(h0))
}

/// Resizes `src` to `new_unpad` (bilinear, OpenCV's half-pixel mapping) and pads it into a
/// `canvas.0 x canvas.1` CHW u8 slot (`out.len() == 3 * w * h`), grey [`FILL`] outside.
///
/// `src` may be larger or smaller than the image the letterbox was computed for (a decoder may hand out a
/// downscaled image, `load_image` may have resized it first): the resampling maps the whole of `src` onto the
/// `new_unpad` rectangle, which composes those resizes into one.
pub fn letterbox_into(src: &ImageRgb8, lb: &Letterbox, out: &mut [u8]) {
    let (cw, ch) = (lb.canvas.0 as usize, lb.canvas.1 as usize);
    let plane = cw * ch;
    debug_assert_eq!(out.len(), 3 * plane);
    out.fill(FILL);
    let Some(sampler) = Sampler::new(src) else { return };
    let (uw, uh) = lb.new_unpad;
    let (left, top) = (lb.pad[0] as usize, lb.pad[1] as usize);
    // cv2.resize's scale and source positions, in double and rounded to float afterwards, as OpenCV computes them.
    let kx = f64::from(src.width()) / f64::from(uw.max(1));
    let ky = f64::from(src.height()) / f64::from(uh.max(1));
    let (rp, rest) = out.split_at_mut(plane);
    let (gp, bp) = rest.split_at_mut(plane);
    if (uw, uh) == (src.width(), src.height()) {
        // No resize (the common validation case: the long side already is imgsz): the bilinear weights are all
        // zero, so the sample is the pixel itself. Copy rows, splitting the channels.
        for v in 0..uh as usize {
            let row = (top + v) * cw + left;
            let (r, g, b) = (&mut rp[row..row + uw as usize], &mut gp[row..], &mut bp[row..]);
            for (u, px) in src.row(v as u32).chunks_exact(3).enumerate() {
                r[u] = px[0];
                g[u] = px[1];
                b[u] = px[2];
            }
        }
        return;
    }
    // The horizontal positions and weights are the same on every row: split once per call into a buffer kept by
    // the thread (no allocation in steady state).
    thread_local! {
        static COLUMNS: std::cell::RefCell<Vec<ResizeSplit>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    COLUMNS.with_borrow_mut(|cols| {
        cols.clear();
        cols.extend((0..uw as usize).map(|u| resize_split(u, kx, src.width() as usize)));
        for v in 0..uh as usize {
            let ys = resize_split(v, ky, src.height() as usize);
            let row = (top + v) * cw + left;
            for (u, &xs) in cols.iter().enumerate() {
                // cv2.resize's rounding, which Ultralytics' LetterBox uses (not the exact one of the warps).
                let px = sampler.sample_resize(xs, ys);
                rp[row + u] = px[0];
                gp[row + u] = px[1];
                bp[row + u] = px[2];
            }
        }
    });
}

/// Rectangular batches (`YOLODataset.set_rectangle`): the visiting order and one canvas shape per batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RectPlan {
    /// Image indices in visiting order (sorted by aspect ratio `h / w`, stable for ties).
    pub order: Vec<usize>,
    /// Canvas `(w, h)` of each batch of `batch_size` consecutive entries of `order`.
    pub shapes: Vec<(u32, u32)>,
    /// The batch size the plan was made for.
    pub batch_size: usize,
}

impl RectPlan {
    /// Plans rect batches for images of sizes `sizes` (`(w, h)`, original pixels): sort by `h / w`; per batch,
    /// shape `[h, w]` is `[max_ar, 1]` when every ratio is below 1, `[1, 1 / min_ar]` when every ratio is above 1,
    /// else `[1, 1]`; canvas = `ceil(shape * imgsz / stride + pad) * stride` (Ultralytics uses `pad = 0.5` for
    /// validation, 0 for rect training).
    pub fn new(sizes: &[(u32, u32)], batch_size: usize, imgsz: u32, stride: u32, pad: f64) -> Self {
        let batch_size = batch_size.max(1);
        let ar: Vec<f64> = sizes.iter().map(|&(w, h)| f64::from(h) / f64::from(w.max(1))).collect();
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        order.sort_by(|&a, &b| ar[a].total_cmp(&ar[b]));
        let stride_f = f64::from(stride.max(1));
        let shapes = order
            .chunks(batch_size)
            .map(|chunk| {
                let (mut mini, mut maxi) = (f64::INFINITY, f64::NEG_INFINITY);
                for &i in chunk {
                    mini = mini.min(ar[i]);
                    maxi = maxi.max(ar[i]);
                }
                let (sh, sw) = if maxi < 1.0 {
                    (maxi, 1.0)
                } else if mini > 1.0 {
                    (1.0, 1.0 / mini)
                } else {
                    (1.0, 1.0)
                };
                let side = |s: f64| ((s * f64::from(imgsz) / stride_f + pad).ceil() * stride_f) as u32;
                (side(sw), side(sh))
            })
            .collect();
        Self { order, shapes, batch_size }
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        self.shapes.len()
    }

    /// Whether there is no batch.
    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// Image indices of batch `b`.
    pub fn batch(&self, b: usize) -> &[usize] {
        let start = (b * self.batch_size).min(self.order.len());
        let end = (start + self.batch_size).min(self.order.len());
        &self.order[start..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letterbox_matches_ultralytics_arithmetic() {
        // coco128 000000000025.jpg (640x426) at 320: ratio 0.5, 320x213, padding top/bottom 53/54.
        let lb = Letterbox::new(640, 426, 320, 320, LetterboxOpts::default());
        assert_eq!((lb.ratio, lb.new_unpad, lb.pad, lb.canvas), ((0.5, 0.5), (320, 213), [0, 53, 0, 54], (320, 320)));
        // Python's round is half to even: 425 * 0.5 = 212.5 -> 212.
        let lb = Letterbox::new(850, 425, 425, 425, LetterboxOpts::default());
        assert_eq!(lb.new_unpad, (425, 212));
        // auto: only up to the stride.
        let lb = Letterbox::new(640, 426, 640, 640, LetterboxOpts { auto: true, ..LetterboxOpts::default() });
        assert_eq!((lb.pad, lb.canvas), ([0, 11, 0, 11], (640, 448)));
        // scaleup off: a small image is only padded.
        let lb = Letterbox::new(100, 50, 640, 640, LetterboxOpts { scaleup: false, ..LetterboxOpts::default() });
        assert_eq!((lb.ratio.0, lb.new_unpad, lb.pad), (1.0, (100, 50), [270, 295, 270, 295]));
        // Not centred: all padding right/bottom.
        let lb = Letterbox::new(640, 426, 640, 640, LetterboxOpts { center: false, ..LetterboxOpts::default() });
        assert_eq!(lb.pad, [0, 0, 0, 214]);
        // scale_fill stretches.
        let lb = Letterbox::new(640, 426, 320, 320, LetterboxOpts { scale_fill: true, ..LetterboxOpts::default() });
        assert_eq!((lb.new_unpad, lb.pad), ((320, 320), [0, 0, 0, 0]));
        assert!((lb.ratio.1 - 320.0 / 426.0).abs() < 1e-12);
    }

    #[test]
    fn box_round_trip_is_exact_for_dyadic_ratios() {
        let lb = Letterbox::new(640, 480, 320, 320, LetterboxOpts::default());
        let b = BoxXyxy::new(10.5, 20.25, 300.0, 479.0);
        let m = lb.map_box(&b);
        assert_eq!(m, BoxXyxy::new(5.25, 50.125, 150.0, 279.5));
        assert_eq!(lb.unmap_box(&m), b);
    }

    #[test]
    fn load_size_uses_ceil_and_caps() {
        assert_eq!(load_size(640, 480, 640), (640, 480));
        assert_eq!(load_size(640, 427, 320), (320, 214)); // 213.5 -> ceil
        assert_eq!(load_size(500, 375, 640), (640, 480));
        assert_eq!(load_size(1000, 1000, 333), (333, 333));
    }

    #[test]
    fn letterbox_kernel_pads_and_resizes() {
        let mut src = ImageRgb8::new(4, 2);
        for (i, b) in src.as_bytes_mut().iter_mut().enumerate() {
            *b = (i * 10) as u8;
        }
        let lb = Letterbox::new(4, 2, 2, 2, LetterboxOpts::default());
        assert_eq!((lb.new_unpad, lb.pad), ((2, 1), [0, 0, 0, 1]));
        let mut out = vec![0u8; 12];
        letterbox_into(&src, &lb, &mut out);
        // Each output pixel is the 2x2 average of the source block (rows 0 and 1, half-pixel mapping).
        let avg = |x: usize, c: usize| {
            let p = |xx: usize, yy: usize| u32::from(src.pixel(xx as u32, yy as u32)[c]);
            ((p(2 * x, 0) + p(2 * x + 1, 0) + p(2 * x, 1) + p(2 * x + 1, 1) + 2) / 4) as u8
        };
        for c in 0..3 {
            assert_eq!(out[c * 4], avg(0, c));
            assert_eq!(out[c * 4 + 1], avg(1, c));
            assert_eq!(&out[c * 4 + 2..c * 4 + 4], &[FILL, FILL]);
        }
    }

    #[test]
    fn unscaled_letterbox_copies_pixels_exactly() {
        let mut src = ImageRgb8::new(7, 3);
        for (i, b) in src.as_bytes_mut().iter_mut().enumerate() {
            *b = (i * 37 % 251) as u8;
        }
        let lb = Letterbox::new(7, 3, 9, 8, LetterboxOpts { scaleup: false, ..LetterboxOpts::default() });
        assert_eq!((lb.new_unpad, lb.pad), ((7, 3), [1, 2, 1, 3]));
        let mut out = vec![0u8; 3 * 9 * 8];
        letterbox_into(&src, &lb, &mut out);
        let sampler = Sampler::new(&src).expect("non-empty");
        for y in 0..8 {
            for x in 0..9 {
                let got = [out[y * 9 + x], out[72 + y * 9 + x], out[144 + y * 9 + x]];
                let inside = (1..8).contains(&x) && (2..5).contains(&y);
                let want = if inside { sampler.sample((x - 1) as f32, (y - 2) as f32) } else { [FILL; 3] };
                assert_eq!(got, want, "({x}, {y})");
            }
        }
    }

    #[test]
    fn rect_plan_follows_set_rectangle() {
        // Two landscape 640x480, one portrait 480x640, one square; batch 2, imgsz 640, stride 32, pad 0.5.
        let sizes = [(640, 480), (480, 640), (640, 480), (500, 500)];
        let plan = RectPlan::new(&sizes, 2, 640, 32, 0.5);
        assert_eq!(plan.order, vec![0, 2, 3, 1]);
        // Batch 0: both ar 0.75 -> [0.75, 1] * 20 + 0.5 -> ceil(15.5)=16, ceil(20.5)=21 -> (672, 512).
        // Batch 1: ar 1.0 and 1.333 -> mixed -> [1, 1] -> 21 * 32 = 672 square.
        assert_eq!(plan.shapes, vec![(672, 512), (672, 672)]);
        assert_eq!(plan.batch(1), &[3, 1]);
        assert_eq!(plan.len(), 2);
    }
}
