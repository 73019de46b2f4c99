//! The input gradient `dx` of a convolution, by plan: a stride-1 "same" conv's as the forward of a conv of `dy` with
//! the rotated, transposed kernel; the 3×3 stride-2 conv's polyphase ([`super::polyphase`]); a pointwise conv's as
//! one gemm per image; any other as `wᵀ · dy` and col2im per group.

use super::im2col::col2im;
use super::matmul::{for_groups, gemm_par, matmul};
use super::polyphase::down3_backward_input;
use super::stacked::gather_dy;
use super::{Elem, Geom, forward};
use crate::uninit::{as_uninit, fill_init, filled_vec};

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
/// `k²` times the size of `dx` for col2im to add up.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::kernels::testutil::*;
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
}
