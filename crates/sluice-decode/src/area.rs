//! Area interpolation exactly as OpenCV's `INTER_AREA` computes it for shrinking: each output pixel is the mean
//! of the source area it covers, partially covered source pixels weighted by their covered fraction (OpenCV's
//! `computeResizeAreaTab`). `fast_image_resize`'s box filter equals this for integer factors only (a source pixel
//! is either in or out of its window), so fractional factors — which DCT-scaled decodes produce — use this
//! separable implementation.
//!
//! Destination rows are produced in order, as OpenCV's `ResizeArea_Invoker` does: each source row's horizontal
//! sums are computed once (a row shared by two destination rows is kept for the second), then weighted into one
//! destination row, which is rounded out before the next starts. Per output element the sums run in OpenCV's
//! order (ascending source index, horizontal before vertical). All buffers are per-thread and reused, so decoding
//! a stream of images allocates nothing once they have grown to the largest size.
//!
//! The horizontal pass is the cost (it reads every source pixel of every row). Each destination pixel's taps are
//! consecutive source pixels, so for up to [`MAX_FIXED`] taps the pass runs on a fixed-width form of the table
//! ([`Fixed`]): `k` consecutive pixels from `first[d]` with zero weights padding the shorter windows, unrolled at
//! compile time for that `k`. The zero terms add exact zeros, so the bits are those of the tap-list form.

use std::cell::RefCell;
use std::ops::Range;

use multiversion::multiversion;

use sluice_core::ImageRgb8;

/// One source pixel's weight in a destination pixel along an axis.
#[derive(Debug, Clone, Copy)]
struct Tap {
    src: usize,
    weight: f32,
}

/// OpenCV's area table along one axis: the taps of destination pixel `d` are `taps[starts[d]..starts[d + 1]]`,
/// in ascending source order.
#[derive(Debug, Default)]
struct Table {
    taps: Vec<Tap>,
    starts: Vec<usize>,
}

impl Table {
    /// Fills the table for `extent` source pixels (the region `[0, extent)`, `extent <= src_len`) onto `dst_len`.
    fn fill(&mut self, extent: f64, src_len: usize, dst_len: usize) {
        self.taps.clear();
        self.starts.clear();
        let scale = extent / dst_len as f64;
        let last = src_len as f64 - 1.0;
        for dst in 0..dst_len {
            self.starts.push(self.taps.len());
            let fsx1 = dst as f64 * scale;
            let fsx2 = fsx1 + scale;
            let cell = scale.min(extent - fsx1).max(f64::MIN_POSITIVE);
            let sx2 = fsx2.floor().min(last);
            let sx1 = fsx1.ceil().min(sx2);
            if sx1 - fsx1 > 1e-3 && sx1 >= 1.0 {
                self.taps.push(Tap { src: sx1 as usize - 1, weight: ((sx1 - fsx1) / cell) as f32 });
            }
            let mut sx = sx1;
            while sx < sx2 {
                self.taps.push(Tap { src: sx as usize, weight: (1.0 / cell) as f32 });
                sx += 1.0;
            }
            if fsx2 - sx2 > 1e-3 {
                self.taps.push(Tap { src: sx2 as usize, weight: ((fsx2 - sx2).min(1.0).min(cell) / cell) as f32 });
            }
        }
        self.starts.push(self.taps.len());
    }

    fn range(&self, dst: usize) -> Range<usize> {
        self.starts[dst]..self.starts[dst + 1]
    }

    fn of(&self, dst: usize) -> &[Tap] {
        &self.taps[self.range(dst)]
    }
}

/// The widest window the horizontal pass unrolls (a shrink by less than 3× has at most 4 taps); wider windows (a
/// shrink by 3× or more that is not an integer factor) use the tap list.
const MAX_FIXED: usize = 4;

/// [`Table`] as fixed-width windows: destination pixel `d` reads source pixels `first[d]..first[d] + k` with the
/// weights `weights[d·k..(d + 1)·k]`, zero where the pixel is not one of its taps.
#[derive(Debug, Default)]
struct Fixed {
    k: usize,
    first: Vec<usize>,
    weights: Vec<f32>,
}

impl Fixed {
    /// The fixed form of `t` over `src_len` source pixels, or `None` when a window is wider than [`MAX_FIXED`].
    fn fill(&mut self, t: &Table, src_len: usize) -> Option<()> {
        let dst_len = t.starts.len().saturating_sub(1);
        let k = (0..dst_len).map(|d| t.range(d).len()).max()?.max(1);
        if k > MAX_FIXED || k > src_len {
            return None;
        }
        self.k = k;
        self.first.clear();
        self.weights.clear();
        for d in 0..dst_len {
            let taps = t.of(d);
            // Windows near the right edge start early so that all `k` pixels exist; the extra ones weigh zero.
            let first = taps.first().map_or(0, |tap| tap.src).min(src_len - k);
            self.first.push(first);
            self.weights
                .extend((first..first + k).map(|src| taps.iter().find(|t| t.src == src).map_or(0.0, |t| t.weight)));
        }
        Some(())
    }
}

/// The per-thread tables and rows of [`resize_area`].
#[derive(Debug, Default)]
struct Scratch {
    x: Table,
    /// `x` in fixed-width form, when its windows are narrow enough (`fixed_ok`).
    x_fixed: Fixed,
    fixed_ok: bool,
    y: Table,
    /// Horizontal sums of source row `row_src` (`dw·3`).
    row: Vec<f32>,
    row_src: Option<usize>,
    /// The destination row being accumulated (`dw·3`).
    acc: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Rounds to nearest, ties to even (OpenCV's `saturate_cast<uchar>` through `cvRound`), after clamping to
/// `0..=255`. Adding 1.5·2²³ rounds an f32 in this range to an integer in the default rounding mode, and that
/// integer is the low byte of the sum's mantissa. Both steps vectorise, where `f32::round_ties_even` is a libm call
/// on baseline x86-64 and a saturating `as u8` cast is scalar code. (The sums are of bytes with finite weights,
/// never NaN.)
#[inline(always)]
fn to_u8(v: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    ((v.clamp(0.0, 255.0) + MAGIC).to_bits() & 0xFF) as u8
}

/// Horizontal sums of one RGB source row: `row[3d + ch] = Σ_taps(d) src[3·tap.src + ch] · tap.weight`.
fn horizontal(src: &[u8], x: &Table, row: &mut [f32]) {
    for (d, out) in row.chunks_exact_mut(3).enumerate() {
        let mut acc = [0f32; 3];
        for t in x.of(d) {
            let px = &src[t.src * 3..t.src * 3 + 3];
            acc[0] += f32::from(px[0]) * t.weight;
            acc[1] += f32::from(px[1]) * t.weight;
            acc[2] += f32::from(px[2]) * t.weight;
        }
        out.copy_from_slice(&acc);
    }
}

/// [`horizontal`] on the fixed-width table with `K == x.k` taps per destination pixel, unrolled.
#[inline(always)]
fn horizontal_fixed<const K: usize>(src: &[u8], x: &Fixed, row: &mut [f32]) {
    for ((out, &first), w) in row.chunks_exact_mut(3).zip(&x.first).zip(x.weights.chunks_exact(K)) {
        let px = &src[first * 3..first * 3 + 3 * K];
        let mut acc = [0f32; 3];
        for j in 0..K {
            acc[0] += f32::from(px[3 * j]) * w[j];
            acc[1] += f32::from(px[3 * j + 1]) * w[j];
            acc[2] += f32::from(px[3 * j + 2]) * w[j];
        }
        out.copy_from_slice(&acc);
    }
}

/// The horizontal sums of one source row through whichever form of the x table the scratch holds. Compiled for
/// AVX-512 and AVX2 too, chosen at run time (no FMA contraction: every target gives the same bits).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn horizontal_row(src: &[u8], s: &Scratch, row: &mut [f32]) {
    if !s.fixed_ok {
        return horizontal(src, &s.x, row);
    }
    match s.x_fixed.k {
        1 => horizontal_fixed::<1>(src, &s.x_fixed, row),
        2 => horizontal_fixed::<2>(src, &s.x_fixed, row),
        3 => horizontal_fixed::<3>(src, &s.x_fixed, row),
        4 => horizontal_fixed::<4>(src, &s.x_fixed, row),
        _ => horizontal(src, &s.x, row),
    }
}

/// Resamples the region `[0, extent_w) x [0, extent_h)` of `src` to `width x height` into `out` (already reset to
/// that size) by area averaging. Rounds to nearest like OpenCV's `saturate_cast`.
pub(crate) fn resize_area(src: &ImageRgb8, extent_w: f64, extent_h: f64, width: u32, height: u32, out: &mut ImageRgb8) {
    let (dw, dh) = (width as usize, height as usize);
    SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let s = &mut *guard;
        s.x.fill(extent_w, src.width() as usize, dw);
        s.y.fill(extent_h, src.height() as usize, dh);
        s.fixed_ok = s.x_fixed.fill(&s.x, src.width() as usize).is_some();
        s.row.resize(dw * 3, 0.0);
        s.acc.resize(dw * 3, 0.0);
        s.row_src = None;
        for y in 0..dh {
            s.acc.fill(0.0);
            for ti in s.y.range(y) {
                let t = s.y.taps[ti];
                if s.row_src != Some(t.src) {
                    let mut row = std::mem::take(&mut s.row);
                    horizontal_row(src.row(t.src as u32), s, &mut row);
                    s.row = row;
                    s.row_src = Some(t.src);
                }
                accumulate(&mut s.acc, &s.row, t.weight);
            }
            round_out(&s.acc, out.row_mut(y as u32));
        }
    });
}

/// `acc += row · weight`, element-wise (one vertical tap).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn accumulate(acc: &mut [f32], row: &[f32], weight: f32) {
    for (a, r) in acc.iter_mut().zip(row) {
        *a += r * weight;
    }
}

/// One finished destination row, rounded to bytes.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn round_out(acc: &[f32], out: &mut [u8]) {
    for (o, &v) in out.iter_mut().zip(acc) {
        *o = to_u8(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_of_each_output_sum_to_one() {
        for (extent, src, dst) in [(500.0, 500, 200), (187.5, 188, 150), (7.0, 7, 3), (160.0, 160, 64)] {
            let mut t = Table::default();
            t.fill(extent, src, dst);
            assert_eq!(t.starts.len(), dst + 1);
            for d in 0..dst {
                let taps = t.of(d);
                assert!(taps.iter().all(|tap| tap.src < src));
                assert!(taps.windows(2).all(|p| p[0].src < p[1].src), "taps of {d} not ascending");
                let s: f64 = taps.iter().map(|tap| f64::from(tap.weight)).sum();
                assert!((s - 1.0).abs() < 1e-5, "extent {extent} -> {dst}: output {d} weights sum to {s}");
            }
        }
    }

    /// The fixed-width pass gives the tap-list pass's bits, at the shrinks DCT-scaled decodes produce and at the
    /// right edge, where windows start early.
    #[test]
    fn fixed_width_pass_matches_the_tap_list_bit_for_bit() {
        let src: Vec<u8> = (0..997u32 * 3).map(|i| ((i * 73 + 11) % 256) as u8).collect();
        for (extent, src_len, dst_len, k) in [
            (960.0, 960, 640, 2),
            (997.0, 997, 640, 3),
            (500.0, 500, 333, 3),
            (720.0, 720, 640, 2),
            (996.5, 997, 640, 3),
            (997.0, 997, 350, 4),
        ] {
            let mut t = Table::default();
            t.fill(extent, src_len, dst_len);
            let mut f = Fixed::default();
            assert!(f.fill(&t, src_len).is_some(), "{extent} -> {dst_len}");
            assert_eq!(f.k, k, "{extent} -> {dst_len}: widest window");
            let s = Scratch { x: t, x_fixed: f, fixed_ok: true, ..Scratch::default() };
            let (mut want, mut got) = (vec![0f32; dst_len * 3], vec![0f32; dst_len * 3]);
            horizontal(&src[..src_len * 3], &s.x, &mut want);
            horizontal_row(&src[..src_len * 3], &s, &mut got);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{extent} -> {dst_len}");
        }
        // A shrink by 3.7× has windows of 5 taps: the tap list serves it.
        let mut t = Table::default();
        t.fill(740.0, 740, 200);
        assert!(Fixed::default().fill(&t, 740).is_none());
    }

    #[test]
    fn rounding_is_ties_to_even_and_saturates() {
        for (v, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (2.4999, 2), (254.5, 254), (254.51, 255), (300.0, 255)] {
            assert_eq!(to_u8(v), want, "{v}");
            assert_eq!(to_u8(v), v.round_ties_even().clamp(0.0, 255.0) as u8, "{v}");
        }
        assert_eq!(to_u8(-3.7), 0);
        for i in 0..=255u8 {
            assert_eq!(to_u8(f32::from(i)), i);
        }
    }

    /// Against the definition, in f64: each output is `Σ_y Σ_x wy·wx·src`, from the same tables.
    #[test]
    fn matches_the_two_dimensional_weighted_mean() {
        let (sw, sh) = (37u32, 23u32);
        let mut src = ImageRgb8::new(sw, sh);
        for y in 0..sh {
            for (i, v) in src.row_mut(y).iter_mut().enumerate() {
                *v = ((i as u32 * 37 + y * 101) % 251) as u8;
            }
        }
        for (ew, eh, dw, dh) in [(37.0, 23.0, 15u32, 9u32), (36.5, 22.5, 16, 10), (37.0, 23.0, 18, 11)] {
            let mut out = ImageRgb8::new(dw, dh);
            resize_area(&src, ew, eh, dw, dh, &mut out);
            let (mut x, mut y) = (Table::default(), Table::default());
            x.fill(ew, sw as usize, dw as usize);
            y.fill(eh, sh as usize, dh as usize);
            for dy in 0..dh as usize {
                for dx in 0..dw as usize {
                    for ch in 0..3 {
                        let mut want = 0f64;
                        for ty in y.of(dy) {
                            for tx in x.of(dx) {
                                let v = f64::from(src.row(ty.src as u32)[tx.src * 3 + ch]);
                                want += v * f64::from(ty.weight) * f64::from(tx.weight);
                            }
                        }
                        let got = f64::from(out.row(dy as u32)[dx * 3 + ch]);
                        assert!(
                            (got - want).abs() <= 0.5 + 1e-3,
                            "{ew}x{eh}->{dw}x{dh} at ({dx},{dy},{ch}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
