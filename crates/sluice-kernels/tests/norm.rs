//! Fused BatchNorm(train)+SiLU and affine+SiLU against the composed candle ops (forward, statistics, gradients
//! of every input) and against f64 central differences.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

mod common;
mod poison;

use candle_core::{DType, Tensor, Var};
use common::{Rng, grads, numeric_grad, rel_err, rel_err_vec, values};
use sluice_kernels::norm::{affine_silu, affine_silu_composed, batch_norm_silu_train, batch_norm_silu_train_composed};

const EPS: f64 = 1e-3;

/// Shapes with batch 1, odd sizes, 1×1 planes and a channel whose N·H·W is 1.
const SHAPES: &[[usize; 4]] = &[[1, 3, 5, 7], [2, 4, 3, 3], [3, 5, 1, 1], [1, 2, 1, 1], [4, 8, 9, 11], [2, 16, 20, 20]];

/// Compares the fused op with the composed one on one shape: y, mean, var and the gradients of x, γ, β for the
/// loss `Σ y·w`.
fn check_train(rng: &mut Rng, shape: [usize; 4], dtype: DType, tol: f64) {
    let c = shape[1];
    // An offset mean (5) and a non-unit spread test the conditioning of the statistics.
    let x = Var::from_tensor(&rng.tensor(&shape, 5.0, 2.0, dtype)).unwrap();
    let g = Var::from_tensor(&rng.tensor(&[c], 1.0, 0.5, dtype)).unwrap();
    let b = Var::from_tensor(&rng.tensor(&[c], 0.0, 0.5, dtype)).unwrap();
    let w = rng.tensor(&shape, 0.0, 1.0, dtype);
    let (y1, m1, v1) = batch_norm_silu_train(x.as_tensor(), g.as_tensor(), b.as_tensor(), EPS).unwrap();
    let (y2, m2, v2) = batch_norm_silu_train_composed(x.as_tensor(), g.as_tensor(), b.as_tensor(), EPS).unwrap();
    assert_eq!(m1.dims(), &[c]);
    assert!(!m1.track_op() && !v1.track_op(), "statistics must be detached");
    for (name, a, r) in [("y", &y1, &y2), ("mean", &m1, &m2), ("var", &v1, &v2)] {
        let e = rel_err(a, r);
        assert!(e < tol, "{shape:?} {dtype:?} {name}: rel err {e:e}");
    }
    let fused = grads(&[&x, &g, &b], |t| batch_norm_silu_train(t[0], t[1], t[2], EPS)?.0.mul(&w)?.sum_all());
    let composed =
        grads(&[&x, &g, &b], |t| batch_norm_silu_train_composed(t[0], t[1], t[2], EPS)?.0.mul(&w)?.sum_all());
    for (name, a, r) in
        [("dx", &fused[0], &composed[0]), ("dgamma", &fused[1], &composed[1]), ("dbeta", &fused[2], &composed[2])]
    {
        let e = rel_err(a, r);
        assert!(e < tol, "{shape:?} {dtype:?} {name}: rel err {e:e}");
    }
}

#[test]
fn train_f32_matches_composed() {
    let mut rng = Rng::new(1);
    for &s in SHAPES {
        check_train(&mut rng, s, DType::F32, 2e-5);
    }
}

#[test]
fn train_f64_matches_composed() {
    let mut rng = Rng::new(2);
    for &s in SHAPES {
        check_train(&mut rng, s, DType::F64, 1e-11);
    }
}

#[test]
fn train_strided_input_matches_composed() {
    // A permuted (non-contiguous) input goes through the same kernels after a copy.
    let mut rng = Rng::new(3);
    let x = rng.tensor(&[2, 5, 4, 3], 0.0, 1.0, DType::F64).permute((0, 1, 3, 2)).unwrap();
    let g = rng.tensor(&[5], 1.0, 0.3, DType::F64);
    let b = rng.tensor(&[5], 0.0, 0.3, DType::F64);
    let (y1, ..) = batch_norm_silu_train(&x, &g, &b, EPS).unwrap();
    let (y2, ..) = batch_norm_silu_train_composed(&x, &g, &b, EPS).unwrap();
    assert!(rel_err(&y1, &y2) < 1e-12);
}

#[test]
fn train_gradients_match_central_differences() {
    let mut rng = Rng::new(4);
    let shape = [2, 3, 3, 2];
    let inputs = vec![
        rng.tensor(&shape, 0.5, 1.5, DType::F64),
        rng.tensor(&[3], 1.0, 0.5, DType::F64),
        rng.tensor(&[3], 0.0, 0.5, DType::F64),
    ];
    let w = rng.tensor(&shape, 0.0, 1.0, DType::F64);
    let loss = |t: &[Tensor]| -> f64 {
        let (y, ..) = batch_norm_silu_train(&t[0], &t[1], &t[2], EPS).unwrap();
        y.mul(&w).unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap()
    };
    let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let analytic =
        grads(&[&vars[0], &vars[1], &vars[2]], |t| batch_norm_silu_train(t[0], t[1], t[2], EPS)?.0.mul(&w)?.sum_all());
    for (i, name) in ["x", "gamma", "beta"].iter().enumerate() {
        let numeric = numeric_grad(&inputs, i, 1e-5, loss);
        let e = rel_err_vec(&values(&analytic[i]), &numeric);
        assert!(e < 1e-7, "d{name}: rel err {e:e}");
    }
}

#[test]
fn affine_silu_matches_composed_and_central_differences() {
    let mut rng = Rng::new(5);
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        for &shape in SHAPES {
            let c = shape[1];
            let x = Var::from_tensor(&rng.tensor(&shape, 0.0, 3.0, dtype)).unwrap();
            let s = Var::from_tensor(&rng.tensor(&[c], 1.0, 0.5, dtype)).unwrap();
            let t = Var::from_tensor(&rng.tensor(&[c], 0.0, 1.0, dtype)).unwrap();
            let w = rng.tensor(&shape, 0.0, 1.0, dtype);
            let y1 = affine_silu(x.as_tensor(), s.as_tensor(), t.as_tensor()).unwrap();
            let y2 = affine_silu_composed(x.as_tensor(), s.as_tensor(), t.as_tensor()).unwrap();
            assert!(rel_err(&y1, &y2) < tol, "{shape:?} {dtype:?} y: {:e}", rel_err(&y1, &y2));
            let a = grads(&[&x, &s, &t], |v| affine_silu(v[0], v[1], v[2])?.mul(&w)?.sum_all());
            let r = grads(&[&x, &s, &t], |v| affine_silu_composed(v[0], v[1], v[2])?.mul(&w)?.sum_all());
            for i in 0..3 {
                let e = rel_err(&a[i], &r[i]);
                assert!(e < tol, "{shape:?} {dtype:?} grad {i}: rel err {e:e}");
            }
        }
    }
    // Central differences on a tiny f64 case.
    let shape = [2, 2, 2, 3];
    let inputs = vec![
        rng.tensor(&shape, 0.0, 2.0, DType::F64),
        rng.tensor(&[2], 1.0, 0.5, DType::F64),
        rng.tensor(&[2], 0.0, 0.5, DType::F64),
    ];
    let w = rng.tensor(&shape, 0.0, 1.0, DType::F64);
    let loss = |t: &[Tensor]| -> f64 {
        affine_silu(&t[0], &t[1], &t[2]).unwrap().mul(&w).unwrap().sum_all().unwrap().to_scalar().unwrap()
    };
    let vars: Vec<Var> = inputs.iter().map(|t| Var::from_tensor(t).unwrap()).collect();
    let analytic = grads(&[&vars[0], &vars[1], &vars[2]], |v| affine_silu(v[0], v[1], v[2])?.mul(&w)?.sum_all());
    for (i, a) in analytic.iter().enumerate() {
        let e = rel_err_vec(&values(a), &numeric_grad(&inputs, i, 1e-5, loss));
        assert!(e < 1e-8, "grad {i}: rel err {e:e}");
    }
}

#[test]
fn other_dtypes_fall_back_to_the_composed_ops() {
    // f16 has no fused kernel: the composed path runs and agrees with the f32 kernel to f16 precision.
    let mut rng = Rng::new(6);
    let x = rng.tensor(&[2, 3, 4, 4], 0.0, 1.0, DType::F32);
    let g = rng.tensor(&[3], 1.0, 0.2, DType::F32);
    let b = rng.tensor(&[3], 0.0, 0.2, DType::F32);
    let h = |t: &Tensor| t.to_dtype(DType::F16).unwrap();
    let (y16, ..) = batch_norm_silu_train(&h(&x), &h(&g), &h(&b), EPS).unwrap();
    let (y32, ..) = batch_norm_silu_train(&x, &g, &b, EPS).unwrap();
    assert_eq!(y16.dtype(), DType::F16);
    assert!(rel_err(&y16, &y32) < 1e-2);
    let a16 = affine_silu(&h(&x), &h(&g), &h(&b)).unwrap();
    let a32 = affine_silu(&x, &g, &b).unwrap();
    assert!(rel_err(&a16, &a32) < 1e-2);
}

#[test]
fn half_activations_with_f32_parameters_take_f32_statistics() {
    // Mixed precision: f16 / bf16 activations, f32 γ and β. On the CPU the fused kernel computes in f32 between
    // conversions (as the CUDA kernel does), so y is the f32 result rounded once, the statistics are the f32 op's,
    // and the gradients of γ and β are f32.
    let mut rng = Rng::new(7);
    let shape = [2, 5, 6, 7];
    let x = rng.tensor(&shape, 3.0, 2.0, DType::F32);
    let g = Var::from_tensor(&rng.tensor(&[5], 1.0, 0.2, DType::F32)).unwrap();
    let b = Var::from_tensor(&rng.tensor(&[5], 0.0, 0.2, DType::F32)).unwrap();
    let w = rng.tensor(&shape, 0.0, 1.0, DType::F32);
    for half in [DType::F16, DType::BF16] {
        let xh = Var::from_tensor(&x.to_dtype(half).unwrap()).unwrap();
        let x32 = xh.as_tensor().to_dtype(DType::F32).unwrap();
        let (y, m, v) = batch_norm_silu_train(xh.as_tensor(), g.as_tensor(), b.as_tensor(), EPS).unwrap();
        let (y32, m32, v32) = batch_norm_silu_train(&x32, g.as_tensor(), b.as_tensor(), EPS).unwrap();
        assert_eq!((y.dtype(), m.dtype(), v.dtype()), (half, DType::F32, DType::F32));
        assert_eq!(values(&y), values(&y32.to_dtype(half).unwrap()));
        assert_eq!((values(&m), values(&v)), (values(&m32), values(&v32)));
        let gr = grads(&[&xh, &g, &b], |t| {
            batch_norm_silu_train(t[0], t[1], t[2], EPS)?.0.to_dtype(DType::F32)?.mul(&w)?.sum_all()
        });
        assert_eq!((gr[0].dtype(), gr[1].dtype(), gr[2].dtype()), (half, DType::F32, DType::F32));
        let x32v = Var::from_tensor(&x32).unwrap();
        let r = grads(&[&x32v, &g, &b], |t| batch_norm_silu_train(t[0], t[1], t[2], EPS)?.0.mul(&w)?.sum_all());
        let tol = if half == DType::F16 { 1e-3 } else { 1e-2 };
        for (name, a, r) in [("dx", &gr[0], &r[0]), ("dgamma", &gr[1], &r[1]), ("dbeta", &gr[2], &r[2])] {
            let e = rel_err(a, r);
            assert!(e < tol, "{half:?} {name}: rel err {e:e}");
        }
    }
    // Half parameters with f32 activations stay an error.
    let gh = g.as_tensor().to_dtype(DType::F16).unwrap();
    let e = batch_norm_silu_train(&x, &gh, b.as_tensor(), EPS).unwrap_err().to_string();
    assert!(e.contains("gamma"), "{e}");
}
