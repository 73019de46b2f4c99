//! The fused BCE with logits against the composed candle ops (values and logit gradients, f32 and f64, huge
//! logits) and f64 central differences; the device path (the sum from the probabilities, one-op gradient)
//! against PyTorch's sum and gradient `σ(x) − z` in f64.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Device, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::loss::{
    bce_with_logits, bce_with_logits_composed, bce_with_logits_sum_given_probs, bce_with_logits_sum_one_hot,
    bce_with_logits_sum_one_hot_given_probs, bce_with_logits_sum_one_hot_kernel, one_hot_targets,
};

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

/// PyTorch's `binary_cross_entropy_with_logits(x, z, reduction="sum")` in f64 on the host, and its gradient
/// `σ(x) − z`.
fn reference_sum_and_grad(x: &Tensor, z: &Tensor) -> (f64, Vec<f64>) {
    let (xs, zs) = (values(x), values(z));
    let sum = xs.iter().zip(&zs).map(|(&v, &t)| v.max(0.0) - v * t + (-v.abs()).exp().ln_1p()).sum();
    let grad = xs.iter().zip(&zs).map(|(&v, &t)| 1.0 / (1.0 + (-v).exp()) - t).collect();
    (sum, grad)
}

#[test]
fn the_device_path_has_pytorchs_sum_and_gradient() {
    let mut rng = Rng::new(11);
    // f32: each element's terms are rounded once and the sum runs over up to 50 400 of them.
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        for shape in [[1usize, 1, 1], [2, 6, 37], [3, 80, 210]] {
            // Logits up to about ±20: deep in both tails, where the composed backward loses digits.
            let x = Var::from_tensor(&rng.tensor(&shape, 0.0, 8.0, dtype)).unwrap();
            let z = (rng.tensor(&shape, 0.0, 1.0, dtype).abs().unwrap() / 4.0).unwrap().clamp(0.0, 0.99).unwrap();
            let p = sigmoid_of(x.as_tensor());
            let (want, reference) = reference_sum_and_grad(x.as_tensor(), &z);
            let got = values(&bce_with_logits_sum_given_probs(x.as_tensor(), &z, &p).unwrap())[0];
            assert!((got - want).abs() <= tol * want, "{shape:?} {dtype:?}: sum {got} against {want}");
            // The gradient of 0.37 × the sum: 0.37 · (σ(x) − z), PyTorch's backward.
            let g = grads(&[&x], |t| bce_with_logits_sum_given_probs(t[0], &z, &p)?.affine(0.37, 0.0));
            let reference: Vec<f64> = reference.iter().map(|r| 0.37 * r).collect();
            let e = rel_err_vec(&values(&g[0]), &reference);
            assert!(e < tol, "{shape:?} {dtype:?}: grad rel err {e:e}");
        }
    }
}

#[test]
fn the_device_path_is_finite_and_exact_for_huge_logits() {
    let x = Tensor::new(&[-1e4f32, -80.0, 0.0, 80.0, 1e4, 3.0], &Device::Cpu).unwrap();
    let z = Tensor::new(&[0.0f32, 1.0, 0.5, 0.0, 1.0, 0.25], &Device::Cpu).unwrap();
    let p = sigmoid_of(&x);
    let got = values(&bce_with_logits_sum_given_probs(&x, &z, &p).unwrap())[0];
    let want = 80.0 + std::f64::consts::LN_2 + 80.0 + (3.0 - 0.75 + (-3.0f64).exp().ln_1p());
    assert!((got - want).abs() < 1e-5 * want, "{got} against {want}");
}

#[test]
fn the_device_path_gives_the_targets_and_probabilities_no_gradient() {
    let mut rng = Rng::new(12);
    let x = Var::from_tensor(&rng.tensor(&[2, 3, 7], 0.0, 3.0, DType::F64)).unwrap();
    let z = Var::from_tensor(&(rng.tensor(&[2, 3, 7], 0.0, 1.0, DType::F64).abs().unwrap() / 3.0).unwrap()).unwrap();
    let p = Var::from_tensor(&sigmoid_of(x.as_tensor())).unwrap();
    let loss = bce_with_logits_sum_given_probs(x.as_tensor(), z.as_tensor(), p.as_tensor()).unwrap();
    let g = loss.backward().unwrap();
    assert!(g.get(z.as_tensor()).is_none() && g.get(p.as_tensor()).is_none(), "only the logits get a gradient");
    assert!(g.get(x.as_tensor()).is_some());
}

#[test]
fn one_hot_targets_place_each_anchors_weight_at_its_label() {
    let mut rng = Rng::new(13);
    let (b, c, a) = (2usize, 5usize, 9usize);
    let label: Vec<u32> = (0..b * a).map(|i| ((i * 7 + 3) % c) as u32).collect();
    let weight = rng.tensor(&[b, a], 0.0, 1.0, DType::F32).abs().unwrap();
    let label_t = Tensor::from_vec(label.clone(), (b, a), &Device::Cpu).unwrap();
    let z = values(&one_hot_targets(&label_t, &weight, c).unwrap());
    let w = values(&weight);
    for bi in 0..b {
        for ci in 0..c {
            for ai in 0..a {
                let want = if label[bi * a + ai] as usize == ci { w[bi * a + ai] } else { 0.0 };
                assert_eq!(z[(bi * c + ci) * a + ai], want, "z[{bi}, {ci}, {ai}]");
            }
        }
    }
}

#[test]
fn the_one_hot_sum_has_pytorchs_sum_and_gradient_on_every_path() {
    let mut rng = Rng::new(14);
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        let (b, c, a) = (3usize, 80usize, 210usize);
        let x = Var::from_tensor(&rng.tensor(&[b, c, a], 0.0, 8.0, dtype)).unwrap();
        let label: Vec<u32> = (0..b * a).map(|i| ((i * 31 + 5) % c) as u32).collect();
        let label = Tensor::from_vec(label, (b, a), &Device::Cpu).unwrap();
        // Target scores in [0, 1), zero off a third of the anchors (the background).
        let keep: Vec<f64> = (0..b * a).map(|i| f64::from(i % 3 != 0)).collect();
        let keep = Tensor::from_vec(keep, (b, a), &Device::Cpu).unwrap().to_dtype(dtype).unwrap();
        let weight = ((rng.tensor(&[b, a], 0.0, 1.0, dtype).abs().unwrap() / 3.0).unwrap().clamp(0.0, 0.99).unwrap()
            * keep)
            .unwrap();
        let z = one_hot_targets(&label, &weight, c).unwrap();
        let p = sigmoid_of(x.as_tensor());
        let (want, reference) = reference_sum_and_grad(x.as_tensor(), &z);
        let reference: Vec<f64> = reference.iter().map(|r| 0.37 * r).collect();
        type Sum = fn(&Tensor, &Tensor, &Tensor, &Tensor) -> candle_core::Result<Tensor>;
        let mut paths: Vec<(&str, Sum)> =
            vec![("fused", bce_with_logits_sum_one_hot), ("device", bce_with_logits_sum_one_hot_given_probs)];
        // The one-kernel sum (opt-in `fused_bce` on a device; here its host twin) takes f32.
        if dtype == DType::F32 {
            paths.push(("one kernel", bce_with_logits_sum_one_hot_kernel));
        }
        for (path, f) in paths {
            let got = values(&f(x.as_tensor(), &label, &weight, &p).unwrap())[0];
            assert!((got - want).abs() <= tol * want, "{path} {dtype:?}: sum {got} against {want}");
            let g = grads(&[&x], |t| f(t[0], &label, &weight, &p)?.affine(0.37, 0.0));
            let e = rel_err_vec(&values(&g[0]), &reference);
            assert!(e < tol, "{path} {dtype:?}: grad rel err {e:e}");
        }
    }
}
