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

use std::cell::RefCell;
use std::ops::Range;

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

/// The per-thread tables and rows of [`resize_area`].
#[derive(Debug, Default)]
struct Scratch {
    x: Table,
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
/// `0..=255`: adding and subtracting 1.5·2²³ leaves an f32 in this range rounded in the default rounding mode,
/// which vectorises (`f32::round_ties_even` is a libm call on baseline x86-64).
#[inline]
fn to_u8(v: f32) -> u8 {
    const MAGIC: f32 = 12_582_912.0;
    ((v.clamp(0.0, 255.0) + MAGIC) - MAGIC) as u8
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

/// Resamples the region `[0, extent_w) x [0, extent_h)` of `src` to `width x height` into `out` (already reset to
/// that size) by area averaging. Rounds to nearest like OpenCV's `saturate_cast`.
pub(crate) fn resize_area(src: &ImageRgb8, extent_w: f64, extent_h: f64, width: u32, height: u32, out: &mut ImageRgb8) {
    let (dw, dh) = (width as usize, height as usize);
    SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let s = &mut *guard;
        s.x.fill(extent_w, src.width() as usize, dw);
        s.y.fill(extent_h, src.height() as usize, dh);
        s.row.resize(dw * 3, 0.0);
        s.acc.resize(dw * 3, 0.0);
        s.row_src = None;
        for y in 0..dh {
            s.acc.fill(0.0);
            for &t in s.y.of(y) {
                if s.row_src != Some(t.src) {
                    horizontal(src.row(t.src as u32), &s.x, &mut s.row);
                    s.row_src = Some(t.src);
                }
                for (a, r) in s.acc.iter_mut().zip(&s.row) {
                    *a += r * t.weight;
                }
            }
            for (o, &v) in out.row_mut(y as u32).iter_mut().zip(&s.acc) {
                *o = to_u8(v);
            }
        }
    });
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

    #[test]
    fn rounding_is_ties_to_even_and_saturates() {
        for (v, want) in [(0.5, 0), (1.5, 2), (2.5, 2), (2.4999, 2), (254.5, 254), (254.51, 255), (300.0, 255)] {
            assert_eq!(to_u8(v), want, "{v}");
            assert_eq!(to_u8(v), v.round_ties_even().clamp(0.0, 255.0) as u8, "{v}");
        }
        assert_eq!(to_u8(-3.7), 0);
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
