//! Fused max-pool and nearest upsample against the composed candle ops, a direct PyTorch-rule reference for
//! ties, f64 central differences, and a graph where one tensor feeds an upsample and a concat; the device's
//! gathered max-pool against the fused op, ties included.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::pool::{
    max_pool2d_same, max_pool2d_same_composed, max_pool2d_same_gather, upsample_nearest2x, upsample_nearest2x_composed,
};

const SHAPES: &[[usize; 4]] = &[[1, 1, 1, 1], [2, 3, 7, 6], [1, 2, 5, 9], [3, 4, 13, 10], [1, 1, 2, 3], [8, 2, 10, 10]];

#[test]
fn max_pool_matches_composed_on_distinct_values() {
    let mut rng = Rng::new(10);
    for dtype in [DType::F32, DType::F64] {
        for &shape in SHAPES {
            for k in [1, 3, 5, 7] {
                // All negative: a zero padding would show up as a wrong maximum.
                let x = Var::from_tensor(&(rng.tensor(&shape, -5.0, 1.0, dtype))).unwrap();
                let w = rng.tensor(&shape, 0.0, 1.0, dtype);
                let y1 = max_pool2d_same(x.as_tensor(), k).unwrap();
                let y2 = max_pool2d_same_composed(x.as_tensor(), k).unwrap();
                assert_eq!(values(&y1), values(&y2), "{shape:?} k{k} {dtype:?}");
                let g1 = grads(&[&x], |t| max_pool2d_same(t[0], k)?.mul(&w)?.sum_all());
                let g2 = grads(&[&x], |t| max_pool2d_same_composed(t[0], k)?.mul(&w)?.sum_all());
                let e = rel_err(&g1[0], &g2[0]);
                assert!(e < 1e-6, "{shape:?} k{k} {dtype:?}: grad rel err {e:e}");
            }
        }
    }
}

/// PyTorch's rule written out: each output's gradient goes to the first maximum of its window in raster order.
fn reference_pool(x: &[f64], g: &[f64], (n, c, h, w): (usize, usize, usize, usize), k: usize) -> (Vec<f64>, Vec<f64>) {
    let p = (k / 2) as isize;
    let mut y = vec![0.0; x.len()];
    let mut dx = vec![0.0; x.len()];
    for plane in 0..n * c {
        let base = plane * h * w;
        for i in 0..h as isize {
            for j in 0..w as isize {
                let mut best: Option<(f64, usize)> = None;
                for ii in i - p..=i + p {
                    for jj in j - p..=j + p {
                        if ii < 0 || jj < 0 || ii >= h as isize || jj >= w as isize {
                            continue;
                        }
                        let idx = base + ii as usize * w + jj as usize;
                        if best.is_none_or(|(b, _)| x[idx] > b) {
                            best = Some((x[idx], idx));
                        }
                    }
                }
                let (v, arg) = best.unwrap();
                let o = base + i as usize * w + j as usize;
                y[o] = v;
                dx[arg] += g[o];
            }
        }
    }
    (y, dx)
}

#[test]
fn max_pool_ties_route_to_the_first_maximum_and_accumulate() {
    let mut rng = Rng::new(11);
    for dtype in [DType::F32, DType::F64] {
        for &shape in SHAPES {
            for k in [3, 5] {
                let x = Var::from_tensor(&rng.ints(&shape, 3, dtype)).unwrap();
                let w = rng.tensor(&shape, 0.0, 1.0, dtype);
                let y = max_pool2d_same(x.as_tensor(), k).unwrap();
                let g = grads(&[&x], |t| max_pool2d_same(t[0], k)?.mul(&w)?.sum_all());
                let dims = (shape[0], shape[1], shape[2], shape[3]);
                let (ry, rdx) = reference_pool(&values(x.as_tensor()), &values(&w), dims, k);
                assert_eq!(values(&y), ry, "{shape:?} k{k} {dtype:?}");
                let e = rel_err_vec(&values(&g[0]), &rdx);
                assert!(e < 1e-6, "{shape:?} k{k} {dtype:?}: grad rel err {e:e}");
                // The forward also agrees with candle's composed pool.
                assert_eq!(values(&y), values(&max_pool2d_same_composed(x.as_tensor(), k).unwrap()));
            }
        }
    }
}

#[test]
fn chained_pools_match_central_differences() {
    // SPPF: three k5 pools in a row, all three outputs used. Distinct values keep the argmax stable under ±h.
    let mut rng = Rng::new(12);
    let shape = [1, 2, 6, 5];
    let x = rng.tensor(&shape, 0.0, 1.0, DType::F64);
    let w = rng.tensor(&[1, 6, 6, 5], 0.0, 1.0, DType::F64);
    let f = |t: &Tensor| -> candle_core::Result<Tensor> {
        let a = max_pool2d_same(t, 5)?;
        let b = max_pool2d_same(&a, 5)?;
        let c = max_pool2d_same(&b, 5)?;
        Tensor::cat(&[&a, &b, &c], 1)?.mul(&w)?.sum_all()
    };
    let v = Var::from_tensor(&x).unwrap();
    let analytic = grads(&[&v], |t| f(t[0]));
    let numeric = numeric_grad(&[x], 0, 1e-6, |t| f(&t[0]).unwrap().to_scalar::<f64>().unwrap());
    let e = rel_err_vec(&values(&analytic[0]), &numeric);
    assert!(e < 1e-8, "rel err {e:e}");
}

#[test]
fn upsample_matches_composed() {
    let mut rng = Rng::new(13);
    for dtype in [DType::F32, DType::F64] {
        for &shape in SHAPES {
            let x = Var::from_tensor(&rng.tensor(&shape, 0.0, 1.0, dtype)).unwrap();
            let up = [shape[0], shape[1], 2 * shape[2], 2 * shape[3]];
            let w = rng.tensor(&up, 0.0, 1.0, dtype);
            let y1 = upsample_nearest2x(x.as_tensor()).unwrap();
            assert_eq!(y1.dims(), &up);
            assert_eq!(values(&y1), values(&upsample_nearest2x_composed(x.as_tensor()).unwrap()));
            // Also against candle's native upsample (forward only: its backward is the defective one).
            assert_eq!(values(&y1), values(&x.as_tensor().upsample_nearest2d(up[2], up[3]).unwrap()));
            let g1 = grads(&[&x], |t| upsample_nearest2x(t[0])?.mul(&w)?.sum_all());
            let g2 = grads(&[&x], |t| upsample_nearest2x_composed(t[0])?.mul(&w)?.sum_all());
            let e = rel_err(&g1[0], &g2[0]);
            assert!(e < 1e-6, "{shape:?} {dtype:?}: grad rel err {e:e}");
        }
    }
}

#[test]
fn gradient_accumulates_over_upsample_and_concat() {
    // P5 in the neck: one tensor feeds an upsample and (directly) a concat; both contributions must add up.
    let mut rng = Rng::new(14);
    let x = rng.tensor(&[2, 3, 3, 4], 0.0, 1.0, DType::F64);
    let z = rng.tensor(&[2, 2, 3, 4], 0.0, 1.0, DType::F64);
    let w_up = rng.tensor(&[2, 3, 6, 8], 0.0, 1.0, DType::F64);
    let w_cat = rng.tensor(&[2, 5, 3, 4], 0.0, 1.0, DType::F64);
    let f = |t: &Tensor| -> candle_core::Result<Tensor> {
        let up = upsample_nearest2x(t)?.mul(&w_up)?.sum_all()?;
        let cat = Tensor::cat(&[t, &z], 1)?.mul(&w_cat)?.sum_all()?;
        up + cat
    };
    let v = Var::from_tensor(&x).unwrap();
    let g = grads(&[&v], |t| f(t[0]));
    // Exact expectation: the 2×2 block sums of w_up plus the first three channels of w_cat.
    let blocks = w_up.reshape((2, 3, 3, 2, 4, 2)).unwrap().sum(5).unwrap().sum(3).unwrap();
    let expected = (blocks + w_cat.narrow(1, 0, 3).unwrap()).unwrap();
    assert!(rel_err(&g[0], &expected) < 1e-14);
    let numeric = numeric_grad(&[x], 0, 1e-6, |t| f(&t[0]).unwrap().to_scalar::<f64>().unwrap());
    assert!(rel_err_vec(&values(&g[0]), &numeric) < 1e-8);
}

#[test]
fn strided_and_fallback_inputs() {
    let mut rng = Rng::new(15);
    // A permuted input is copied to a contiguous one first.
    let x = rng.tensor(&[2, 3, 5, 4], 0.0, 1.0, DType::F32).permute((0, 1, 3, 2)).unwrap();
    let y1 = max_pool2d_same(&x, 3).unwrap();
    let y2 = max_pool2d_same_composed(&x.contiguous().unwrap(), 3).unwrap();
    assert_eq!(values(&y1), values(&y2));
    assert_eq!(values(&upsample_nearest2x(&x).unwrap()), values(&upsample_nearest2x_composed(&x).unwrap()));
    // f16 has no kernel: the composed ops run.
    let h = x.to_dtype(DType::F16).unwrap();
    assert_eq!(max_pool2d_same(&h, 3).unwrap().dtype(), DType::F16);
    assert_eq!(upsample_nearest2x(&h).unwrap().dims(), &[2, 3, 8, 10]);
}

/// The device form picks each window's first maximum in raster order as the fused op does: on small integers
/// (ties everywhere, so any other pick moves a gradient) with integer output gradients (sums exact in any order),
/// values and gradients are equal to the fused op's, in f32 and f64 and, for the autocast step, in f16 and bf16.
#[test]
fn the_gathered_pool_is_the_fused_one_ties_included() {
    let mut rng = Rng::new(21);
    for (dtype, reference) in
        [(DType::F32, DType::F32), (DType::F64, DType::F64), (DType::F16, DType::F32), (DType::BF16, DType::F32)]
    {
        for &shape in SHAPES.iter().chain(&[[2, 3, 20, 20]]) {
            for k in [1, 3, 5, 7] {
                let ints = (rng.ints(&shape, 4, DType::F64) - 2.0).unwrap();
                let w = rng.ints(&shape, 5, DType::F64);
                let x = Var::from_tensor(&ints.to_dtype(dtype).unwrap()).unwrap();
                let xr = Var::from_tensor(&ints.to_dtype(reference).unwrap()).unwrap();
                let (wd, wr) = (w.to_dtype(dtype).unwrap(), w.to_dtype(reference).unwrap());
                let y = max_pool2d_same_gather(x.as_tensor(), k).unwrap();
                let want = max_pool2d_same(xr.as_tensor(), k).unwrap();
                assert_eq!(values(&y), values(&want), "{shape:?} k{k} {dtype:?}: values");
                let g = grads(&[&x], |t| max_pool2d_same_gather(t[0], k)?.mul(&wd)?.sum_all());
                let gr = grads(&[&xr], |t| max_pool2d_same(t[0], k)?.mul(&wr)?.sum_all());
                assert_eq!(values(&g[0]), values(&gr[0]), "{shape:?} k{k} {dtype:?}: gradients");
            }
        }
    }
}
