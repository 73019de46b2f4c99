//! The fused BCE with logits against the composed candle ops (values and logit gradients, f32 and f64, huge
//! logits) and f64 central differences; the device path (composed value, one-op gradient from the probabilities)
//! against the composed value and PyTorch's gradient `σ(x) − z` in f64.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Device, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::loss::{bce_with_logits, bce_with_logits_composed, bce_with_logits_given_probs};

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

/// `σ(x)` in f64 on the host, as a tensor of `x`'s dtype.
fn sigmoid_of(x: &Tensor) -> Tensor {
    let p: Vec<f64> = values(x).iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect();
    Tensor::from_vec(p, x.shape(), &Device::Cpu).unwrap().to_dtype(x.dtype()).unwrap()
}

#[test]
fn the_device_path_has_the_composed_value_and_the_sigmoid_gradient() {
    let mut rng = Rng::new(11);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-6)] {
        for shape in [[1usize, 1, 1], [2, 6, 37], [3, 80, 210]] {
            // Logits up to about ±20: deep in both tails, where the composed backward loses digits.
            let x = Var::from_tensor(&rng.tensor(&shape, 0.0, 8.0, dtype)).unwrap();
            let z = (rng.tensor(&shape, 0.0, 1.0, dtype).abs().unwrap() / 4.0).unwrap().clamp(0.0, 0.99).unwrap();
            let w = rng.tensor(&shape, 0.0, 1.0, dtype);
            let p = sigmoid_of(x.as_tensor());
            let got = bce_with_logits_given_probs(x.as_tensor(), &z, &p).unwrap();
            let want = bce_with_logits_composed(x.as_tensor(), &z).unwrap();
            assert_eq!(values(&got), values(&want), "{shape:?} {dtype:?}: the value is the composed one, bit for bit");
            let g = grads(&[&x], |t| bce_with_logits_given_probs(t[0], &z, &p)?.mul(&w)?.sum_all());
            // PyTorch's `binary_cross_entropy_with_logits` backward: `w · (σ(x) − z)`, here in f64.
            let reference: Vec<f64> = values(x.as_tensor())
                .iter()
                .zip(values(&z))
                .zip(values(&w))
                .map(|((&xi, zi), wi)| wi * (1.0 / (1.0 + (-xi).exp()) - zi))
                .collect();
            let e = rel_err_vec(&values(&g[0]), &reference);
            assert!(e < tol, "{shape:?} {dtype:?}: grad rel err {e:e}");
        }
    }
}

#[test]
fn the_device_path_gives_the_targets_and_probabilities_no_gradient() {
    let mut rng = Rng::new(12);
    let x = Var::from_tensor(&rng.tensor(&[2, 3, 7], 0.0, 3.0, DType::F64)).unwrap();
    let z = Var::from_tensor(&(rng.tensor(&[2, 3, 7], 0.0, 1.0, DType::F64).abs().unwrap() / 3.0).unwrap()).unwrap();
    let p = Var::from_tensor(&sigmoid_of(x.as_tensor())).unwrap();
    let loss = bce_with_logits_given_probs(x.as_tensor(), z.as_tensor(), p.as_tensor()).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    assert!(g.get(z.as_tensor()).is_none() && g.get(p.as_tensor()).is_none(), "only the logits get a gradient");
    assert!(g.get(x.as_tensor()).is_some());
}
