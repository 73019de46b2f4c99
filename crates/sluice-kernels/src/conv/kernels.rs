//! The conv2d kernels on plain slices: im2col/col2im, the three gemm-based passes (forward, input gradient,
//! weight gradient) and the batching/threading policy described in the [`crate::conv`] header.
//!
//! Layouts are candle's contiguous NCHW for activations and OIHW for weights. For a group of `g` images the
//! column matrix is `(c·k·k) × (g·ho·wo)`, image `i` occupying columns `i·ho·wo ..`.

use std::mem::MaybeUninit;
use std::ops::Range;

use gemm::Parallelism;
use multiversion::multiversion;
use rayon::prelude::*;

use super::workspace::Elem;
use crate::uninit::{as_uninit, assume_init_mut, fill_init, filled_vec, write_all};

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
/// Elements below which one task transposes the weight gradient alone.
const MIN_TRANSPOSE_ELEMS: usize = 16 * 1024;
/// Upper bound on one group's column matrix, in elements.
const MAX_GROUP_ELEMS: usize = 1 << 21;
/// Output rows per image from which stacked groups run the row-shifted plan ([`Geom::row_shift`]). Stacked images
/// leave `2p` rows of columns between them that the gemms compute and discard (`2p/h` more work): on YOLOv8n's
/// 10×10 maps that made the conv 14% slower, on its 20×20 ones 3% faster (stop 24's A/B).
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
    /// kernel row `ky`, over a column matrix that holds only the kernel's columns ([`row_im2col_plane`]: `c·k` rows
    /// instead of `c·k·k`), the gemm of kernel row `ky` reading that matrix from `ky` input rows further on. The
    /// im2col writes a third of the elements for a 3×3 conv (plus `2p` halo rows per image), at the cost of `k`
    /// gemms with a `k`-times shorter reduction, the later ones accumulating.
    fn can_row_shift(&self) -> bool {
        self.is_same_stride1() && self.k > 1
    }
    /// Whether stacked groups run row-shifted ([`Self::can_row_shift`]): on maps of at least [`MIN_SHIFT_ROWS`]
    /// rows. (Tiles of a few rows would recompute their halo rows; stop 24 measured the tiled plans row-shifted as
    /// no faster, and left them whole.)
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
    /// input gradient is polyphase, [`down3_backward_input`]).
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

/// Writes `b[row]` into every element of row `row` of `dst` (`b.len()` rows of `cols`).
fn write_rows<T: Copy>(dst: &mut [MaybeUninit<T>], cols: usize, b: &[T]) {
    for (row, &v) in dst.chunks_mut(cols).zip(b) {
        row.iter_mut().for_each(|d| {
            d.write(v);
        });
    }
}

/// `dst (m×n) = [dst +] lhs (m×k) · rhs (k×n)` with explicit row/column strides; bounds are checked against the
/// slices before the unchecked gemm runs. Without `accumulate` the gemm writes every element of `dst` without
/// reading it, so `dst` may be uninitialised then; with `accumulate` it must be initialised.
#[allow(clippy::too_many_arguments)]
fn matmul<T: Elem>(
    mnk: (usize, usize, usize),
    dst: &mut [MaybeUninit<T>],
    dst_strides: (usize, usize),
    accumulate: bool,
    lhs: &[T],
    lhs_strides: (usize, usize),
    rhs: &[T],
    rhs_strides: (usize, usize),
    par: Parallelism,
) {
    let out = SharedOut::new(dst);
    // SAFETY: `dst` is borrowed mutably for the whole call, so no other reference reaches the elements written.
    unsafe { out.matmul(0, mnk, dst_strides, accumulate, lhs, lhs_strides, rhs, rhs_strides, par) }
}

/// An output buffer that the tasks of one parallel loop write at once, each to its own elements (the tiles of
/// [`forward_tiled`] interleave: a tile is a column range of every output channel's row).
struct SharedOut<T> {
    ptr: *mut MaybeUninit<T>,
    len: usize,
}

// SAFETY: the pointer is only dereferenced through the unsafe methods below, whose callers guarantee that no two
// threads touch the same element.
unsafe impl<T: Send> Send for SharedOut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedOut<T> {}

impl<T: Elem> SharedOut<T> {
    fn new(buf: &mut [MaybeUninit<T>]) -> Self {
        Self { ptr: buf.as_mut_ptr(), len: buf.len() }
    }

    /// The elements `start..start + len`.
    ///
    /// # Safety
    /// No other live reference, and no other thread, may touch these elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, start: usize, len: usize) -> &mut [MaybeUninit<T>] {
        assert!(start + len <= self.len, "conv output: tile out of bounds");
        // SAFETY: in bounds (checked); exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }

    /// [`matmul`] into the elements `at + i·dst_rs + j·dst_cs` (`i < m`, `j < n`).
    ///
    /// # Safety
    /// No other thread, and no live reference, may touch those elements during the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn matmul(
        &self,
        at: usize,
        (m, n, k): (usize, usize, usize),
        (dst_rs, dst_cs): (usize, usize),
        accumulate: bool,
        lhs: &[T],
        (lhs_rs, lhs_cs): (usize, usize),
        rhs: &[T],
        (rhs_rs, rhs_cs): (usize, usize),
        par: Parallelism,
    ) {
        if m == 0 || n == 0 {
            return;
        }
        let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
        assert!(at + last(m, n, dst_rs, dst_cs) < self.len, "conv gemm: dst out of bounds");
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        // SAFETY: in bounds (checked above); exclusive per the caller's contract.
                        unsafe { self.ptr.add(at + i * dst_rs + j * dst_cs).write(MaybeUninit::new(T::ZERO)) };
                    }
                }
            }
            return;
        }
        assert!(last(m, k, lhs_rs, lhs_cs) < lhs.len(), "conv gemm: lhs out of bounds");
        assert!(last(k, n, rhs_rs, rhs_cs) < rhs.len(), "conv gemm: rhs out of bounds");
        // SAFETY: every index the gemm touches, (i·rs + j·cs) for i < rows and j < cols, was checked above to lie
        // inside its buffer; the destination elements are exclusive to this call (the caller's contract), so they
        // alias neither lhs nor rhs, which are shared borrows.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                self.ptr.add(at).cast::<T>(),
                dst_cs as isize,
                dst_rs as isize,
                accumulate,
                lhs.as_ptr(),
                lhs_cs as isize,
                lhs_rs as isize,
                rhs.as_ptr(),
                rhs_cs as isize,
                rhs_rs as isize,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                par,
            );
        }
    }
}

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
pub(crate) fn im2col<T: Elem>(x: &[T], g: &Geom, col: &mut [T], ld: usize, off: usize, parallel: bool) {
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
/// channels on this thread: one tile of [`forward`]'s tiled plan.
fn im2col_tile<T: Elem>(x: &[T], g: &Geom, col: &mut [T], oys: Range<usize>) {
    let ld = oys.len() * g.wo;
    let block = g.k * g.k * ld;
    for (rows, p) in col[..g.c * block].chunks_mut(block).zip(x[..g.c * g.hw()].chunks(g.hw())) {
        im2col_plane(p, g, rows, ld, 0, oys.clone());
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
fn shifted_rows<T: Elem>(plane: &[T], g: &Geom, kx: usize, iy0: isize, dst: &mut [T]) {
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
pub(crate) fn col2im<T: Elem>(col: &mut [T], g: &Geom, ld: usize, off: usize, dx: &mut [T], parallel: bool) {
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

/// Runs `f(group_index, chunk)` over the `g`-image chunks of `out`, in parallel or in order per the plan.
fn for_groups<U: Send>(out: &mut [U], chunk: usize, parallel: bool, f: impl Fn(usize, &mut [U]) + Sync + Send) {
    if parallel {
        out.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

fn gemm_par(parallel_groups: bool) -> Parallelism {
    let threads = rayon::current_num_threads();
    if parallel_groups || threads <= 1 { Parallelism::None } else { Parallelism::Rayon(threads) }
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

/// The column matrix of a stacked group.
#[derive(Clone, Copy)]
struct GroupCols {
    /// Its rows: the gemm's reduction (`c·k·k`, or `c·k` row-shifted).
    kdim: usize,
    /// Columns per image.
    seg: usize,
    /// Its row length.
    ld: usize,
    /// The gemm's columns.
    cols: usize,
}

/// The column matrix of the stacked images `xs` (row-shifted with `shift`) in this thread's workspace, and after it
/// `o × cols` more elements when there are several images (for the group's output or gathered `dy`): `f` gets both
/// and the layout. With the full im2col the images lie side by side; row-shifted, each image's segment holds its
/// `2p` halo rows too, and the gemm's columns stop short of the last image's halo (the halo rows between two images
/// give output columns that are discarded). The im2col runs over the channels in parallel unless `parallel` (the
/// groups are).
fn with_group_cols<T: Elem, R>(
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
fn forward_grouped<T: Elem>(
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

/// `d[i] += v` for every element.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn add_scalar<T: Elem>(d: &mut [T], v: T) {
    for x in d.iter_mut() {
        *x += v;
    }
}

/// Column-matrix elements one tile of [`forward_tiled`] aims for (1 MiB of f32): with the tile's output it stays
/// in a core's L2 cache from the im2col through the gemm to the epilogue.
const TILE_COL_ELEMS: usize = 1 << 18;
/// Fewest output columns per tile (short of splitting a small map between threads), so the gemm stays efficient.
const MIN_TILE_COLS: usize = 256;

/// Output rows per tile of [`forward_tiled`]: about [`TILE_COL_ELEMS`] column-matrix elements, at least
/// [`MIN_TILE_COLS`] columns, and small enough that the batch has a tile for every thread.
fn tile_rows(g: &Geom, threads: usize) -> usize {
    let cols = (TILE_COL_ELEMS / g.ckk().max(1)).max(MIN_TILE_COLS);
    let per_image = threads.div_ceil(g.n);
    (cols / g.wo).clamp(1, g.ho.div_ceil(per_image).max(1))
}

/// A batch cut into tiles of `rows` whole output rows per image (the last tile of an image may be shorter), numbered
/// image by image.
struct Tiles {
    rows: usize,
    per_image: usize,
}

impl Tiles {
    fn new(g: &Geom, rows: usize) -> Self {
        let rows = rows.clamp(1, g.ho);
        Self { rows, per_image: g.ho.div_ceil(rows) }
    }

    /// Tiles in the batch.
    fn count(&self, g: &Geom) -> usize {
        g.n * self.per_image
    }

    /// Tile `t`'s image and output rows.
    fn get(&self, g: &Geom, t: usize) -> (usize, Range<usize>) {
        let oy0 = (t % self.per_image) * self.rows;
        (t / self.per_image, oy0..(oy0 + self.rows).min(g.ho))
    }
}

/// The forward for batches whose images are not stacked (each image's map gives the gemm enough columns): every
/// image is cut into tiles of `rows` whole output rows ([`tile_rows`]), and each tile is one task that runs the
/// im2col of its rows, one single-threaded gemm into its columns of every output channel, then the bias and the
/// epilogue, while the tile is in cache. The tiles of all images are spread over the pool in one parallel loop:
/// one fork-join per convolution (the whole-image plan forked for the im2col, inside the gemm and again for the
/// epilogue, and its column matrix left the cache before the gemm read it).
fn forward_tiled<T: Elem>(
    x: &[T],
    w: &[T],
    bias: Option<&[T]>,
    g: &Geom,
    epilogue: Option<Epilogue<'_, T>>,
    rows: usize,
) -> Vec<T> {
    let (howo, ckk, o, chw) = (g.howo(), g.ckk(), g.o, g.c * g.hw());
    let parallel = rayon::current_num_threads() > 1;
    let tiles = Tiles::new(g, rows);
    // Every element is written: the gemm of each tile writes its columns of every output row of its image, and the
    // tiles cover every output row of every image.
    filled_vec(g.n * o * howo, |y| {
        let out = SharedOut::new(y);
        let tile = |t: usize| {
            let (img, oys) = tiles.get(g, t);
            let (p0, cols) = (oys.start * g.wo, oys.len() * g.wo);
            let at = img * o * howo + p0;
            let xi = &x[img * chw..(img + 1) * chw];
            let gemm = |rhs: &[T], rhs_rs: usize| {
                // SAFETY: tile `t` alone touches the columns `oys` of image `img`'s output rows, and the gemm writes
                // exactly those elements.
                unsafe {
                    out.matmul(at, (o, cols, ckk), (howo, 1), false, w, (ckk, 1), rhs, (rhs_rs, 1), Parallelism::None)
                }
            };
            if g.is_pointwise() {
                gemm(&xi[p0..], howo);
            } else {
                T::with_workspace(ckk * cols, |col| {
                    im2col_tile(xi, g, col, oys.clone());
                    gemm(col, cols);
                });
            }
            if bias.is_none() && epilogue.is_none() {
                return;
            }
            for oc in 0..o {
                // SAFETY: as above; the gemm has just written every element of the row segment.
                let seg = unsafe { assume_init_mut(out.slice(at + oc * howo, cols)) };
                // The bias is added here, on the segment the gemm just wrote (in L1), rather than written first for
                // the gemm to read back: a fill pass over cold memory saved.
                if let Some(b) = bias {
                    add_scalar(seg, b[oc]);
                }
                if let Some(f) = epilogue {
                    f(seg);
                }
            }
        };
        let tasks = tiles.count(g);
        if parallel && tasks > 1 {
            (0..tasks).into_par_iter().for_each(tile);
        } else {
            (0..tasks).for_each(tile);
        }
    })
}

/// Bias gradient: `db[oc] = Σ_{image, pixel} dy[image, oc, pixel]`, summed per plane in `T` and across planes in
/// f64, channels in parallel.
pub(crate) fn bias_grad<T: Elem>(dy: &[T], n: usize, o: usize, howo: usize) -> Vec<T> {
    (0..o)
        .into_par_iter()
        .map(|oc| {
            let total: f64 =
                (0..n).map(|i| plane_sum(&dy[(i * o + oc) * howo..(i * o + oc + 1) * howo]).to_f64()).sum();
            T::from_f64(total)
        })
        .collect()
}

/// Sum of a plane in 16 interleaved lanes (vectorises; a fixed order, so every build gives the same bits).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn plane_sum<T: Elem>(p: &[T]) -> T {
    const LANES: usize = 16;
    let mut acc = [T::ZERO; LANES];
    let mut chunks = p.chunks_exact(LANES);
    for ch in &mut chunks {
        for l in 0..LANES {
            acc[l] += ch[l];
        }
    }
    let mut s = T::ZERO;
    for a in acc {
        s += a;
    }
    for &v in chunks.remainder() {
        s += v;
    }
    s
}

/// Copies the images of `dy` (each `o×howo`) side by side into `dst` (`o` rows of `dst.len() / o`), image `i` at
/// column `i·seg` of every row; the columns between images (`seg > howo`, the row-shifted layout) are zeroed.
fn gather_dy<T: Elem>(dy: &[T], o: usize, howo: usize, seg: usize, dst: &mut [T]) {
    let cols = dst.len() / o;
    for (oc, row) in dst.chunks_exact_mut(cols).enumerate() {
        for (i, out) in row.chunks_mut(seg).enumerate() {
            let src = &dy[(i * o + oc) * howo..(i * o + oc + 1) * howo];
            out[..howo].copy_from_slice(src);
            out[howo..].fill(T::ZERO);
        }
    }
}

/// The weights of the conv that maps `dy` to `dx` for a stride-1 "same" conv: `w'[c][o] = w[o][c]` with the kernel
/// rotated by 180° (`w'[c][o][ky][kx] = w[o][c][k−1−ky][k−1−kx]`).
fn flipped_transposed<T: Elem>(w: &[T], g: &Geom) -> Vec<T> {
    let kk = g.k * g.k;
    let mut out = Vec::with_capacity(w.len());
    for ci in 0..g.c {
        for oc in 0..g.o {
            out.extend(w[(oc * g.c + ci) * kk..(oc * g.c + ci + 1) * kk].iter().rev());
        }
    }
    out
}

/// Input gradient: `dx = col2im(wᵀ · dy)` per group (for a pointwise conv, `dx = wᵀ · dy` per image).
///
/// A stride-1 "same" conv's input gradient is itself a "same" conv of `dy` ([`flipped_transposed`] weights):
/// `dx[c, y, x] = Σ_{o, ky, kx} w[o, c, ky, kx] · dy[o, y + p − ky, x + p − kx]`. That runs as a forward: an im2col
/// of `dy` and a gemm reducing over `o·k·k`, instead of a gemm reducing over `o` alone that writes a column matrix
/// `k²` times the size of `dx` for col2im to add up (the col2im path took 3× the forward's time at 80² × 32).
pub(crate) fn backward_input<T: Elem>(dy: &[T], w: &[T], g: &Geom) -> Vec<T> {
    let (howo, ckk, o, chw) = (g.howo(), g.ckk(), g.o, g.c * g.hw());
    if g.is_same_stride1() && g.k > 1 {
        let transposed = Geom { c: g.o, o: g.c, ..*g };
        return forward(dy, &flipped_transposed(w, g), None, &transposed, None);
    }
    if g.is_down3() {
        return down3_backward_input(dy, w, g);
    }
    let (gs, parallel) = g.plan();
    let par = gemm_par(parallel);
    // Every element is written: by the gemm (pointwise), or zeroed in the group's task (in parallel, while the
    // chunk is about to be used) and then accumulated by col2im.
    filled_vec(g.n * chw, |dx| {
        for_groups(dx, gs * chw, parallel, |gi, dxchunk| {
            let first = gi * gs;
            let imgs = dxchunk.len() / chw;
            let dys = &dy[first * o * howo..(first + imgs) * o * howo];
            if g.is_pointwise() {
                for (i, dxi) in dxchunk.chunks_mut(chw).enumerate() {
                    let dyi = &dys[i * o * howo..(i + 1) * o * howo];
                    matmul((ckk, howo, o), dxi, (howo, 1), false, w, (1, ckk), dyi, (howo, 1), par);
                }
                return;
            }
            let dxchunk = fill_init(dxchunk, T::ZERO);
            let cols = imgs * howo;
            let tmp_len = if imgs > 1 { o * cols } else { 0 };
            T::with_workspace(ckk * cols + tmp_len, |ws| {
                let (dcol, tmp) = ws.split_at_mut(ckk * cols);
                let dyg: &[T] = if imgs > 1 {
                    gather_dy(dys, o, howo, howo, tmp);
                    tmp
                } else {
                    dys
                };
                matmul((ckk, cols, o), as_uninit(dcol), (cols, 1), false, w, (1, ckk), dyg, (cols, 1), par);
                for (i, dxi) in dxchunk.chunks_mut(chw).enumerate() {
                    col2im(dcol, g, cols, i * howo, dxi, !parallel);
                }
            });
        });
    })
}

/// Output rows per band of [`down3_backward_input`]: enough columns for an efficient gemm, few enough that a band's
/// shifted copies of `dy` and its four phase results stay in cache.
const DOWN3_BAND_COLS: usize = 1024;

/// The four shifted copies of `dy` that [`down3_backward_input`] reduces over, as `(row offset, column offset)`,
/// in an order that makes each phase's set of copies contiguous: phase (0,0) reads copy 1, (0,1) copies 0–1,
/// (1,0) copies 1–2 and (1,1) all four.
const DOWN3_SHIFTS: [(usize, usize); 4] = [(0, 1), (0, 0), (1, 0), (1, 1)];

/// Per phase `(py, px)` in row-major order: the first shifted copy it reads and how many.
const DOWN3_PHASES: [(usize, usize); 4] = [(1, 1), (0, 2), (1, 2), (0, 4)];

/// The kernel index that connects input parity `parity` with output offset `off` along one axis of a 3×3,
/// stride-2, padding-1 conv: an even input position sees only the centre tap of the output at its half; an odd
/// one sees tap 2 of the output at its half and tap 0 of the next.
fn down3_tap(parity: usize, off: usize) -> usize {
    match (parity, off) {
        (0, _) => 1,
        (_, 0) => 2,
        _ => 0,
    }
}

/// Input gradient of YOLO's 3×3 stride-2 conv, polyphase: the input positions of each parity `(py, px)` receive a
/// stride-1 conv of `dy` with a 1×1, 1×2, 2×1 or 2×2 sub-kernel,
/// `dx[c, 2Y+py, 2X+px] = Σ_{o, (a, b)} w[o, c, tap(py, a), tap(px, b)] · dy[o, Y + a, X + b]`.
///
/// Each phase is one gemm reducing over `o ×` its taps, on shifted copies of `dy` built per band of output rows
/// ([`DOWN3_SHIFTS`]), and the four results are interleaved into `dx`: every element written once, with no
/// column matrix `9c × ho·wo` for col2im to add up (with it the 640 down conv's backward took 2.5× its forward;
/// now 2.1×).
fn down3_backward_input<T: Elem>(dy: &[T], w: &[T], g: &Geom) -> Vec<T> {
    let (o, c, howo, chw) = (g.o, g.c, g.howo(), g.c * g.hw());
    let parallel = rayon::current_num_threads() > 1 && g.n > 1;
    let par = gemm_par(parallel);
    let phases = down3_phase_weights(w, g);
    let band = DOWN3_BAND_COLS.div_ceil(g.wo).min(g.ho);
    let band_cols = band * g.wo;
    filled_vec(g.n * chw, |dx| {
        for_groups(dx, chw, parallel, |i, dxi| {
            let dyi = &dy[i * o * howo..(i + 1) * o * howo];
            T::with_workspace(4 * (o + c) * band_cols, |ws| {
                let (shifted, out) = ws.split_at_mut(4 * o * band_cols);
                for y0 in (0..g.ho).step_by(band) {
                    let rows = band.min(g.ho - y0);
                    let cols = rows * g.wo;
                    down3_shift_dy(dyi, g, y0, rows, &mut shifted[..4 * o * cols]);
                    for (p, ((first, taps), wp)) in DOWN3_PHASES.iter().zip(&phases).enumerate() {
                        let dst = as_uninit(&mut out[p * c * cols..(p + 1) * c * cols]);
                        let rhs = &shifted[first * o * cols..];
                        matmul((c, cols, taps * o), dst, (cols, 1), false, wp, (taps * o, 1), rhs, (cols, 1), par);
                    }
                    down3_interleave(&out[..4 * c * cols], g, y0, rows, dxi);
                }
            });
        });
    })
}

/// The four phases' weight matrices for [`down3_backward_input`]: phase `(py, px)`'s is `c × taps·o`, column
/// `t·o + oc` holding `w[oc, c, tap(py, a), tap(px, b)]` for its `t`-th shifted copy `(a, b)`.
fn down3_phase_weights<T: Elem>(w: &[T], g: &Geom) -> [Vec<T>; 4] {
    std::array::from_fn(|p| {
        let (py, px) = (p / 2, p % 2);
        let (first, taps) = DOWN3_PHASES[p];
        let mut m = Vec::with_capacity(g.c * taps * g.o);
        for ci in 0..g.c {
            for &(a, b) in &DOWN3_SHIFTS[first..first + taps] {
                let (ky, kx) = (down3_tap(py, a), down3_tap(px, b));
                m.extend((0..g.o).map(|oc| w[((oc * g.c + ci) * 3 + ky) * 3 + kx]));
            }
        }
        m
    })
}

/// Output rows `y0 .. y0 + rows` of one image's `dy` (`o × ho × wo`) in the four [`DOWN3_SHIFTS`], each
/// `o × rows·wo`, with zeros where a shift reads past the last row or column.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn down3_shift_dy<T: Elem>(dy: &[T], g: &Geom, y0: usize, rows: usize, dst: &mut [T]) {
    let (ho, wo) = (g.ho, g.wo);
    let cols = rows * wo;
    for (s, &(a, b)) in DOWN3_SHIFTS.iter().enumerate() {
        for oc in 0..g.o {
            let plane = &dy[oc * ho * wo..(oc + 1) * ho * wo];
            let d = &mut dst[(s * g.o + oc) * cols..(s * g.o + oc + 1) * cols];
            for (r, row) in d.chunks_exact_mut(wo).enumerate() {
                let y = y0 + r + a;
                if y >= ho {
                    row.fill(T::ZERO);
                    continue;
                }
                let src = &plane[y * wo + b..(y + 1) * wo];
                row[..wo - b].copy_from_slice(src);
                row[wo - b..].fill(T::ZERO);
            }
        }
    }
}

/// Writes the four phase results of output rows `y0 .. y0 + rows` (phase `(py, px)` at `out[(2py+px)·c·cols ..]`,
/// each `c × rows·wo`) into their places in one image's `dx`: input rows `2·y0 ..` of every channel, each element
/// once.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn down3_interleave<T: Elem>(out: &[T], g: &Geom, y0: usize, rows: usize, dx: &mut [MaybeUninit<T>]) {
    let (c, w, wo) = (g.c, g.w, g.wo);
    let cols = rows * wo;
    // Column pairs (2X, 2X + 1) that lie inside the row.
    let pairs = (w / 2).min(wo);
    for ci in 0..c {
        for r in 0..rows {
            for py in 0..2 {
                let y = 2 * (y0 + r) + py;
                if y >= g.h {
                    continue;
                }
                let at = |px: usize| &out[(2 * py + px) * c * cols + ci * cols + r * wo..][..wo];
                let (even, odd) = (at(0), at(1));
                let dst = &mut dx[ci * g.hw() + y * w..ci * g.hw() + (y + 1) * w];
                for ((pair, e), o) in dst.chunks_exact_mut(2).zip(&even[..pairs]).zip(&odd[..pairs]) {
                    pair[0].write(*e);
                    pair[1].write(*o);
                }
                if pairs < wo {
                    // An odd width: the last input column is even.
                    dst[2 * pairs].write(even[pairs]);
                }
            }
        }
    }
}

/// Weight gradient: `dw = Σ_groups dy_g · col_gᵀ` (for a pointwise conv, `Σ_images dy_i · x_iᵀ`).
///
/// The gemm computes `dwᵀ (c·k·k × o) = col · dyᵀ` and the result is transposed once at the end. Asked for `dw`
/// directly, gemm (which puts the destination's contiguous dimension along its microkernel's rows) would have to
/// repack the whole column matrix with a strided, one-element-at-a-time gather; this way it reads the column
/// matrix as it lies and repacks only `dy`, which is `c·k·k / o` times smaller.
///
/// Batches whose images are not stacked (one image per group) run in the forward's tiles ([`tile_rows`]): each
/// tile's column matrix is built and reduced against its columns of `dy` while it is in cache, instead of a whole
/// image's (which at 640 is tens of MiB for a 3×3 conv on a big map).
pub(crate) fn backward_weight<T: Elem>(x: &[T], dy: &[T], g: &Geom) -> Vec<T> {
    let (gs, parallel) = g.plan();
    let (acc_t, shift) = if gs == 1 {
        let threads = rayon::current_num_threads().max(1);
        (backward_weight_tiled(x, dy, g, tile_rows(g, threads), threads > 1), false)
    } else {
        let shift = g.row_shift();
        (backward_weight_grouped(x, dy, g, (gs, parallel), shift), shift)
    };
    transpose_weight_grad(&acc_t, g, shift)
}

/// `Σ_task f(task, acc)` into one `o·c·k·k` accumulator: one partial sum per rayon split, added up, with
/// `parallel`; else in order into one.
fn sum_tasks<T: Elem>(tasks: usize, len: usize, parallel: bool, f: impl Fn(usize, &mut [T]) + Sync + Send) -> Vec<T> {
    let zero = || vec![T::ZERO; len];
    if parallel && tasks > 1 {
        (0..tasks)
            .into_par_iter()
            .fold(zero, |mut acc, t| {
                f(t, &mut acc);
                acc
            })
            .reduce(zero, |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += *b);
                a
            })
    } else {
        let mut acc = zero();
        (0..tasks).for_each(|t| f(t, &mut acc));
        acc
    }
}

/// The tiled weight gradient of [`backward_weight`], as `dwᵀ` (`c·k·k × o`, row-major): per tile of `rows` output
/// rows, `dwᵀ += col_tile · dy_tileᵀ` with a single-threaded gemm, tiles spread over the pool with `parallel`.
fn backward_weight_tiled<T: Elem>(x: &[T], dy: &[T], g: &Geom, rows: usize, parallel: bool) -> Vec<T> {
    let (howo, ckk, o, chw) = (g.howo(), g.ckk(), g.o, g.c * g.hw());
    let tiles = Tiles::new(g, rows);
    sum_tasks(tiles.count(g), ckk * o, parallel, |t, acc_t| {
        let (img, oys) = tiles.get(g, t);
        let (p0, cols) = (oys.start * g.wo, oys.len() * g.wo);
        // This tile's columns of every output channel of `dy`: `o` rows `howo` apart, read transposed.
        let dyt = &dy[img * o * howo + p0..(img + 1) * o * howo];
        let xi = &x[img * chw..(img + 1) * chw];
        let acc = as_uninit(acc_t);
        if g.is_pointwise() {
            matmul((ckk, o, cols), acc, (o, 1), true, &xi[p0..], (howo, 1), dyt, (1, howo), Parallelism::None);
        } else {
            T::with_workspace(ckk * cols, |col| {
                im2col_tile(xi, g, col, oys);
                matmul((ckk, o, cols), acc, (o, 1), true, col, (cols, 1), dyt, (1, howo), Parallelism::None);
            });
        }
    })
}

/// The grouped weight gradient of [`backward_weight`] (images stacked `gs` to a group), as `dwᵀ`; row-shifted with
/// `shift` ([`Geom::row_shift`]), one gemm per kernel row `ky` accumulating its `c·k × o` block (block `ky`, rows
/// `ci·k + kx`: the layout [`transpose_weight_grad`] reads with `shift`).
fn backward_weight_grouped<T: Elem>(x: &[T], dy: &[T], g: &Geom, (gs, parallel): (usize, bool), shift: bool) -> Vec<T> {
    let (howo, ckk, o, chw) = (g.howo(), g.ckk(), g.o, g.c * g.hw());
    let par = gemm_par(parallel);
    let groups = g.n.div_ceil(gs);
    // Accumulates into `acc_t`, `dwᵀ` row-major (`ckk × o`).
    let group = |gi: usize, acc_t: &mut [T]| {
        let first = gi * gs;
        let imgs = gs.min(g.n - first);
        let dys = &dy[first * o * howo..(first + imgs) * o * howo];
        let xs = &x[first * chw..(first + imgs) * chw];
        if g.is_pointwise() {
            for i in 0..imgs {
                let dyi = &dys[i * o * howo..(i + 1) * o * howo];
                let xi = &xs[i * chw..(i + 1) * chw];
                matmul((ckk, o, howo), as_uninit(acc_t), (o, 1), true, xi, (howo, 1), dyi, (1, howo), par);
            }
            return;
        }
        with_group_cols(xs, g, shift, parallel, |col, tmp, GroupCols { kdim, seg, ld, cols }| {
            let dyg: &[T] = if imgs > 1 {
                gather_dy(dys, o, howo, seg, tmp);
                tmp
            } else {
                dys
            };
            let acc_t = as_uninit(acc_t);
            // One `c·k × o` block per kernel row when row-shifted, else one block.
            for (ky, acc) in acc_t.chunks_mut(kdim * o).enumerate() {
                matmul((kdim, o, cols), acc, (o, 1), true, &col[ky * g.w..], (ld, 1), dyg, (1, cols), par);
            }
        });
    };
    sum_tasks(groups, o * ckk, parallel, group)
}

/// `dw` (`o × c·k·k`) from the accumulated `dwᵀ`: its row `ci·k·k + ky·k + kx`, or with `shift` (the
/// row-shifted plans' layout) its row `ky·c·k + ci·k + kx`.
fn transpose_weight_grad<T: Elem>(acc_t: &[T], g: &Geom, shift: bool) -> Vec<T> {
    let (ckk, o, k) = (g.ckk(), g.o, g.k);
    let src_row = |j: usize| {
        if shift {
            let (ci, ky, kx) = (j / (k * k), j / k % k, j % k);
            ky * g.ck() + ci * k + kx
        } else {
            j
        }
    };
    // The transpose writes each of the o·ckk elements once, output channels in parallel (over all the layers of
    // a step it moves as many elements as the model has weights).
    filled_vec(o * ckk, |dw| {
        dw.par_chunks_mut(ckk).with_min_len(MIN_TRANSPOSE_ELEMS.div_ceil(ckk).max(1)).enumerate().for_each(
            |(oc, row)| {
                for (j, d) in row.iter_mut().enumerate() {
                    d.write(acc_t[src_row(j) * o + oc]);
                }
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `(input index, weight index, output index)` that the direct definition of the conv multiplies
    /// together, in the definition's order (padding skipped).
    fn for_each_tap(g: &Geom, mut f: impl FnMut(usize, usize, usize)) {
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
    fn naive(x: &[f64], w: &[f64], g: &Geom) -> Vec<f64> {
        let mut y = vec![0.0; g.n * g.o * g.howo()];
        for_each_tap(g, |xi, wi, yi| y[yi] += x[xi] * w[wi]);
        y
    }

    /// Direct definition of the input gradient: each output's gradient spread back over the inputs it read.
    fn naive_input_grad(dy: &[f64], w: &[f64], g: &Geom) -> Vec<f64> {
        let mut dx = vec![0.0; g.n * g.c * g.hw()];
        for_each_tap(g, |xi, wi, yi| dx[xi] += dy[yi] * w[wi]);
        dx
    }

    fn ramp(n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|i| ((i * 37 % 101) as f64 - 50.0) * scale).collect()
    }

    /// The geometry of `(n, c, h, w, o, k, stride, pad)` with a ramp input and a ramp weight for it.
    fn case(
        &(n, c, h, w, o, k, s, p): &(usize, usize, usize, usize, usize, usize, usize, usize),
    ) -> (Geom, Vec<f64>, Vec<f64>) {
        let g = Geom::new((n, c, h, w), (o, c, k, k), s, p).unwrap();
        (g, ramp(n * c * h * w, 0.01), ramp(o * c * k * k, 0.02))
    }

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
    fn tiled_forward_matches_the_definition() {
        // Tiles of 1, 2, 3 and all output rows (splitting the map unevenly), on one thread and on two, for the
        // three im2col paths (stride-1 "same", 3×3 stride-2 and the general one), the pointwise gemm, with the bias
        // and the epilogue.
        let double: Epilogue<'_, f64> = &|d: &mut [f64]| d.iter_mut().for_each(|v| *v *= 2.0);
        for shape in &[
            (1, 2, 7, 5, 3, 3, 1, 1),
            (2, 3, 9, 6, 4, 3, 2, 1),
            (1, 3, 5, 5, 2, 1, 1, 0),
            (2, 2, 8, 7, 3, 3, 2, 0),
            (1, 1, 1, 1, 2, 3, 2, 1),
            (2, 2, 6, 3, 3, 5, 1, 2),
        ] {
            let (g, x, wt) = case(shape);
            let b = ramp(g.o, 0.3);
            let mut want = naive(&x, &wt, &g);
            for (i, v) in want.iter_mut().enumerate() {
                *v = 2.0 * (*v + b[(i / g.howo()) % g.o]);
            }
            for threads in [1, 2] {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                for rows in [1, 2, 3, g.ho] {
                    let got = pool.install(|| forward_tiled(&x, &wt, Some(&b), &g, Some(double), rows));
                    for (a, e) in got.iter().zip(&want) {
                        assert!((a - e).abs() < 1e-12, "{g:?}, {rows} rows, {threads} threads: {a} vs {e}");
                    }
                }
            }
            // Without a bias the gemm writes the tile without reading it.
            for (a, e) in forward_tiled(&x, &wt, None, &g, None, 2).iter().zip(&naive(&x, &wt, &g)) {
                assert!((a - e).abs() < 1e-12, "{g:?} without a bias: {a} vs {e}");
            }
        }
    }

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

    #[test]
    fn weight_gradient_matches_the_definition() {
        // The tiled plan (1, 2, 3 and all output rows per tile, in order and in parallel) and the grouped one (with
        // and without the row shift where it applies), on the three im2col paths (the stride-1 "same" one row-shifted,
        // 3×3 and 5×5 on a map narrower than the kernel) and the pointwise gemm.
        for shape in &[
            (1, 2, 7, 5, 3, 3, 1, 1),
            (3, 2, 5, 4, 3, 3, 1, 1),
            (2, 2, 6, 3, 2, 5, 1, 2),
            (2, 3, 9, 6, 4, 3, 2, 1),
            (3, 3, 5, 5, 2, 1, 1, 0),
            (2, 2, 8, 7, 3, 3, 2, 0),
        ] {
            let (g, x, _) = case(shape);
            let dy = ramp(g.n * g.o * g.howo(), 0.03);
            let mut want = vec![0.0; g.o * g.ckk()];
            for_each_tap(&g, |xi, wi, yi| want[wi] += dy[yi] * x[xi]);
            let check = |got: Vec<f64>, what: &str| {
                for (a, e) in got.iter().zip(&want) {
                    assert!((a - e).abs() < 1e-9, "{g:?}, {what}: {a} vs {e}");
                }
            };
            let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
            for rows in [1, 2, 3, g.ho] {
                for parallel in [false, true] {
                    let acc_t = pool.install(|| backward_weight_tiled(&x, &dy, &g, rows, parallel));
                    let what = format!("{rows} rows, parallel {parallel}");
                    check(transpose_weight_grad(&acc_t, &g, false), &what);
                }
            }
            for gs in 1..=g.n {
                for shift in [false, g.can_row_shift()] {
                    let acc_t = pool.install(|| backward_weight_grouped(&x, &dy, &g, (gs, gs < g.n), shift));
                    check(transpose_weight_grad(&acc_t, &g, shift), &format!("{gs} per group, shift {shift}"));
                }
            }
            check(backward_weight(&x, &dy, &g), "planned");
        }
    }

    #[test]
    fn input_gradient_matches_the_definition() {
        // The polyphase stride-2 path on even, odd and one-pixel sides, bands that split the map unevenly, batch 1
        // and several images; the rotated-kernel stride-1 path; col2im (stride 2 unpadded, 1×1 stride 2).
        for &(n, c, h, w, o, k, s, p) in &[
            (1, 2, 6, 8, 3, 3, 2, 1),
            (3, 3, 7, 5, 2, 3, 2, 1),
            (2, 1, 1, 1, 2, 3, 2, 1),
            (2, 2, 2, 3, 4, 3, 2, 1),
            (2, 2, 301, 64, 3, 3, 2, 1),
            (1, 3, 9, 4100, 2, 3, 2, 1),
            (2, 3, 5, 6, 4, 3, 1, 1),
            (2, 2, 7, 6, 3, 3, 2, 0),
            (2, 3, 5, 5, 2, 1, 2, 0),
        ] {
            let g = Geom::new((n, c, h, w), (o, c, k, k), s, p).unwrap();
            let dy = ramp(n * o * g.howo(), 0.01);
            let wt = ramp(o * c * k * k, 0.02);
            let got = backward_input(&dy, &wt, &g);
            let want = naive_input_grad(&dy, &wt, &g);
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() < 1e-12, "{g:?} at {i}: {a} vs {b}");
            }
        }
    }

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

    #[test]
    fn rejects_kernels_larger_than_the_padded_input() {
        assert!(Geom::new((1, 1, 2, 2), (1, 1, 5, 5), 1, 1).is_none());
        assert!(Geom::new((1, 2, 8, 8), (1, 3, 3, 3), 1, 1).is_none());
        assert!(Geom::new((1, 1, 8, 8), (1, 1, 3, 3), 0, 1).is_none());
    }
}
