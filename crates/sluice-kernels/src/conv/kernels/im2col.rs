//! im2col and col2im: an image's patches as the columns of the gemm's right-hand side, and the adjoint that adds
//! such a column matrix back into an image. The general path copies one output row at a time (stride 2 as a
//! de-interleave over element pairs); a stride-1 "same" conv copies each column-matrix row as one shifted block
//! ([`shifted_rows`]); the 3×3 stride-2 conv fills the three rows of a kernel row in one pass ([`down3_im2col`]).
//! The per-channel loops are compiled for AVX-512 and AVX2+FMA too and picked at run time (`multiversion`).

use std::ops::Range;

use multiversion::multiversion;
use rayon::prelude::*;

use super::{Elem, Geom};

/// For kernel column `kx`: the output columns `lo..hi` whose input column lies inside the image.
fn valid_range(kx: usize, g: &Geom) -> (usize, usize) {
    let s = g.stride;
    let lo = if g.pad > kx { (g.pad - kx).div_ceil(s) } else { 0 };
    let hi = if g.w + g.pad > kx { ((g.w + g.pad - kx - 1) / s + 1).min(g.wo) } else { 0 };
    (lo.min(hi), hi)
}

/// Writes image `x` (`c×h×w`) as the columns `off..off+ho·wo` of `col` (row length `ld`); with `parallel`, the
/// channels' row blocks are filled by rayon tasks (for a single-image gemm, whose im2col would otherwise run on
/// one thread while the others wait for the gemm).
pub(super) fn im2col<T: Elem>(x: &[T], g: &Geom, col: &mut [T], ld: usize, off: usize, parallel: bool) {
    let block = g.k * g.k * ld;
    let col = &mut col[..g.c * block];
    let planes = &x[..g.c * g.hw()];
    if parallel {
        col.par_chunks_mut(block)
            .zip(planes.par_chunks(g.hw()))
            .for_each(|(rows, p)| im2col_plane(p, g, rows, ld, off, 0..g.ho));
    } else {
        col.chunks_mut(block)
            .zip(planes.chunks(g.hw()))
            .for_each(|(rows, p)| im2col_plane(p, g, rows, ld, off, 0..g.ho));
    }
}

/// The output rows `oys` of image `x` as a column matrix of `oys.len()·wo` columns (`col`, row length that), all
/// channels on this thread: one tile of [`forward`](super::forward)'s tiled plan.
pub(super) fn im2col_tile<T: Elem>(x: &[T], g: &Geom, col: &mut [T], oys: Range<usize>) {
    let ld = oys.len() * g.wo;
    let block = g.k * g.k * ld;
    for (rows, p) in col[..g.c * block].chunks_mut(block).zip(x[..g.c * g.hw()].chunks(g.hw())) {
        im2col_plane(p, g, rows, ld, 0, oys.clone());
    }
}

/// [`im2col`] of one input channel: `plane` (`h×w`) into its `k·k` rows of the column matrix, for the output rows
/// `oys` (the columns `off..off + oys.len()·wo` of each row).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn im2col_plane<T: Elem>(plane: &[T], g: &Geom, rows: &mut [T], ld: usize, off: usize, oys: Range<usize>) {
    let (k, s, p, wo) = (g.k, g.stride, g.pad, g.wo);
    if g.is_down3() {
        down3_im2col(plane, g, rows, ld, off, oys);
        return;
    }
    let len = oys.len() * wo;
    for ky in 0..k {
        for kx in 0..k {
            let row = ky * k + kx;
            let dst = &mut rows[row * ld + off..row * ld + off + len];
            if g.is_same_stride1() {
                same_shift_rows(plane, g, ky, kx, dst, oys.clone());
                continue;
            }
            let (lo, hi) = valid_range(kx, g);
            for oy in oys.clone() {
                let seg = &mut dst[(oy - oys.start) * wo..(oy - oys.start + 1) * wo];
                let iy = (oy * s + ky) as isize - p as isize;
                if iy < 0 || iy >= g.h as isize {
                    seg.fill(T::ZERO);
                    continue;
                }
                seg[..lo].fill(T::ZERO);
                seg[hi..].fill(T::ZERO);
                let src = &plane[iy as usize * g.w..(iy as usize + 1) * g.w];
                let first = lo * s + kx - p;
                match s {
                    1 => seg[lo..hi].copy_from_slice(&src[first..first + (hi - lo)]),
                    // Every other element: written over pairs so LLVM vectorises it as an interleaved load.
                    2 => {
                        let n = hi - lo;
                        let pairs = src[first..].chunks_exact(2);
                        let tail = pairs.len() < n;
                        for (d, v) in seg[lo..hi].iter_mut().zip(pairs) {
                            *d = v[0];
                        }
                        if tail {
                            seg[hi - 1] = src[first + 2 * (n - 1)];
                        }
                    }
                    _ => {
                        for (d, v) in seg[lo..hi].iter_mut().zip(src[first..].iter().step_by(s)) {
                            *d = *v;
                        }
                    }
                }
            }
        }
    }
}

/// One im2col row of a stride-1 "same" conv (`w == wo`, `h == ho`) for the output rows `oys`:
/// `dst[(oy − oys.start)·w + j] = plane[(oy + ky − p)·w + j + kx − p]`, zero outside the image.
#[inline(always)] // into the multiversioned callers, so it is compiled with their SIMD features
fn same_shift_rows<T: Elem>(plane: &[T], g: &Geom, ky: usize, kx: usize, dst: &mut [T], oys: Range<usize>) {
    let dst = &mut dst[..oys.len() * g.w];
    shifted_rows(plane, g, kx, oys.start as isize + ky as isize - g.pad as isize, dst);
}

/// Input rows `iy0 ..` of `plane` (`h×w`), as many as `dst` holds whole rows of `w`, each shifted by kernel column
/// `kx`: `dst[r·w + j] = plane[(iy0 + r)·w + j + kx − p]`, zero outside the image (rows above or below it, columns
/// left or right). The rows inside the image are one contiguous range in `dst` and, shifted by `kx − p`, in
/// `plane`, so they are copied with a single `copy_from_slice` (instead of one per row); the elements that the
/// shift wraps across a row boundary are then zeroed (`|kx − p|` per row).
#[inline(always)] // into the multiversioned callers, so it is compiled with their SIMD features
pub(super) fn shifted_rows<T: Elem>(plane: &[T], g: &Geom, kx: usize, iy0: isize, dst: &mut [T]) {
    let (w, p) = (g.w, g.pad);
    let rows = (dst.len() / w) as isize;
    // The rows inside the image, `lo .. hi` (empty, at an end of `dst`, when none is).
    let end = iy0 + rows;
    let lo = iy0.max(0).min(end);
    let hi = end.min(g.h as isize).max(lo);
    // Their element offsets in `dst` and their element count.
    let (d0, n) = ((lo - iy0) as usize * w, (hi - lo) as usize * w);
    dst[..d0].fill(T::ZERO);
    dst[d0 + n..].fill(T::ZERO);
    if n == 0 {
        return;
    }
    let s0 = lo as usize * w;
    let band = &mut dst[d0..d0 + n];
    if kx >= p {
        let sh = (kx - p).min(w);
        band[..n - sh].copy_from_slice(&plane[s0 + sh..s0 + n]);
        zero_row_edges(band, w, w - sh..w);
    } else {
        let sh = (p - kx).min(w);
        band[sh..].copy_from_slice(&plane[s0..s0 + n - sh]);
        zero_row_edges(band, w, 0..sh);
    }
}

/// The adjoint of [`same_shift_rows`]: adds one column-matrix row into `plane` with one long loop over the valid
/// output rows. The entries whose shifted position wraps across a row boundary belong to padded input columns; they
/// are zeroed first, so the long loop adds exactly 0 where it wraps.
#[inline(always)] // into the multiversioned callers, so it is compiled with their SIMD features
fn same_shift_rows_add<T: Elem>(src: &mut [T], g: &Geom, ky: usize, kx: usize, plane: &mut [T]) {
    let (w, p) = (g.w, g.pad);
    let (d0, s0, n) = same_band(g, ky, 0..g.ho);
    if n == 0 {
        return;
    }
    let band = &mut src[d0..d0 + n];
    if kx >= p {
        let sh = (kx - p).min(w);
        zero_row_edges(band, w, w - sh..w);
        for (d, v) in plane[s0 + sh..s0 + n].iter_mut().zip(&band[..n - sh]) {
            *d += *v;
        }
    } else {
        let sh = (p - kx).min(w);
        zero_row_edges(band, w, 0..sh);
        for (d, v) in plane[s0..s0 + n - sh].iter_mut().zip(&band[sh..]) {
            *d += *v;
        }
    }
}

/// The three column-matrix rows of kernel row `ky` (kernel columns 0, 1, 2), each the `len` entries of this
/// image's output rows.
#[inline(always)]
fn three_rows<T>(rows: &mut [T], ld: usize, off: usize, len: usize, ky: usize) -> [&mut [T]; 3] {
    let mut it = rows[3 * ky * ld..(3 * ky + 3) * ld].chunks_exact_mut(ld).map(|r| &mut r[off..off + len]);
    let mut next = || it.next().unwrap_or_default();
    [next(), next(), next()]
}

/// [`im2col_plane`] for a 3×3 stride-2 conv with padding 1. Output column `j` of kernel column `kx` reads input
/// column `2j + kx − 1`: kernel column 1 takes the even input columns, 2 the odd ones, and 0 the odd ones shifted
/// by one output column (its column 0 is the padding). One pass over each input row fills all three rows, as a
/// de-interleave that vectorises, instead of three strided passes.
#[inline(always)] // into the multiversioned caller, so it is compiled with its SIMD features
fn down3_im2col<T: Elem>(plane: &[T], g: &Geom, rows: &mut [T], ld: usize, off: usize, oys: Range<usize>) {
    let (w, wo) = (g.w, g.wo);
    // Pairs (2j, 2j + 1) inside the row that also have an output column j + 1 for kernel column 0.
    let n = (w / 2).min(wo - 1);
    for ky in 0..3 {
        let [r0, r1, r2] = three_rows(rows, ld, off, oys.len() * wo, ky);
        for oy in oys.clone() {
            let j = (oy - oys.start) * wo;
            let (c0, c1, c2) = (&mut r0[j..j + wo], &mut r1[j..j + wo], &mut r2[j..j + wo]);
            let iy = (2 * oy + ky) as isize - 1;
            if iy < 0 || iy >= g.h as isize {
                c0.fill(T::ZERO);
                c1.fill(T::ZERO);
                c2.fill(T::ZERO);
                continue;
            }
            let src = &plane[iy as usize * w..(iy as usize + 1) * w];
            for (((pair, a), b), c) in src.chunks_exact(2).zip(&mut c1[..n]).zip(&mut c2[..n]).zip(&mut c0[1..n + 1]) {
                *a = pair[0];
                *b = pair[1];
                *c = pair[1];
            }
            c0[0] = T::ZERO;
            for j in n..wo {
                c1[j] = src[2 * j];
                c2[j] = if 2 * j + 1 < w { src[2 * j + 1] } else { T::ZERO };
            }
            for j in n + 1..wo {
                c0[j] = src[2 * j - 1];
            }
        }
    }
}

/// For kernel row `ky` of a stride-1 "same" conv and the output rows `oys`: the valid ones as `(first element in
/// the column-matrix row, which starts at row `oys.start`; first element of the input plane; element count)`;
/// output rows above and below read the zero padding.
#[inline(always)]
fn same_band(g: &Geom, ky: usize, oys: Range<usize>) -> (usize, usize, usize) {
    let (w, h, p) = (g.w, g.h, g.pad);
    let oy_lo = p.saturating_sub(ky).min(h).clamp(oys.start, oys.end);
    let oy_hi = (h + p).saturating_sub(ky).min(h).clamp(oy_lo, oys.end);
    let s0 = if oy_lo < oy_hi { (oy_lo + ky - p) * w } else { 0 };
    ((oy_lo - oys.start) * w, s0, (oy_hi - oy_lo) * w)
}

/// Zeroes `cols` of every `w`-long row of `band` (one store per row for the usual single column, no memset call).
#[inline(always)] // into the multiversioned callers, so it is compiled with their SIMD features
fn zero_row_edges<T: Elem>(band: &mut [T], w: usize, cols: std::ops::Range<usize>) {
    for r in band.chunks_exact_mut(w) {
        if cols.len() == 1 {
            r[cols.start] = T::ZERO;
        } else {
            r[cols.clone()].fill(T::ZERO);
        }
    }
}

/// Adds the columns `off..off+ho·wo` of `col` (row length `ld`) back into image `dx` (`c×h×w`): the adjoint of
/// [`im2col`], with the same `parallel` switch (each channel's plane is written by one task). `col` is scratch:
/// for stride-1 "same" convs the entries that belong to padded input positions are zeroed on the way.
pub(super) fn col2im<T: Elem>(col: &mut [T], g: &Geom, ld: usize, off: usize, dx: &mut [T], parallel: bool) {
    let block = g.k * g.k * ld;
    let dx = &mut dx[..g.c * g.hw()];
    let col = &mut col[..g.c * block];
    if parallel {
        dx.par_chunks_mut(g.hw())
            .zip(col.par_chunks_mut(block))
            .for_each(|(p, rows)| col2im_plane(rows, g, ld, off, p));
    } else {
        dx.chunks_mut(g.hw()).zip(col.chunks_mut(block)).for_each(|(p, rows)| col2im_plane(rows, g, ld, off, p));
    }
}

/// [`col2im`] of one input channel: its `k·k` rows of the column matrix added into `plane` (`h×w`).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn col2im_plane<T: Elem>(rows: &mut [T], g: &Geom, ld: usize, off: usize, plane: &mut [T]) {
    let (k, s, p, wo) = (g.k, g.stride, g.pad, g.wo);
    for ky in 0..k {
        for kx in 0..k {
            let row = ky * k + kx;
            let src = &mut rows[row * ld + off..row * ld + off + g.howo()];
            if g.is_same_stride1() {
                same_shift_rows_add(src, g, ky, kx, plane);
                continue;
            }
            let src = &*src;
            let (lo, hi) = valid_range(kx, g);
            for oy in 0..g.ho {
                let iy = (oy * s + ky) as isize - p as isize;
                if iy < 0 || iy >= g.h as isize || lo == hi {
                    continue;
                }
                let seg = &src[oy * wo + lo..oy * wo + hi];
                let dst = &mut plane[iy as usize * g.w..(iy as usize + 1) * g.w];
                let first = lo * s + kx - p;
                match s {
                    1 => {
                        for (d, v) in dst[first..first + (hi - lo)].iter_mut().zip(seg) {
                            *d += *v;
                        }
                    }
                    2 => {
                        let n = hi - lo;
                        let mut pairs = dst[first..].chunks_exact_mut(2);
                        let full = pairs.len().min(n);
                        for (d, v) in (&mut pairs).zip(&seg[..full]) {
                            d[0] += *v;
                        }
                        if full < n {
                            dst[first + 2 * (n - 1)] += seg[n - 1];
                        }
                    }
                    _ => {
                        for (d, v) in dst[first..].iter_mut().step_by(s).zip(seg) {
                            *d += *v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::kernels::testutil::*;
    #[test]
    fn col2im_is_the_adjoint_of_im2col() {
        // <im2col(x), c> == <x, col2im(c)> for every x and c: stride 2, and the stride-1 "same" shifted-copy path
        // (3×3 and 5×5, a map narrower than the kernel).
        for (h, w, k, st, pad) in [(6, 5, 3, 2, 1), (6, 5, 3, 1, 1), (4, 3, 5, 1, 2)] {
            let g = Geom::new((1, 2, h, w), (1, 2, k, k), st, pad).unwrap();
            let x = ramp(g.c * g.hw(), 0.1);
            let c = ramp(g.ckk() * g.howo(), 0.03);
            let mut col = vec![0.0; c.len()];
            im2col(&x, &g, &mut col, g.howo(), 0, false);
            let mut back = vec![0.0; x.len()];
            col2im(&mut c.clone(), &g, g.howo(), 0, &mut back, true);
            let lhs: f64 = col.iter().zip(&c).map(|(a, b)| a * b).sum();
            let rhs: f64 = x.iter().zip(&back).map(|(a, b)| a * b).sum();
            assert!((lhs - rhs).abs() < 1e-9, "{lhs} vs {rhs}");
        }
    }
}
