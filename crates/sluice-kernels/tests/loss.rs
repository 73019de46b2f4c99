//! The fused BCE with logits against the composed candle ops (values and logit gradients, f32 and f64, huge
//! logits) and f64 central differences.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Device, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::loss::{bce_with_logits, bce_with_logits_composed};

#[test]
fn matches_composed_values_and_gradients() {
    let mut rng = Rng::new(5);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
        for shape in [[1usize, 1, 1], [2, 6, 37], [3, 80, 210], [1, 3, 40000]] {
            let x = Var::from_tensor(&rng.tensor(&shape, 0.0, 5.0, dtype)).unwrap();
            // Soft targets in [0, 1), as the assigner's scores are.
            let z = (rng.tensor(&shape, 0.0, 1.0, dtype).abs().unwrap() / 4.0).unwrap().clamp(0.0, 0.99).unwrap();
            let w = rng.tensor(&shape, 0.0, 1.0, dtype);
            let e = rel_err(
                &bce_with_logits(x.as_tensor(), &z).unwrap(),
                &bce_with_logits_composed(x.as_tensor(), &z).unwrap(),
            );
            assert!(e < tol, "{shape:?} {dtype:?}: value rel err {e:e}");
            let g1 = grads(&[&x], |t| bce_with_logits(t[0], &z)?.mul(&w)?.sum_all());
            let g2 = grads(&[&x], |t| bce_with_logits_composed(t[0], &z)?.mul(&w)?.sum_all());
            let e = rel_err(&g1[0], &g2[0]);
            assert!(e < tol, "{shape:?} {dtype:?}: grad rel err {e:e}");
        }
    }
}

#[test]
fn huge_logits_are_finite_and_exact() {
    let x = Tensor::new(&[-1e4f32, -80.0, 0.0, 80.0, 1e4], &Device::Cpu).unwrap();
    let z = Tensor::new(&[0.0f32, 1.0, 0.5, 0.0, 1.0], &Device::Cpu).unwrap();
    let y = values(&bce_with_logits(&x, &z).unwrap());
    let want = [0.0, 80.0, std::f64::consts::LN_2, 80.0, 0.0];
    for (g, w) in y.iter().zip(want) {
        assert!((g - w).abs() < 1e-5 * w.max(1.0), "{y:?}");
    }
}

#[test]
fn gradient_matches_f64_central_differences_and_targets_get_none() {
    let mut rng = Rng::new(9);
    let x = Var::from_tensor(&rng.tensor(&[2, 3, 7], 0.0, 3.0, DType::F64)).unwrap();
    let z = Var::from_tensor(&(rng.tensor(&[2, 3, 7], 0.0, 1.0, DType::F64).abs().unwrap() / 3.0).unwrap()).unwrap();
    let w = rng.tensor(&[2, 3, 7], 0.0, 1.0, DType::F64);
    let f = |t: &Tensor| bce_with_logits(t, z.as_tensor())?.mul(&w)?.sum_all();
    let g = f(x.as_tensor()).unwrap().backward().unwrap();
    assert!(g.get(z.as_tensor()).is_none(), "the targets are detached");
    let numeric = numeric_grad(&[x.as_tensor().clone()], 0, 1e-6, |t| f(&t[0]).unwrap().to_scalar::<f64>().unwrap());
    let e = rel_err_vec(&values(g.get(x.as_tensor()).unwrap()), &numeric);
    assert!(e < 1e-8, "rel err {e:e}");
}
