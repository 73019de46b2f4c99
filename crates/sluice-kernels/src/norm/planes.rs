//! The per-plane loops of the BatchNorm + SiLU sweeps (one `h·w` plane of one image and channel each): moments,
//! affine + SiLU, and the backward's two sweeps. Written over fixed-size lane arrays so LLVM vectorises them, and
//! compiled for AVX-512 and AVX2+FMA as well as baseline x86-64, picked at run time (`multiversion`).

use std::mem::MaybeUninit;

use multiversion::multiversion;

use super::Elem;
use super::math::{silu, silu_grad};

/// Lanes of the per-element loops: written as fixed-size arrays so LLVM vectorises them (one AVX-512 register of
/// f32, two AVX2 ones).
const LANES: usize = 16;
/// Elements whose sums are accumulated in the element type before being added into the f64 totals: each lane then
/// adds only `BLOCK / LANES` values in f32, and the loop stays in vector registers (converting every element to
/// f64 made LLVM shuffle lanes one by one).
const BLOCK: usize = 256;

/// Per-plane sums `(Σ(x−k), Σ(x−k)²)` in f64, `k` the channel's shift.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(super) fn plane_moments<T: Elem>(x: &[T], k: T) -> (f64, f64) {
    let (mut a, mut b) = (0f64, 0f64);
    for blk in x.chunks(BLOCK) {
        let mut s1 = [T::zero(); LANES];
        let mut s2 = [T::zero(); LANES];
        let mut chunks = blk.chunks_exact(LANES);
        for ch in &mut chunks {
            for l in 0..LANES {
                let d = ch[l] - k;
                s1[l] += d;
                s2[l] += d * d;
            }
        }
        let (mut p1, mut p2) = lane_sums(&s1, &s2);
        for &v in chunks.remainder() {
            let d = v - k;
            p1 += d;
            p2 += d * d;
        }
        a += p1.to_f64();
        b += p2.to_f64();
    }
    (a, b)
}

/// The sums of two lane arrays, in lane order.
#[inline(always)]
fn lane_sums<T: Elem>(s1: &[T; LANES], s2: &[T; LANES]) -> (T, T) {
    let (mut p1, mut p2) = (T::zero(), T::zero());
    for l in 0..LANES {
        p1 += s1[l];
        p2 += s2[l];
    }
    (p1, p2)
}

/// `x = SiLU(x)` in place: the inference epilogue of [`crate::conv::conv2d_bias_silu`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(crate) fn silu_in_place<T: Elem>(x: &mut [T]) {
    for v in x.iter_mut() {
        *v = silu(*v);
    }
}

/// `y = SiLU(x·a + b)` over one plane.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(super) fn plane_affine_silu<T: Elem>(x: &[T], y: &mut [MaybeUninit<T>], a: T, b: T) {
    for (yo, &xi) in y.iter_mut().zip(x) {
        yo.write(silu(xi * a + b));
    }
}

/// One plane of the backward sweep: `dz = g·SiLU'(x·a + b)`, writes `out = dz·out_scale`, returns
/// `(Σ dz, Σ dz·(x − m))` in f64.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(super) fn plane_dz<T: Elem>(
    x: &[T],
    g: &[T],
    out: &mut [MaybeUninit<T>],
    a: T,
    b: T,
    m: T,
    out_scale: T,
) -> (f64, f64) {
    let (mut r0, mut r1) = (0f64, 0f64);
    for ((xb, gb), ob) in x.chunks(BLOCK).zip(g.chunks(BLOCK)).zip(out.chunks_mut(BLOCK)) {
        let mut s0 = [T::zero(); LANES];
        let mut s1 = [T::zero(); LANES];
        let mut xc = xb.chunks_exact(LANES);
        let mut gc = gb.chunks_exact(LANES);
        let mut oc = ob.chunks_exact_mut(LANES);
        for ((xs, gs), os) in (&mut xc).zip(&mut gc).zip(&mut oc) {
            for l in 0..LANES {
                let dz = gs[l] * silu_grad(xs[l] * a + b);
                os[l].write(dz * out_scale);
                s0[l] += dz;
                s1[l] += dz * (xs[l] - m);
            }
        }
        let (mut p0, mut p1) = lane_sums(&s0, &s1);
        for ((&xi, &gi), o) in xc.remainder().iter().zip(gc.remainder()).zip(oc.into_remainder()) {
            let dz = gi * silu_grad(xi * a + b);
            o.write(dz * out_scale);
            p0 += dz;
            p1 += dz * (xi - m);
        }
        r0 += p0.to_f64();
        r1 += p1.to_f64();
    }
    (r0, r1)
}

/// The backward's second sweep over one plane, in place: `d = k·d − k0 − k1·(x − m)`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512dq+avx512vl", "x86_64+avx2+fma"))]
pub(super) fn plane_dx<T: Elem>(x: &[T], d: &mut [T], (k, k0, k1, m): (T, T, T, T)) {
    for (d, &xi) in d.iter_mut().zip(x) {
        *d = k * *d - k0 - k1 * (xi - m);
    }
}
