//! The forward for stacked groups: several images side by side in one column matrix and one gemm (small maps,
//! where one image alone gives the gemm too few columns). A stride-1 "same" conv on a map of at least
//! [`MIN_SHIFT_ROWS`](super::MIN_SHIFT_ROWS) rows runs row-shifted ([`Geom::row_shift`]): its column matrix holds
//! only the kernel's `k` columns per channel ([`row_im2col`]) and the conv is `k` accumulating gemms, one per kernel
//! row. [`with_group_cols`] and [`gather_dy`] are shared with the grouped weight gradient.

use std::mem::MaybeUninit;

use multiversion::multiversion;
use rayon::prelude::*;

use super::im2col::{im2col, shifted_rows};
use super::matmul::{for_groups, gemm_par, matmul};
use super::{Elem, Epilogue, Geom, run_epilogue};
use crate::uninit::{as_uninit, assume_init_mut, filled_vec, write_all};

/// Writes `b[row]` into every element of row `row` of `dst` (`b.len()` rows of `cols`).
fn write_rows<T: Copy>(dst: &mut [MaybeUninit<T>], cols: usize, b: &[T]) {
    for (row, &v) in dst.chunks_mut(cols).zip(b) {
        row.iter_mut().for_each(|d| {
            d.write(v);
        });
    }
}

/// The row-shifted column matrix ([`Geom::can_row_shift`]) of image `x` as the columns `off .. off + shift_cols()` of
/// `col` (row length `ld`, `k` rows per channel), channels' row blocks in parallel with `parallel` (as [`im2col`]).
fn row_im2col<T: Elem>(x: &[T], g: &Geom, col: &mut [T], ld: usize, off: usize, parallel: bool) {
    let block = g.k * ld;
    let col = &mut col[..g.c * block];
    let planes = &x[..g.c * g.hw()];
    if parallel {
        col.par_chunks_mut(block)
            .zip(planes.par_chunks(g.hw()))
            .for_each(|(rows, p)| row_im2col_plane(p, g, rows, ld, off));
    } else {
        col.chunks_mut(block).zip(planes.chunks(g.hw())).for_each(|(rows, p)| row_im2col_plane(p, g, rows, ld, off));
    }
}

/// The row-shifted column matrix of one input channel: row `kx` (columns `off .. off + shift_cols()` of row length
/// `ld`) holds the input rows `−p .. h + p`, each shifted by kernel column `kx` ([`shifted_rows`]). Output row
/// `oy`'s kernel row `ky` reads input row `oy + ky − p`, which sits `ky` rows (`ky·w` columns) further on than
/// output row `oy` itself.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn row_im2col_plane<T: Elem>(plane: &[T], g: &Geom, rows: &mut [T], ld: usize, off: usize) {
    let len = g.shift_cols();
    for kx in 0..g.k {
        shifted_rows(plane, g, kx, -(g.pad as isize), &mut rows[kx * ld + off..kx * ld + off + len]);
    }
}

/// The weights as the row-shifted plan's `k` matrices, `[ky][o][c·k]`: entry `(ky, oc, ci·k + kx)` is
/// `w[oc, ci, ky, kx]`.
fn row_shift_weights<T: Elem>(w: &[T], g: &Geom) -> Vec<T> {
    let (k, kk, ckk) = (g.k, g.k * g.k, g.ckk());
    let mut out = Vec::with_capacity(w.len());
    for ky in 0..k {
        for oc in 0..g.o {
            for ci in 0..g.c {
                out.extend_from_slice(&w[oc * ckk + ci * kk + ky * k..][..k]);
            }
        }
    }
    out
}

/// The column matrix of a stacked group.
#[derive(Clone, Copy)]
pub(super) struct GroupCols {
    /// Its rows: the gemm's reduction (`c·k·k`, or `c·k` row-shifted).
    pub(super) kdim: usize,
    /// Columns per image.
    pub(super) seg: usize,
    /// Its row length.
    pub(super) ld: usize,
    /// The gemm's columns.
    pub(super) cols: usize,
}

/// The column matrix of the stacked images `xs` (row-shifted with `shift`) in this thread's workspace, and after it
/// `o × cols` more elements when there are several images (for the group's output or gathered `dy`): `f` gets both
/// and the layout. With the full im2col the images lie side by side; row-shifted, each image's segment holds its
/// `2p` halo rows too, and the gemm's columns stop short of the last image's halo (the halo rows between two images
/// give output columns that are discarded). The im2col runs over the channels in parallel unless `parallel` (the
/// groups are).
pub(super) fn with_group_cols<T: Elem, R>(
    xs: &[T],
    g: &Geom,
    shift: bool,
    parallel: bool,
    f: impl FnOnce(&[T], &mut [T], GroupCols) -> R,
) -> R {
    let chw = g.c * g.hw();
    let imgs = xs.len() / chw;
    let lay = if shift {
        let seg = g.shift_cols();
        GroupCols { kdim: g.ck(), seg, ld: imgs * seg, cols: imgs * seg - 2 * g.pad * g.w }
    } else {
        GroupCols { kdim: g.ckk(), seg: g.howo(), ld: imgs * g.howo(), cols: imgs * g.howo() }
    };
    let tmp_len = if imgs > 1 { g.o * lay.cols } else { 0 };
    T::with_workspace(lay.kdim * lay.ld + tmp_len, |ws| {
        let (col, tmp) = ws.split_at_mut(lay.kdim * lay.ld);
        for (i, xi) in xs.chunks(chw).enumerate() {
            if shift {
                row_im2col(xi, g, col, lay.ld, i * lay.seg, !parallel);
            } else {
                im2col(xi, g, col, lay.ld, i * lay.seg, !parallel);
            }
        }
        f(col, tmp, lay)
    })
}

/// The forward for stacked groups of `gs` images ([`Geom::plan`]: `parallel` runs groups in parallel, each gemm
/// single-threaded), row-shifted with `shift` (a stride-1 "same" conv).
pub(super) fn forward_grouped<T: Elem>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geom,
    epilogue: Option<Epilogue<'_, T>>,
    (gs, parallel): (usize, bool),
    shift: bool,
) -> Vec<T> {
    let (howo, ckk, o, chw) = (g.howo(), g.ckk(), g.o, g.c * g.hw());
    let par = gemm_par(parallel);
    let shifted_w = shift.then(|| row_shift_weights(w, g));
    let wk = shifted_w.as_deref().unwrap_or(w);
    // Every element is written: by the gemm (which, without a bias, writes without reading) or by the copy out of
    // the stacked result, after the bias rows when there is a bias.
    filled_vec(g.n * o * howo, |y| {
        for_groups(y, gs * o * howo, parallel, |gi, ychunk| {
            let first = gi * gs;
            let imgs = ychunk.len() / (o * howo);
            let xs = &x[first * chw..(first + imgs) * chw];
            if g.is_pointwise() {
                for (i, yi) in ychunk.chunks_mut(o * howo).enumerate() {
                    let xi = &xs[i * chw..(i + 1) * chw];
                    if let Some(b) = bias {
                        write_rows(yi, howo, b);
                    }
                    matmul((o, howo, ckk), yi, (howo, 1), bias.is_some(), w, (ckk, 1), xi, (howo, 1), par);
                    if let Some(f) = epilogue {
                        // SAFETY: the gemm just wrote every element of `yi`.
                        run_epilogue(f, unsafe { assume_init_mut(yi) }, parallel);
                    }
                }
                return;
            }
            with_group_cols(xs, g, shift, parallel, |col, tmp, GroupCols { kdim, seg, ld, cols }| {
                // One image fills the chunk exactly (`cols == howo`); several go through `tmp`.
                let dst = if imgs == 1 { &mut *ychunk } else { as_uninit(tmp) };
                if let Some(b) = bias {
                    write_rows(dst, cols, b);
                }
                // One gemm per kernel row when row-shifted (the later ones accumulating), else one.
                for ky in 0..wk.len() / (o * kdim) {
                    let (acc, lhs, rhs) = (bias.is_some() || ky > 0, &wk[ky * o * kdim..], &col[ky * g.w..]);
                    matmul((o, cols, kdim), dst, (cols, 1), acc, lhs, (kdim, 1), rhs, (ld, 1), par);
                }
                if let Some(f) = epilogue {
                    // SAFETY: the gemm just wrote every element of `dst` (`o × cols`, the whole chunk or `tmp`).
                    run_epilogue(f, unsafe { assume_init_mut(dst) }, parallel);
                }
                if imgs > 1 {
                    for (i, yi) in ychunk.chunks_mut(o * howo).enumerate() {
                        for (oc, row) in yi.chunks_mut(howo).enumerate() {
                            write_all(row, &tmp[oc * cols + i * seg..oc * cols + i * seg + howo]);
                        }
                    }
                }
            });
        });
    })
}

/// Copies the images of `dy` (each `o×howo`) side by side into `dst` (`o` rows of `dst.len() / o`), image `i` at
/// column `i·seg` of every row; the columns between images (`seg > howo`, the row-shifted layout) are zeroed.
pub(super) fn gather_dy<T: Elem>(dy: &[T], o: usize, howo: usize, seg: usize, dst: &mut [T]) {
    let cols = dst.len() / o;
    for (oc, row) in dst.chunks_exact_mut(cols).enumerate() {
        for (i, out) in row.chunks_mut(seg).enumerate() {
            let src = &dy[(i * o + oc) * howo..(i * o + oc + 1) * howo];
            out[..howo].copy_from_slice(src);
            out[howo..].fill(T::ZERO);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::kernels::testutil::*;
    #[test]
    fn grouped_forward_matches_the_definition() {
        // Stacked groups of 1 to n images (in order and in parallel), with and without the row shift where it
        // applies (3×3, and 5×5 on a map narrower than the kernel), the strided im2col and the pointwise gemm, with
        // and without the bias and the epilogue.
        let double: Epilogue<'_, f64> = &|d: &mut [f64]| d.iter_mut().for_each(|v| *v *= 2.0);
        for shape in
            &[(3, 2, 5, 4, 3, 3, 1, 1), (2, 2, 6, 3, 2, 5, 1, 2), (3, 3, 7, 6, 2, 3, 2, 1), (2, 3, 4, 5, 4, 1, 1, 0)]
        {
            let (g, x, wt) = case(shape);
            let b = ramp(g.o, 0.3);
            let plain = naive(&x, &wt, &g);
            let with_bias: Vec<f64> =
                plain.iter().enumerate().map(|(i, v)| 2.0 * (v + b[(i / g.howo()) % g.o])).collect();
            let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
            for gs in 1..=g.n {
                for shift in [false, g.can_row_shift()] {
                    let plan = (gs, gs < g.n);
                    let got = pool.install(|| forward_grouped(&x, &wt, Some(&b), &g, Some(double), plan, shift));
                    for (a, e) in got.iter().zip(&with_bias) {
                        assert!((a - e).abs() < 1e-12, "{g:?}, {gs} per group, shift {shift}: {a} vs {e}");
                    }
                    let got = pool.install(|| forward_grouped(&x, &wt, None, &g, None, plan, shift));
                    for (a, e) in got.iter().zip(&plain) {
                        assert!((a - e).abs() < 1e-12, "{g:?}, {gs} per group, shift {shift}, no bias: {a} vs {e}");
                    }
                }
            }
        }
    }
}
