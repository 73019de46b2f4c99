//! Gradient checks (central differences in f64) of the operations this crate builds around candle 0.11 defects,
//! and pins of the defects themselves, so a candle upgrade that fixes or changes them is noticed:
//!
//! * `max_pool2d`: no padding; backward bails out for kernel != stride and scales the gradient by 1/k² for
//!   kernel == stride. Ours: `ops::max_pool2d_same`.
//! * `upsample_nearest2d`: backward overwrites the input's accumulated gradient. Ours: `ops::upsample_nearest2x`.
//! * `candle_nn::ops::softmax_last_dim`: no backward. Ours: `ops::softmax`.
//! * `candle_nn::loss::binary_cross_entropy_with_logit`: overflows for large logits. Ours: `ops::bce_with_logits`.
//! * no `atan`. Ours: `ops::atan`.
//!
//! Plus an end-to-end check of the whole train-mode model graph (BatchNorm with batch statistics, SPPF, upsample
//! feeding concat) on a few parameters.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

use candle_core::{DType, Device, Tensor, Var};
use sluice_model::{Mode, Scale, Yolo, YoloConfig, ops};

const H: f64 = 1e-6;

/// Central-difference gradient of `f` at `x` (f64, every element).
fn numeric_grad(x: &Tensor, f: &dyn Fn(&Tensor) -> f64) -> Vec<f64> {
    let base: Vec<f64> = x.flatten_all().unwrap().to_vec1().unwrap();
    (0..base.len())
        .map(|i| {
            let mut p = base.clone();
            p[i] += H;
            let fp = f(&Tensor::from_vec(p.clone(), x.shape(), x.device()).unwrap());
            p[i] -= 2.0 * H;
            let fm = f(&Tensor::from_vec(p, x.shape(), x.device()).unwrap());
            (fp - fm) / (2.0 * H)
        })
        .collect()
}

/// Autograd gradient of `f` (a scalar tensor function) at `x`.
fn autograd(x: &Tensor, f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>) -> candle_core::Result<Vec<f64>> {
    let v = Var::from_tensor(x)?;
    let y = f(v.as_tensor())?;
    let g = y.backward()?;
    match g.get(v.as_tensor()) {
        Some(g) => g.flatten_all()?.to_vec1(),
        None => Ok(vec![0.0; x.elem_count()]),
    }
}

fn scalar(t: &Tensor) -> f64 {
    t.to_scalar::<f64>().unwrap()
}

/// `||a - b|| / ||b||`.
fn rel(a: &[f64], b: &[f64]) -> f64 {
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    let n: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    d / n.max(1e-300)
}

fn randn(shape: &[usize], seed_shift: f64) -> Tensor {
    // Distinct values (no ties) from a deterministic formula.
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i as f64 * 12.9898 + seed_shift).sin() * 43758.5453).fract()).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

#[test]
fn max_pool_same_gradient_is_right_and_candle_max_pool_is_pinned() {
    let x = randn(&[1, 2, 6, 7], 0.3);
    let w = randn(&[1, 2, 6, 7], 1.7);
    let f = |t: &Tensor| ops::max_pool2d_same(t, 5)?.mul(&w)?.sum_all();
    let g = autograd(&x, &f).unwrap();
    let n = numeric_grad(&x, &|t| scalar(&f(t).unwrap()));
    let e = rel(&g, &n);
    println!("max_pool2d_same k5: rel err {e:e}");
    assert!(e < 1e-6, "rel err {e}");
    // SPPF chains three pools (ties between repeated maxima): still right.
    let f3 = |t: &Tensor| {
        let a = ops::max_pool2d_same(t, 5)?;
        let b = ops::max_pool2d_same(&a, 5)?;
        Tensor::cat(&[&a, &b, &ops::max_pool2d_same(&b, 5)?], 1)?.mul(&Tensor::cat(&[&w, &w, &w], 1)?)?.sum_all()
    };
    let e = rel(&autograd(&x, &f3).unwrap(), &numeric_grad(&x, &|t| scalar(&f3(t).unwrap())));
    assert!(e < 1e-6, "chained pools rel err {e}");

    // Candle defect 1: no backward for kernel != stride.
    let native = |t: &Tensor| t.max_pool2d_with_stride(3, 1)?.sum_all();
    assert!(autograd(&x, &native).is_err(), "candle now differentiates max_pool2d with stride 1: revisit ops.rs");
    // Candle defect 2: for kernel == stride the gradient is scaled by 1/k^2.
    let x4 = randn(&[1, 1, 4, 4], 2.1);
    let f2 = |t: &Tensor| t.max_pool2d(2)?.sum_all();
    let g = autograd(&x4, &f2).unwrap();
    let n = numeric_grad(&x4, &|t| scalar(&f2(t).unwrap()));
    let scaled: Vec<f64> = n.iter().map(|v| v / 4.0).collect();
    assert!(rel(&g, &scaled) < 1e-9, "candle's max_pool2d gradient scale changed: {g:?} vs true {n:?}");
}

#[test]
fn upsample_gradient_accumulates_and_candle_upsample_is_pinned() {
    let x = randn(&[1, 2, 3, 4], 0.9);
    let w_up = randn(&[1, 2, 6, 8], 0.4);
    let w_cat = randn(&[1, 2, 3, 4], 2.6);
    // x feeds both an upsample and (directly) a product, as P5 feeds both the neck's upsample and a concat.
    let ours = |t: &Tensor| ops::upsample_nearest2x(t)?.mul(&w_up)?.sum_all()? + t.mul(&w_cat)?.sum_all()?;
    let n = numeric_grad(&x, &|t| scalar(&ours(t).unwrap()));
    let e = rel(&autograd(&x, &ours).unwrap(), &n);
    println!("upsample_nearest2x: rel err {e:e}");
    assert!(e < 1e-8, "rel err {e}");
    // Candle defect: the upsample's backward overwrites the other consumer's contribution.
    let native = |t: &Tensor| t.upsample_nearest2d(6, 8)?.mul(&w_up)?.sum_all()? + t.mul(&w_cat)?.sum_all()?;
    let e = rel(&autograd(&x, &native).unwrap(), &n);
    assert!(e > 1e-2, "candle's upsample_nearest2d gradient is now right (rel err {e:e}): revisit ops.rs");
}

#[test]
fn softmax_and_dfl_decode_have_gradients_and_candle_softmax_last_dim_is_pinned() {
    let x = randn(&[2, 64, 5], 1.1);
    let w = randn(&[2, 4, 5], 0.2);
    let f = |t: &Tensor| ops::dfl_decode(&(t * 3.0)?, 16)?.mul(&w)?.sum_all();
    let e = rel(&autograd(&x, &f).unwrap(), &numeric_grad(&x, &|t| scalar(&f(t).unwrap())));
    println!("dfl_decode (softmax): rel err {e:e}");
    assert!(e < 1e-7, "rel err {e}");
    let w2 = randn(&[2, 64, 5], 0.7);
    let g = |t: &Tensor| ops::log_softmax(t, 1)?.mul(&w2)?.sum_all();
    let e = rel(&autograd(&x, &g).unwrap(), &numeric_grad(&x, &|t| scalar(&g(t).unwrap())));
    assert!(e < 1e-7, "log_softmax rel err {e}");
    let w3 = w2.transpose(1, 2).unwrap().contiguous().unwrap();
    let native = |t: &Tensor| candle_nn::ops::softmax_last_dim(t)?.mul(&w3)?.sum_all();
    // Candle defect: softmax_last_dim has no backward (the input gets no gradient at all, or an error).
    let xt = x.transpose(1, 2).unwrap().contiguous().unwrap();
    let numeric = numeric_grad(&xt, &|t| scalar(&native(t).unwrap()));
    match autograd(&xt, &native) {
        Err(_) => {}
        Ok(g) => assert!(
            g.iter().all(|v| *v == 0.0) && numeric.iter().any(|v| v.abs() > 1e-3),
            "candle's softmax_last_dim now has a backward: revisit ops.rs"
        ),
    }
}

#[test]
fn bce_with_logits_is_stable_and_candle_bce_is_pinned() {
    let x = Tensor::new(&[-300f64, -30.0, -2.0, 0.0, 0.5, 7.0, 300.0], &Device::Cpu).unwrap();
    let z = Tensor::new(&[0.0f64, 1.0, 0.3, 1.0, 0.0, 0.9, 0.0], &Device::Cpu).unwrap();
    let f = |t: &Tensor| ops::bce_with_logits(t, &z)?.sum_all();
    let g = autograd(&x, &f).unwrap();
    let n = numeric_grad(&x, &|t| scalar(&f(t).unwrap()));
    let e = rel(&g, &n);
    assert!(e < 1e-6, "rel err {e}: {g:?} vs {n:?}");
    assert!(scalar(&f(&x).unwrap()).is_finite());
    // Candle defect: log(sigmoid) overflows for large logits.
    let native = candle_nn::loss::binary_cross_entropy_with_logit(&x, &z).unwrap();
    assert!(!scalar(&native).is_finite(), "candle's BCE is now finite for |x| = 300: revisit ops.rs");
}

#[test]
fn atan_gradient_is_right() {
    let x = Tensor::new(&[-50.0f64, -2.5, -1.0, -0.3, 0.0, 0.2, 0.41, 0.42, 1.0, 2.4, 2.5, 10.0, 1e3], &Device::Cpu)
        .unwrap();
    let f = |t: &Tensor| ops::atan(t)?.sum_all();
    let g = autograd(&x, &f).unwrap();
    let want: Vec<f64> = x.to_vec1::<f64>().unwrap().iter().map(|v| 1.0 / (1.0 + v * v)).collect();
    let e = rel(&g, &want);
    println!("atan: rel err {e:e}");
    assert!(e < 1e-6, "rel err {e}: {g:?}");
}

#[test]
fn train_mode_model_gradients_match_central_differences() {
    // yolov8n, nc 3, a 2x3x64x64 f64 input, train mode (BatchNorm on batch statistics); a fixed random
    // projection of the raw outputs as the scalar.
    let dev = Device::Cpu;
    let model = Yolo::new_seeded(YoloConfig::new(Scale::N, 3), DType::F64, &dev, 0).unwrap();
    let x = randn(&[2, 3, 64, 64], 0.5);
    let (raw, _) = model.forward_raw(&x, Mode::Train).unwrap();
    let wb = randn(raw.boxes.dims(), 3.3);
    let ws = randn(raw.scores.dims(), 4.4);
    let objective = || -> f64 {
        let (raw, _) = model.forward_raw(&x, Mode::Train).unwrap();
        scalar(
            &(raw.boxes.mul(&wb).unwrap().sum_all().unwrap() + raw.scores.mul(&ws).unwrap().sum_all().unwrap())
                .unwrap(),
        )
    };
    let (raw, _) = model.forward_raw(&x, Mode::Train).unwrap();
    let loss =
        (raw.boxes.mul(&wb).unwrap().sum_all().unwrap() + raw.scores.mul(&ws).unwrap().sum_all().unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    // Parameters upstream of SPPF, of the upsample+concat paths, and in the head.
    for (name, idx) in [
        ("model.0.conv.weight", 5usize),
        ("model.0.bn.weight", 3),
        ("model.6.m.0.cv1.conv.weight", 17),
        ("model.8.cv2.bn.bias", 2),
        ("model.9.cv1.conv.weight", 40),
        ("model.12.cv1.conv.weight", 11),
        ("model.22.cv2.2.0.conv.weight", 7),
    ] {
        let var = model.var(name).unwrap();
        let g: Vec<f64> = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let mut p = base.clone();
        let h = 1e-5;
        p[idx] += h;
        var.set(&Tensor::from_vec(p.clone(), var.shape(), &dev).unwrap()).unwrap();
        let fp = objective();
        p[idx] -= 2.0 * h;
        var.set(&Tensor::from_vec(p, var.shape(), &dev).unwrap()).unwrap();
        let fm = objective();
        var.set(&Tensor::from_vec(base, var.shape(), &dev).unwrap()).unwrap();
        let num = (fp - fm) / (2.0 * h);
        let err = (g[idx] - num).abs() / num.abs().max(1e-6);
        println!("{name}[{idx}]: autograd {:.9e} numeric {num:.9e} rel {err:.1e}", g[idx]);
        assert!(err < 1e-4, "{name}[{idx}]: autograd {} vs numeric {num}", g[idx]);
    }
}
