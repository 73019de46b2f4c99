//! The tiled forward, for batches whose images are not stacked (each map gives the gemm enough columns alone):
//! every image is cut into tiles of whole output rows, and each tile's im2col, gemm, bias and epilogue run as one
//! task while the tile is in cache. [`Tiles`] and [`tile_rows`] are shared with the tiled weight gradient.

use std::ops::Range;

use gemm::Parallelism;
use multiversion::multiversion;
use rayon::prelude::*;

use super::im2col::im2col_tile;
use super::matmul::SharedOut;
use super::{Elem, Epilogue, Geom};
use crate::uninit::{assume_init_mut, filled_vec};

/// Column-matrix elements one tile of [`forward_tiled`] aims for (1 MiB of f32): with the tile's output it stays
/// in a core's L2 cache from the im2col through the gemm to the epilogue.
const TILE_COL_ELEMS: usize = 1 << 18;
/// Fewest output columns per tile (short of splitting a small map between threads), so the gemm stays efficient.
const MIN_TILE_COLS: usize = 256;

/// Output rows per tile of [`forward_tiled`]: about [`TILE_COL_ELEMS`] column-matrix elements, at least
/// [`MIN_TILE_COLS`] columns, and small enough that the batch has a tile for every thread.
pub(super) fn tile_rows(g: &Geom, threads: usize) -> usize {
    let cols = (TILE_COL_ELEMS / g.ckk().max(1)).max(MIN_TILE_COLS);
    let per_image = threads.div_ceil(g.n);
    (cols / g.wo).clamp(1, g.ho.div_ceil(per_image).max(1))
}

/// A batch cut into tiles of `rows` whole output rows per image (the last tile of an image may be shorter), numbered
/// image by image.
pub(super) struct Tiles {
    rows: usize,
    per_image: usize,
}

impl Tiles {
    pub(super) fn new(g: &Geom, rows: usize) -> Self {
        let rows = rows.clamp(1, g.ho);
        Self { rows, per_image: g.ho.div_ceil(rows) }
    }

    /// Tiles in the batch.
    pub(super) fn count(&self, g: &Geom) -> usize {
        g.n * self.per_image
    }

    /// Tile `t`'s image and output rows.
    pub(super) fn get(&self, g: &Geom, t: usize) -> (usize, Range<usize>) {
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
pub(super) fn forward_tiled<T: Elem>(
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

/// `d[i] += v` for every element.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
fn add_scalar<T: Elem>(d: &mut [T], v: T) {
    for x in d.iter_mut() {
        *x += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::kernels::testutil::*;
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
}
