//! The polyphase input gradient of YOLO's 3×3 stride-2 padding-1 conv: each of the four parities of input
//! position is a stride-1 conv of `dy` with a 1×1, 1×2, 2×1 or 2×2 sub-kernel, one gemm each on shifted copies of a
//! band of `dy`, interleaved into `dx`: every element written once, no column matrix for col2im to add up.

use std::mem::MaybeUninit;

use multiversion::multiversion;

use super::matmul::{for_groups, gemm_par, matmul};
use super::{Elem, Geom};
use crate::uninit::{as_uninit, filled_vec};

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
/// column matrix `9c × ho·wo` for col2im to add up.
pub(super) fn down3_backward_input<T: Elem>(dy: &[T], w: &[T], g: &Geom) -> Vec<T> {
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
