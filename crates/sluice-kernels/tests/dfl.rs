//! The fused DFL decode against the composed candle ops (values and gradients, f32 and f64, odd anchor counts,
//! large logits) and f64 central differences.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::dfl::{dfl_decode, dfl_decode_composed};

/// (batch, reg_max, anchors)
const SHAPES: &[(usize, usize, usize)] = &[(1, 16, 1), (2, 16, 37), (3, 4, 8), (1, 1, 5), (2, 16, 336)];

#[test]
fn matches_composed_values_and_gradients() {
    let mut rng = Rng::new(7);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        for &(b, r, a) in SHAPES {
            // Wide logits (std 4) so the max shift matters.
            let x = Var::from_tensor(&rng.tensor(&[b, 4 * r, a], 0.0, 4.0, dtype)).unwrap();
            let w = rng.tensor(&[b, 4, a], 0.0, 1.0, dtype);
            let (y1, y2) = (dfl_decode(x.as_tensor(), r).unwrap(), dfl_decode_composed(x.as_tensor(), r).unwrap());
            assert_eq!(y1.dims(), &[b, 4, a]);
            let e = rel_err(&y1, &y2);
            assert!(e < tol, "{b}x{r}x{a} {dtype:?}: value rel err {e:e}");
            let g1 = grads(&[&x], |t| dfl_decode(t[0], r)?.mul(&w)?.sum_all());
            let g2 = grads(&[&x], |t| dfl_decode_composed(t[0], r)?.mul(&w)?.sum_all());
            let e = rel_err(&g1[0], &g2[0]);
            assert!(e < tol, "{b}x{r}x{a} {dtype:?}: grad rel err {e:e}");
        }
    }
}

#[test]
fn huge_logits_stay_finite_and_pick_the_bin() {
    // One bin far above the others: the expectation is that bin, without overflow.
    let mut v = vec![0f32; 16 * 4 * 2];
    for side in 0..4 {
        for anchor in 0..2 {
            v[(side * 16 + 3 + side) * 2 + anchor] = 1e4;
        }
    }
    let x = Tensor::from_vec(v, (1, 64, 2), &candle_core::Device::Cpu).unwrap();
    let y = values(&dfl_decode(&x, 16).unwrap());
    for (i, got) in y.iter().enumerate() {
        assert!((got - (3 + i / 2) as f64).abs() < 1e-4, "{y:?}");
    }
}

#[test]
fn gradient_matches_f64_central_differences() {
    let mut rng = Rng::new(3);
    let x = Var::from_tensor(&rng.tensor(&[2, 12, 5], 0.0, 2.0, DType::F64)).unwrap();
    let w = rng.tensor(&[2, 4, 5], 0.0, 1.0, DType::F64);
    let f = |t: &Tensor| dfl_decode(t, 3)?.mul(&w)?.sum_all();
    let analytic = grads(&[&x], |t| f(t[0]));
    let numeric = numeric_grad(&[x.as_tensor().clone()], 0, 1e-6, |t| f(&t[0]).unwrap().to_scalar::<f64>().unwrap());
    let e = rel_err_vec(&values(&analytic[0]), &numeric);
    assert!(e < 1e-8, "rel err {e:e}");
}

#[test]
fn bad_shapes_are_errors() {
    let x = Tensor::zeros((1, 10, 3), DType::F32, &candle_core::Device::Cpu).unwrap();
    assert!(dfl_decode(&x, 16).is_err());
    assert!(dfl_decode(&x.flatten_all().unwrap(), 16).is_err());
}
