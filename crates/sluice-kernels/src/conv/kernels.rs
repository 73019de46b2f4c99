//! The conv2d kernels on plain slices: im2col/col2im, the three gemm-based passes (forward, input gradient,
//! weight gradient) and the batching/threading policy described in the [`crate::conv`] header.
//!
//! Layouts are candle's contiguous NCHW for activations and OIHW for weights. For a group of `g` images the
//! column matrix is `(c·k·k) × (g·ho·wo)`, image `i` occupying columns `i·ho·wo ..`.
//!
//! The plans, one file each: [`im2col`] (im2col/col2im), [`tiled`] (the forward of images that are not stacked),
//! [`stacked`] (the forward of stacked groups, row-shifted where it pays), [`input_grad`] (with [`polyphase`] for
//! the 3×3 stride-2 conv) and [`weight_grad`] (weight and bias gradients); [`matmul`] holds the gemm calls and the
//! group loop they share. This file holds the geometry, the plan choice and the forward's dispatch.

mod im2col;
mod input_grad;
mod matmul;
mod polyphase;
mod stacked;
mod tiled;
mod weight_grad;

use rayon::prelude::*;

pub(crate) use input_grad::backward_input;
use stacked::forward_grouped;
use tiled::{forward_tiled, tile_rows};
pub(crate) use weight_grad::{backward_weight, bias_grad};

use super::workspace::Elem;

/// Shape of one convolution (groups 1, dilation 1, square kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geom {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) o: usize,
    pub(crate) k: usize,
    pub(crate) stride: usize,
    pub(crate) pad: usize,
    pub(crate) ho: usize,
    pub(crate) wo: usize,
}

/// Columns a group's gemm should reach before images are stacked no further (small maps gain, big ones need not).
const MIN_GROUP_COLS: usize = 2048;
/// Upper bound on one group's column matrix, in elements.
const MAX_GROUP_ELEMS: usize = 1 << 21;
/// Output rows per image from which stacked groups run the row-shifted plan ([`Geom::row_shift`]). Stacked images
/// leave `2p` rows of columns between them that the gemms compute and discard (`2p/h` more work): on YOLOv8n's
/// 10×10 maps that costs more than the smaller im2col saves, from its 20×20 ones on it does not (the figures are
/// in `docs/bench-results.md`).
const MIN_SHIFT_ROWS: usize = 16;

impl Geom {
    /// The geometry, or `None` when the kernel does not fit the padded input or a size is zero.
    pub(crate) fn new(
        x: (usize, usize, usize, usize),
        w: (usize, usize, usize, usize),
        stride: usize,
        pad: usize,
    ) -> Option<Self> {
        let (n, c, h, wi) = x;
        let (o, c2, k, k2) = w;
        if c != c2 || k != k2 || stride == 0 || k == 0 || h + 2 * pad < k || wi + 2 * pad < k {
            return None;
        }
        if [n, c, h, wi, o].contains(&0) {
            return None;
        }
        let ho = (h + 2 * pad - k) / stride + 1;
        let wo = (wi + 2 * pad - k) / stride + 1;
        Some(Self { n, c, h, w: wi, o, k, stride, pad, ho, wo })
    }

    fn hw(&self) -> usize {
        self.h * self.w
    }
    fn howo(&self) -> usize {
        self.ho * self.wo
    }
    fn ckk(&self) -> usize {
        self.c * self.k * self.k
    }
    /// A stride-1 conv whose output has the input's size (odd `k`, `pad = (k − 1) / 2`, as YOLO's 3×3 convs).
    fn is_same_stride1(&self) -> bool {
        self.stride == 1 && 2 * self.pad + 1 == self.k && self.ho == self.h && self.wo == self.w
    }
    /// A stride-1 "same" conv with a kernel taller than one row, which can run row-shifted: as `k` gemms, one per
    /// kernel row `ky`, over a column matrix that holds only the kernel's columns (`stacked::row_im2col`: `c·k`
    /// rows instead of `c·k·k`), the gemm of kernel row `ky` reading that matrix from `ky` input rows further on. The
    /// im2col writes a third of the elements for a 3×3 conv (plus `2p` halo rows per image), at the cost of `k`
    /// gemms with a `k`-times shorter reduction, the later ones accumulating.
    fn can_row_shift(&self) -> bool {
        self.is_same_stride1() && self.k > 1
    }
    /// Whether stacked groups run row-shifted ([`Self::can_row_shift`]): on maps of at least [`MIN_SHIFT_ROWS`]
    /// rows. (The tiled plans stay whole: a tile of a few rows would recompute its halo rows, and row-shifted tiles
    /// are no faster.)
    fn row_shift(&self) -> bool {
        self.can_row_shift() && self.h >= MIN_SHIFT_ROWS
    }
    /// Rows of the row-shifted column matrix (`c·k`).
    fn ck(&self) -> usize {
        self.c * self.k
    }
    /// Columns of one image in the row-shifted column matrix: its rows with `p` halo rows above and below, `w`
    /// columns each.
    fn shift_cols(&self) -> usize {
        (self.h + 2 * self.pad) * self.w
    }
    /// YOLO's down-sampling conv: 3×3, stride 2, padding 1 (im2col handles its three kernel columns at once; its
    /// input gradient is polyphase, [`down3_backward_input`](polyphase::down3_backward_input)).
    fn is_down3(&self) -> bool {
        self.k == 3 && self.stride == 2 && self.pad == 1
    }
    /// A 1×1, stride-1, unpadded conv: the input image already is the column matrix.
    fn is_pointwise(&self) -> bool {
        self.k == 1 && self.stride == 1 && self.pad == 0
    }

    /// Images per gemm and whether groups run in parallel (each with a single-threaded gemm) or one after another
    /// (each gemm using every thread).
    fn plan(&self) -> (usize, bool) {
        let threads = rayon::current_num_threads().max(1);
        let per_thread = self.n.div_ceil(threads);
        let by_cols = MIN_GROUP_COLS.div_ceil(self.howo());
        let by_mem = (MAX_GROUP_ELEMS / (self.ckk() * self.howo()).max(1)).max(1);
        let g = by_cols.min(by_mem).min(per_thread).max(1);
        let groups = self.n.div_ceil(g);
        (g, threads > 1 && groups > 1)
    }
}

/// An in-place activation the forward applies to each gemm's result.
pub(crate) type Epilogue<'a, T> = &'a (dyn Fn(&mut [T]) + Sync);

/// Elements per rayon task of an epilogue that runs after a gemm that used every thread.
const EPILOGUE_CHUNK: usize = 16 * 1024;

/// Applies `f` to `d`: on this thread when the groups already run in parallel (`parallel_groups`), else split over
/// the pool, as the gemm before it was (batch 1 would otherwise run its activation on one core).
fn run_epilogue<T: Elem>(f: Epilogue<'_, T>, d: &mut [T], parallel_groups: bool) {
    if parallel_groups {
        f(d);
    } else {
        d.par_chunks_mut(EPILOGUE_CHUNK).for_each(f);
    }
}

/// Forward: `y (n×o×ho×wo) = conv(x (n×c×h×w), w (o×c×k×k)) [+ bias (o)]`. With a bias, each output row of a
/// stacked group starts as the bias and the gemm accumulates onto it (the tiled plan adds it after the gemm, in
/// cache). `epilogue` (an activation, in place) runs on each gemm's result right after it, while it is in cache.
/// Batches whose images are not stacked (one image per group, see [`Geom::plan`]) run as tiles ([`forward_tiled`]).
/// Stacked stride-1 "same" convs run row-shifted ([`Geom::row_shift`]).
pub(crate) fn forward<T: Elem>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geom,
    epilogue: Option<Epilogue<'_, T>>,
) -> Vec<T> {
    let (gs, parallel) = g.plan();
    if gs == 1 {
        let rows = tile_rows(g, rayon::current_num_threads().max(1));
        return forward_tiled(x, w, bias, g, epilogue, rows);
    }
    forward_grouped(x, w, bias, g, epilogue, (gs, parallel), g.row_shift())
}

/// Direct definitions of the convolution and its gradients and the test shapes, for the plans' tests.
#[cfg(test)]
mod testutil {
    use super::Geom;

    /// Every `(input index, weight index, output index)` that the direct definition of the conv multiplies
    /// together, in the definition's order (padding skipped).
    pub(super) fn for_each_tap(g: &Geom, mut f: impl FnMut(usize, usize, usize)) {
        for b in 0..g.n {
            for oc in 0..g.o {
                for oy in 0..g.ho {
                    for ox in 0..g.wo {
                        for ci in 0..g.c {
                            for ky in 0..g.k {
                                for kx in 0..g.k {
                                    let iy = (oy * g.stride + ky) as isize - g.pad as isize;
                                    let ix = (ox * g.stride + kx) as isize - g.pad as isize;
                                    if iy < 0 || ix < 0 || iy >= g.h as isize || ix >= g.w as isize {
                                        continue;
                                    }
                                    f(
                                        ((b * g.c + ci) * g.h + iy as usize) * g.w + ix as usize,
                                        ((oc * g.c + ci) * g.k + ky) * g.k + kx,
                                        ((b * g.o + oc) * g.ho + oy) * g.wo + ox,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Direct definition of the convolution, for checking the im2col path on tiny shapes.
    pub(super) fn naive(x: &[f64], w: &[f64], g: &Geom) -> Vec<f64> {
        let mut y = vec![0.0; g.n * g.o * g.howo()];
        for_each_tap(g, |xi, wi, yi| y[yi] += x[xi] * w[wi]);
        y
    }

    /// Direct definition of the input gradient: each output's gradient spread back over the inputs it read.
    pub(super) fn naive_input_grad(dy: &[f64], w: &[f64], g: &Geom) -> Vec<f64> {
        let mut dx = vec![0.0; g.n * g.c * g.hw()];
        for_each_tap(g, |xi, wi, yi| dx[xi] += dy[yi] * w[wi]);
        dx
    }

    pub(super) fn ramp(n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|i| ((i * 37 % 101) as f64 - 50.0) * scale).collect()
    }

    /// The geometry of `(n, c, h, w, o, k, stride, pad)` with a ramp input and a ramp weight for it.
    pub(super) fn case(
        &(n, c, h, w, o, k, s, p): &(usize, usize, usize, usize, usize, usize, usize, usize),
    ) -> (Geom, Vec<f64>, Vec<f64>) {
        let g = Geom::new((n, c, h, w), (o, c, k, k), s, p).unwrap();
        (g, ramp(n * c * h * w, 0.01), ramp(o * c * k * k, 0.02))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testutil::*;
    #[test]
    fn forward_matches_the_definition_on_odd_shapes() {
        for shape in
            &[(1, 2, 5, 7, 3, 3, 1, 1), (3, 3, 9, 6, 2, 3, 2, 1), (2, 4, 4, 4, 5, 1, 1, 0), (5, 1, 7, 7, 2, 3, 2, 0)]
        {
            let (g, x, wt) = case(shape);
            let got = forward(&x, &wt, None, &g, None);
            let want = naive(&x, &wt, &g);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-12, "{g:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn rejects_kernels_larger_than_the_padded_input() {
        assert!(Geom::new((1, 1, 2, 2), (1, 1, 5, 5), 1, 1).is_none());
        assert!(Geom::new((1, 2, 8, 8), (1, 3, 3, 3), 1, 1).is_none());
        assert!(Geom::new((1, 1, 8, 8), (1, 1, 3, 3), 0, 1).is_none());
    }
}
