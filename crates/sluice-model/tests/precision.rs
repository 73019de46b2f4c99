//! The whole train-mode model in f32 against the same model in f64: outputs and the gradient of every parameter.
//! The f64 kernels are checked op by op against candle's stock ops and central differences; this reaches what those
//! checks cannot: the f32-only code (the vectorised kernels, BatchNorm's f32 block sums, `exp`), the layouts the
//! model really feeds each op, and, through the poisoning allocator, any output element a kernel forgets to write
//! (it reads as NaN instead of a fresh page's zero).
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

#[path = "../../sluice-kernels/tests/poison/mod.rs"]
mod poison;

use candle_core::{DType, Device, Tensor};
use sluice_model::{Mode, Scale, Yolo, YoloConfig};

/// Deterministic values in [0, 1).
fn uniform(shape: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed;
    let v: Vec<f64> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// `||a − b|| / ||b||` in f64; infinite if `a` holds a NaN or an infinity.
fn rel_norm(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a: Vec<f64> = a.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap();
    let b: Vec<f64> = b.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap();
    if a.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let d: f64 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>().sqrt();
    d / b.iter().map(|y| y * y).sum::<f64>().sqrt().max(1e-300)
}

fn check(shape: [usize; 4]) {
    assert!(poison::active());
    let dev = Device::Cpu;
    let cfg = YoloConfig::new(Scale::N, 6);
    let m64 = Yolo::new_seeded(cfg, DType::F64, &dev, 7).unwrap();
    let m32 = Yolo::new_seeded(cfg, DType::F32, &dev, 7).unwrap();
    for (name, v) in m32.trainable_vars() {
        v.set(&m64.var(&name).unwrap().as_tensor().to_dtype(DType::F32).unwrap()).unwrap();
    }
    let x64 = uniform(&shape, 11, DType::F64);
    let run = |m: &Yolo, dtype: DType| {
        let (raw, _) = m.forward_raw(&x64.to_dtype(dtype).unwrap(), Mode::Train).unwrap();
        let wb = uniform(raw.boxes.dims(), 3, dtype).affine(2.0, -1.0).unwrap();
        let ws = uniform(raw.scores.dims(), 5, dtype).affine(2.0, -1.0).unwrap();
        let loss =
            (raw.boxes.mul(&wb).unwrap().sum_all().unwrap() + raw.scores.mul(&ws).unwrap().sum_all().unwrap()).unwrap();
        let grads = loss.backward().unwrap();
        let g: Vec<(String, Tensor)> =
            m.trainable_vars().into_iter().map(|(n, v)| (n, grads.get(v.as_tensor()).unwrap().clone())).collect();
        (raw, g)
    };
    let (r32, g32) = run(&m32, DType::F32);
    let (r64, g64) = run(&m64, DType::F64);
    let eb = rel_norm(&r32.boxes, &r64.boxes);
    let es = rel_norm(&r32.scores, &r64.scores);
    println!("{shape:?} outputs: boxes {eb:e}, scores {es:e}");
    assert!(eb < 1e-5 && es < 1e-5, "outputs: boxes {eb:e}, scores {es:e}");
    let mut errs: Vec<(f64, String)> =
        g32.iter().zip(&g64).map(|((n, a), (_, b))| (rel_norm(a, b), n.clone())).collect();
    errs.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (e, n) in errs.iter().take(8) {
        println!("{n}: {e:e}");
    }
    assert!(errs[0].0 < 1e-4, "{shape:?}: worst gradient {}: {:e}", errs[0].1, errs[0].0);
}

#[test]
fn f32_train_step_matches_f64_odd_batch_non_square() {
    // Batch 3 at 160×96: every stride's feature map at least 3×5.
    check([3, 3, 160, 96]);
}

#[test]
fn f32_train_step_matches_f64_at_the_quick_runs_shape() {
    // `cargo xtask train`'s batch and size: the kernels' parallel plans and size thresholds of a real step.
    check([16, 3, 192, 192]);
}
