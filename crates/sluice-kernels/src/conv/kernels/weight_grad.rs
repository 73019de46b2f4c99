//! The weight gradient `dw` (in the forward's tiles where the forward is tiled, else per stacked group, row-shifted
//! where the forward is) and the bias gradient `db` (a per-channel sum).

use gemm::Parallelism;
use multiversion::multiversion;
use rayon::prelude::*;

use super::im2col::im2col_tile;
use super::matmul::{gemm_par, matmul};
use super::stacked::{GroupCols, gather_dy, with_group_cols};
use super::tiled::{Tiles, tile_rows};
use super::{Elem, Geom};
use crate::uninit::{as_uninit, filled_vec};

/// Elements below which one task transposes the weight gradient alone.
const MIN_TRANSPOSE_ELEMS: usize = 16 * 1024;

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

/// `Σ_task f(task, acc)` into one `o·c·k·k` accumulator. With `parallel`, the tasks are cut into one contiguous
/// run per pool thread, each run summed in order into its own accumulator, and the runs' sums added in run order:
/// the order of every addition depends on the task count and the thread count only, never on which thread stole
/// which task, so the same inputs give the same bits on every run (rayon's `fold`/`reduce` splits adaptively and
/// would not). Without `parallel`, in order into one.
fn sum_tasks<T: Elem>(tasks: usize, len: usize, parallel: bool, f: impl Fn(usize, &mut [T]) + Sync + Send) -> Vec<T> {
    let zero = || vec![T::ZERO; len];
    let runs = if parallel { rayon::current_num_threads().clamp(1, tasks.max(1)) } else { 1 };
    if runs == 1 {
        let mut acc = zero();
        (0..tasks).for_each(|t| f(t, &mut acc));
        return acc;
    }
    let partial: Vec<Vec<T>> = (0..runs)
        .into_par_iter()
        .map(|r| {
            let mut acc = zero();
            (r * tasks / runs..(r + 1) * tasks / runs).for_each(|t| f(t, &mut acc));
            acc
        })
        .collect();
    let mut parts = partial.into_iter();
    let mut acc = parts.next().unwrap_or_else(zero);
    for part in parts {
        acc.iter_mut().zip(&part).for_each(|(a, b)| *a += *b);
    }
    acc
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::kernels::testutil::*;
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
}
