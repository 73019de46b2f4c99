//! Bilinear sampling of an RGB8 image at a continuous pixel position, in fixed point: OpenCV's `INTER_LINEAR`
//! conventions (pixel centres at integer coordinates, 11-bit weights, edge pixels replicated when the position
//! is clamped to the image), shared by the letterbox and the fused sampler.

use sluice_core::ImageRgb8;

/// Fractional bits of the interpolation weights (OpenCV's `INTER_RESIZE_COEF_BITS`).
const COEF_BITS: u32 = 11;
const COEF_ONE: u32 = 1 << COEF_BITS;
const ROUND: u32 = 1 << (2 * COEF_BITS - 1);

/// A borrowed view of an image's pixels for fast sampling.
#[derive(Debug, Clone, Copy)]
pub struct Sampler<'a> {
    data: &'a [u8],
    stride: usize,
    /// Largest valid x index.
    max_x: f32,
    /// Largest valid y index.
    max_y: f32,
    last_x: usize,
    last_y: usize,
    /// Bytes of one row's pixels (`3 width`, without the stride's padding).
    row_len: usize,
}

/// Integer part and 11-bit weight of a clamped coordinate (`v >= 0`): how [`Sampler::sample_clamped`] splits
/// each axis.
#[inline(always)]
fn split(v: f32) -> (usize, u32) {
    // Truncation is floor for v >= 0; i32 conversions are single instructions, usize ones are not.
    let i = v as i32;
    // Round half up without a libm call (`f32::round` is not an instruction on baseline x86-64).
    let w = ((v - i as f32) * COEF_ONE as f32 + 0.5) as i32 as u32;
    (i as usize, w)
}

/// A source position of `cv2.resize` on one axis: the first pixel and the weights of it and the next.
pub type ResizeSplit = (usize, i32, i32);

/// `cv2.resize`'s `INTER_LINEAR` source position and 11-bit weights for destination index `d` at `scale` (source /
/// destination), on an axis of `n_src` pixels: the position `(d + 0.5)·scale − 0.5` in double, rounded to float; its
/// floor, clamped to the axis (with the weight of the next pixel then 0); `w0 = rint((1 − f)·2048)`, `w1 = 2048 −
/// w0`.
pub fn resize_split(d: usize, scale: f64, n_src: usize) -> ResizeSplit {
    let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
    let s = f.floor();
    let (mut i, mut frac) = (s as i64, f - s);
    if i < 0 {
        (i, frac) = (0, 0.0);
    }
    if i >= n_src as i64 - 1 {
        (i, frac) = ((n_src as i64 - 1).max(0), 0.0);
    }
    let w0 = ((1.0 - frac) * COEF_ONE as f32).round_ties_even() as i32;
    (i as usize, w0, COEF_ONE as i32 - w0)
}

/// The two source rows and the vertical weight of one clamped `y`: what [`Sampler::sample_clamped`] reads at that
/// `y` for every `x`, fetched once for a run of samples on the same source row (identical results).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SampleRows<'a> {
    top: &'a [u8],
    bottom: &'a [u8],
    wy: u32,
    last_x: usize,
}

/// [`split`] for `0 <= v < 2^23` without the saturating float → int conversion, which does not vectorise: the
/// nearest integer by adding and removing 2^23 (where the float spacing is 1), minus one where that rounded up,
/// read off the float's bits. The same `(index, weight)` as `split` (tested).
#[inline(always)]
fn split_run(v: f32) -> (u32, u32) {
    const MAGIC: f32 = 8_388_608.0;
    let floor = |v: f32| {
        let r = (v + MAGIC) - MAGIC;
        if r > v { r - 1.0 } else { r }
    };
    let i = floor(v);
    let w = floor((v - i) * COEF_ONE as f32 + 0.5);
    ((i + MAGIC).to_bits() - MAGIC.to_bits(), (w + MAGIC).to_bits() - MAGIC.to_bits())
}

/// Most samples [`SampleRows::sample_run`] takes at once.
pub(crate) const RUN: usize = 64;

/// Most source columns a run interpolates vertically first (a run stepping by up to 4 source pixels).
const RUN_COLS: usize = 4 * RUN + 2;

/// Largest source width (exclusive) [`SampleRows::sample_run`] takes: its positions stay below 2^23.
pub(crate) const RUN_MAX_WIDTH: f32 = 8_388_608.0;

/// Buffers of [`SampleRows::sample_run`], on the stack of the caller's row loop (zeroed once per sample, not per
/// run).
#[derive(Debug, Clone)]
pub(crate) struct RunScratch {
    /// The caller's source x positions of the run.
    pub(crate) xs: [f32; RUN],
    col: [u32; RUN],
    wx: [u32; RUN],
    /// One column more than the run may use: the right neighbour read (with weight 0) at the last column.
    vert: [u32; 3 * (RUN_COLS + 1)],
}

impl RunScratch {
    pub(crate) fn new() -> Self {
        Self { xs: [0.0; RUN], col: [0; RUN], wx: [0; RUN], vert: [0; 3 * (RUN_COLS + 1)] }
    }
}

impl SampleRows<'_> {
    /// `Sampler::sample_clamped(x, y)` at this row's `y` for each of `scratch.xs[..n]` (clamped, each below
    /// [`RUN_MAX_WIDTH`], `n` at most [`RUN`]), written into the channel rows `r`, `g`, `b`.
    ///
    /// When the run's source columns are few enough, vertically first: `ay top + wy bottom` once per source byte,
    /// then `(ax v0 + wx v1 + round) >> 22` per output channel. That is the same integer as `sample_clamped`'s
    /// `((ax t0 + wx t1) ay + (ax b0 + wx b1) wy + round) >> 22` (distributivity; every term stays below 2^31), with
    /// half the multiplications per sample. At the last column `wx` is 0 (the position is clamped to it), so
    /// whatever `v1` holds there counts for nothing, as `sample_clamped`'s re-read of the same pixel does.
    #[inline(always)]
    pub(crate) fn sample_run(&self, scratch: &mut RunScratch, n: usize, r: &mut [u8], g: &mut [u8], b: &mut [u8]) {
        let RunScratch { xs, col, wx, vert } = scratch;
        let n = n.min(RUN).min(r.len()).min(g.len()).min(b.len());
        let (Some(&first), Some(&last)) = (xs[..n].first(), xs[..n].last()) else {
            return;
        };
        let xs = &xs[..n];
        let ay = COEF_ONE - self.wy;
        // A run's positions are monotonic (an affine function of the pixel index through monotonic roundings and
        // a clamp), so its columns lie between the floors of its two ends.
        let (x_lo, x_hi) = (first.min(last), first.max(last));
        let lo = split_run(x_lo).0 as usize;
        let hi = (split_run(x_hi).0 as usize + 1).min(self.last_x);
        if lo <= hi && hi - lo < RUN_COLS {
            for ((c, w), &x) in col.iter_mut().zip(wx.iter_mut()).zip(xs) {
                let (i, v) = split_run(x);
                // Byte offset into `vert`: `i >= lo` (floor is monotonic).
                (*c, *w) = (i.wrapping_sub(lo as u32).wrapping_mul(3), v);
            }
            let bytes = lo * 3..(hi + 1) * 3;
            // Weights are at most 2^11: as u16 factors the products vectorise as 16-bit multiplications.
            let (ay, wy) = (ay as u16, self.wy as u16);
            for ((v, &t), &b) in vert.iter_mut().zip(&self.top[bytes.clone()]).zip(&self.bottom[bytes]) {
                *v = u32::from(u16::from(t)) * u32::from(ay) + u32::from(u16::from(b)) * u32::from(wy);
            }
            let out = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()).zip(col.iter()).zip(wx.iter());
            for ((((r, g), b), &i), &wx) in out {
                // A no-op for monotonic positions; keeps the index inside `vert` whatever they are.
                let i = (i as usize).min(3 * (RUN_COLS - 1));
                let v = &vert[i..i + 6];
                let ax = COEF_ONE - wx;
                // Red and green as two 32-bit lanes of one u64: each lane's sum stays below 2^31, so no carry
                // crosses into the other lane.
                let pair = |c: usize| u64::from(v[c]) | u64::from(v[c + 1]) << 32;
                const ROUND2: u64 = (ROUND as u64) << 32 | ROUND as u64;
                let rg = pair(0) * u64::from(ax) + pair(3) * u64::from(wx) + ROUND2;
                *r = (rg >> (2 * COEF_BITS)) as u8;
                *g = (rg >> (32 + 2 * COEF_BITS)) as u8;
                *b = ((v[2] * ax + v[5] * wx + ROUND) >> (2 * COEF_BITS)) as u8;
            }
            return;
        }
        for ((c, w), &x) in col.iter_mut().zip(wx.iter_mut()).zip(xs) {
            (*c, *w) = split_run(x);
        }
        let out = r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()).zip(col.iter()).zip(wx.iter());
        for ((((r, g), b), &c), &wx) in out {
            let x0 = c as usize;
            let dx = if x0 < self.last_x { 3 } else { 0 };
            let i = x0 * 3;
            let (t, bt) = (&self.top[i..i + dx + 3], &self.bottom[i..i + dx + 3]);
            let ax = COEF_ONE - wx;
            let px = |c: usize| {
                let top = u32::from(t[c]) * ax + u32::from(t[dx + c]) * wx;
                let bottom = u32::from(bt[c]) * ax + u32::from(bt[dx + c]) * wx;
                ((top * ay + bottom * self.wy + ROUND) >> (2 * COEF_BITS)) as u8
            };
            (*r, *g, *b) = (px(0), px(1), px(2));
        }
    }
}

impl<'a> Sampler<'a> {
    /// A sampler over `img`; `None` when the image has no pixels.
    pub fn new(img: &'a ImageRgb8) -> Option<Self> {
        if img.width() == 0 || img.height() == 0 {
            return None;
        }
        Some(Self {
            data: img.as_bytes(),
            stride: img.stride(),
            max_x: (img.width() - 1) as f32,
            max_y: (img.height() - 1) as f32,
            last_x: img.width() as usize - 1,
            last_y: img.height() as usize - 1,
            row_len: img.width() as usize * 3,
        })
    }

    /// Largest valid x index.
    pub fn max_x(&self) -> f32 {
        self.max_x
    }

    /// Largest valid y index.
    pub fn max_y(&self) -> f32 {
        self.max_y
    }

    /// The bilinear sample at `(x, y)`, which the caller has clamped to `[0, max_x] x [0, max_y]`.
    #[inline(always)]
    pub fn sample_clamped(&self, x: f32, y: f32) -> [u8; 3] {
        debug_assert!((0.0..=self.max_x).contains(&x) && (0.0..=self.max_y).contains(&y), "{x} {y}");
        let ((x0, wx), (y0, wy)) = (split(x), split(y));
        // At the last column/row the weight of the next pixel is 0 (the position is clamped), so reading the
        // same pixel twice is exact.
        let dx = if x0 < self.last_x { 3 } else { 0 };
        let dy = if y0 < self.last_y { self.stride } else { 0 };
        let i = y0 * self.stride + x0 * 3;
        // One bounds check for the 2x2 neighbourhood: every index below is provably inside `d`, so the compiler
        // drops the per-pixel checks of the four corner reads.
        let d = &self.data[i..i + dy + dx + 3];
        let (ax, ay) = (COEF_ONE - wx, COEF_ONE - wy);
        let mut out = [0u8; 3];
        for (c, o) in out.iter_mut().enumerate() {
            let t = u32::from(d[c]) * ax + u32::from(d[dx + c]) * wx;
            let b = u32::from(d[dy + c]) * ax + u32::from(d[dy + dx + c]) * wx;
            *o = ((t * ay + b * wy + ROUND) >> (2 * COEF_BITS)) as u8;
        }
        out
    }

    /// [`Sampler::sample_clamped`] with `cv2.resize`'s own rounding (`INTER_LINEAR` on 8-bit images, as its
    /// vectorised passes compute it on x86), at a position split by [`resize_split`] on each axis: horizontal sums
    /// kept whole; vertically `((b0·(t >> 4)) >> 16) + ((b1·(b >> 4)) >> 16)`, then `(s + 2) >> 2`. At scales
    /// whose weights are multiples of 2⁴ this equals the exact rounding; at others (64 → 51 px) it differs by one
    /// level in about a tenth of the pixels, which is what Ultralytics' `LetterBox` gets.
    #[inline(always)]
    pub fn sample_resize(&self, x: ResizeSplit, y: ResizeSplit) -> [u8; 3] {
        let ((x0, ax, wx), (y0, ay, wy)) = (x, y);
        let dx = if x0 < self.last_x { 3 } else { 0 };
        let dy = if y0 < self.last_y { self.stride } else { 0 };
        let i = y0 * self.stride + x0 * 3;
        let d = &self.data[i..i + dy + dx + 3];
        let mut out = [0u8; 3];
        for (c, o) in out.iter_mut().enumerate() {
            let t = i32::from(d[c]) * ax + i32::from(d[dx + c]) * wx;
            let b = i32::from(d[dy + c]) * ax + i32::from(d[dy + dx + c]) * wx;
            *o = ((((ay * (t >> 4)) >> 16) + ((wy * (b >> 4)) >> 16) + 2) >> 2).clamp(0, 255) as u8;
        }
        out
    }

    /// The source rows [`Sampler::sample_clamped`] reads at a clamped `y`; `None` only for an image whose buffer
    /// is shorter than its size says (never for an [`ImageRgb8`]).
    #[inline(always)]
    pub(crate) fn rows(&self, y: f32) -> Option<SampleRows<'a>> {
        let (y0, wy) = split(y);
        let dy = if y0 < self.last_y { self.stride } else { 0 };
        let i = y0 * self.stride;
        Some(SampleRows {
            top: self.data.get(i..i + self.row_len)?,
            bottom: self.data.get(i + dy..i + dy + self.row_len)?,
            wy,
            last_x: self.last_x,
        })
    }

    /// The bilinear sample at `(x, y)` after clamping it into the image (edge pixels replicate).
    #[inline(always)]
    pub fn sample(&self, x: f32, y: f32) -> [u8; 3] {
        self.sample_clamped(x.clamp(0.0, self.max_x), y.clamp(0.0, self.max_y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> ImageRgb8 {
        let mut img = ImageRgb8::new(4, 3);
        for y in 0..3 {
            for (x, px) in img.row_mut(y).chunks_exact_mut(3).enumerate() {
                px.copy_from_slice(&[(x * 10) as u8, (y * 20) as u8, 200]);
            }
        }
        img
    }

    #[test]
    fn integer_positions_are_exact_and_halves_average() {
        let img = ramp();
        let s = Sampler::new(&img).expect("non-empty");
        assert_eq!(s.sample(2.0, 1.0), [20, 20, 200]);
        assert_eq!(s.sample(1.5, 0.5), [15, 10, 200]);
        assert_eq!(s.sample(0.25, 0.0), [3, 0, 200]); // 2.5 rounds half up in fixed point
        // Clamped positions replicate the edge.
        assert_eq!(s.sample(-3.0, 7.0), [0, 40, 200]);
        assert_eq!(s.sample(3.0, 2.0), [30, 40, 200]);
    }

    #[test]
    fn split_run_equals_split() {
        let mut v = 0.0f32;
        let mut cases = Vec::new();
        while v < 4100.0 {
            cases.extend([v, v.next_up(), v.next_down().max(0.0)]);
            v += 1.0 / 64.0;
        }
        let mut x = 0x9e37_79b9u32;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            cases.push(f32::from_bits(x % 0x4b00_0000)); // every float in [0, 2^23)
        }
        cases.extend([-0.0, 8_388_607.5, 8_388_607.0f32.next_up(), 1.0 - f32::EPSILON / 2.0]);
        for v in cases {
            let (i, w) = split(v);
            assert_eq!(split_run(v), (i as u32, w), "{v}");
        }
    }

    #[test]
    fn strided_images_sample_the_right_rows() {
        let mut data = vec![0u8; 2 * 10];
        data[10..16].copy_from_slice(&[9, 9, 9, 7, 7, 7]);
        let img = ImageRgb8::from_raw(2, 2, 10, data).expect("image");
        let s = Sampler::new(&img).expect("non-empty");
        assert_eq!(s.sample(1.0, 1.0), [7, 7, 7]);
        assert_eq!(s.sample(0.5, 1.0), [8, 8, 8]);
        assert!(Sampler::new(&ImageRgb8::new(0, 5)).is_none());
    }
}
