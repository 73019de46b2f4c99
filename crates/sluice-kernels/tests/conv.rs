//! `sluice_kernels::conv::conv2d` against candle's stock conv2d and its autograd (forward, input gradient, weight
//! gradient) on random shapes, against f64 central differences, and inside a larger autograd graph.
#![allow(clippy::unwrap_used, clippy::needless_range_loop, clippy::type_complexity)]

mod poison;

use candle_core::{DType, Device, Result, Tensor, Var};
use sluice_kernels::conv::{conv2d, conv2d_bias, conv2d_bias_silu, peak_workspace_bytes};

/// Deterministic pseudo-random values in [-1, 1) (a 64-bit LCG; the tests need reproducible inputs, not quality).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

fn tensor(dims: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(values(n, seed), dims, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// `max |a − b| / max |b|` over all elements.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    let a = a.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let b = b.to_dtype(DType::F64).unwrap().flatten_all().unwrap().to_vec1::<f64>().unwrap();
    if a.iter().chain(&b).any(|v| !v.is_finite()) {
        return f64::INFINITY; // `f64::max` would skip a NaN (an element a kernel did not write).
    }
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max).max(1e-30);
    diff / scale
}

/// Output, input gradient and weight gradient of `sum(conv(x, w) · r)` for a given conv implementation.
fn run(
    conv: impl Fn(&Tensor, &Tensor) -> Result<Tensor>,
    x: &Tensor,
    w: &Tensor,
    seed: u64,
) -> (Tensor, Tensor, Tensor) {
    let xv = Var::from_tensor(x).unwrap();
    let wv = Var::from_tensor(w).unwrap();
    let y = conv(xv.as_tensor(), wv.as_tensor()).unwrap();
    let r = tensor(y.dims(), seed, y.dtype());
    let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
    (y, grads.get(xv.as_tensor()).unwrap().clone(), grads.get(wv.as_tensor()).unwrap().clone())
}

/// (n, c, h, w, o, k, stride, pad)
const SHAPES: &[(usize, usize, usize, usize, usize, usize, usize, usize)] = &[
    (1, 3, 7, 9, 4, 3, 1, 1),
    (3, 3, 7, 9, 4, 3, 2, 1),
    (3, 5, 11, 6, 3, 3, 1, 0),
    (1, 4, 9, 9, 6, 3, 2, 0),
    (3, 8, 5, 7, 5, 1, 1, 0),
    (1, 6, 6, 6, 7, 1, 1, 0),
    (3, 4, 9, 8, 3, 1, 2, 0),
    (3, 2, 6, 5, 3, 1, 1, 1),
    (2, 3, 13, 13, 4, 5, 2, 2),
    // Stride-1 "same" convs (one shifted copy per im2col row), down to a map smaller than the padding.
    (2, 3, 6, 7, 4, 5, 1, 2),
    (1, 2, 2, 3, 3, 5, 1, 2),
    (2, 2, 1, 1, 3, 3, 1, 1),
    // Enough images and a small map for the stacked-images path (several images per gemm, groups in parallel).
    (9, 6, 5, 5, 4, 3, 1, 1),
    (9, 6, 4, 4, 5, 1, 1, 0),
    // Past the kernels' size thresholds, as in a real step: one image per gemm group (≥ 2048 output columns), batch 1
    // split over channels, a weight gradient large enough for the parallel transpose (≥ 16 Ki elements), and a
    // stride-2 down conv.
    (3, 16, 48, 48, 24, 3, 1, 1),
    (1, 8, 64, 64, 16, 3, 1, 1),
    (2, 128, 20, 20, 160, 1, 1, 0),
    (2, 32, 40, 40, 48, 3, 2, 1),
    (16, 16, 24, 24, 16, 3, 1, 1),
    // 3×3 stride-2 padding-1 down convs (the three kernel columns in one pass): even and odd sides, down to 1 and 2.
    (2, 3, 8, 6, 4, 3, 2, 1),
    (1, 2, 5, 4, 3, 3, 2, 1),
    (2, 2, 1, 2, 3, 3, 2, 1),
    (1, 3, 2, 1, 2, 3, 2, 1),
];

fn check_against_stock(dtype: DType, tol: f64) {
    for (i, &(n, c, h, w, o, k, s, p)) in SHAPES.iter().enumerate() {
        let seed = 100 * i as u64;
        let x = tensor(&[n, c, h, w], seed, dtype);
        let wt = tensor(&[o, c, k, k], seed + 1, dtype);
        let ours = run(|x, w| conv2d(x, w, s, p), &x, &wt, seed + 2);
        let stock_ok = (h + 2 * p - k) % s == 0 && (w + 2 * p - k) % s == 0;
        let stock = if stock_ok {
            run(|x, w| x.conv2d(w, p, s, 1, 1), &x, &wt, seed + 2)
        } else {
            let y = x.conv2d(&wt, p, s, 1, 1).unwrap();
            (y, ours.1.clone(), ours.2.clone())
        };
        let shape = format!("{dtype:?} x {n}×{c}×{h}×{w}, w {o}×{c}×{k}×{k}, stride {s}, pad {p}");
        assert!(rel_err(&ours.0, &stock.0) < tol, "forward {shape}: {}", rel_err(&ours.0, &stock.0));
        // Candle's stock backward returns a wrongly sized input gradient when the stride does not divide the
        // padded extent (no output padding in its conv_transpose2d); those shapes are covered by the forward check
        // here and by the central-difference test.
        if (h + 2 * p - k) % s != 0 || (w + 2 * p - k) % s != 0 {
            continue;
        }
        assert!(rel_err(&ours.1, &stock.1) < tol, "grad x {shape}: {}", rel_err(&ours.1, &stock.1));
        assert!(rel_err(&ours.2, &stock.2) < tol, "grad w {shape}: {}", rel_err(&ours.2, &stock.2));
    }
}

#[test]
fn the_poisoning_allocator_is_in_use() {
    assert!(poison::active());
}

#[test]
fn f64_matches_stock_conv2d_and_its_gradients() {
    check_against_stock(DType::F64, 1e-12);
}

#[test]
fn f32_matches_stock_conv2d_and_its_gradients() {
    check_against_stock(DType::F32, 1e-4);
}

/// f16 and bf16 (the CPU twin of cuDNN's half path, under mixed precision): the f32 kernels between conversions, so
/// the output and both gradients are the f64 convolution of the same half values, rounded once (within the dtype's
/// precision; the gradients also carry the rounding of the half output gradient).
#[test]
fn half_dtypes_match_the_f64_conv_of_the_same_values() {
    for (dtype, tol) in [(DType::F16, 4e-3), (DType::BF16, 3e-2)] {
        for (i, &(n, c, h, w, o, k, s, p)) in SHAPES.iter().enumerate() {
            if (h + 2 * p - k) % s != 0 || (w + 2 * p - k) % s != 0 {
                continue; // candle's stock backward, the reference, mis-sizes dx there (see above)
            }
            let seed = 100 * i as u64;
            let x = tensor(&[n, c, h, w], seed, dtype);
            let wt = tensor(&[o, c, k, k], seed + 1, dtype);
            let ours = run(|x, w| conv2d(x, w, s, p), &x, &wt, seed + 2);
            let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
            let reference = run(|x, w| x.conv2d(w, p, s, 1, 1), &f64_of(&x), &f64_of(&wt), seed + 2);
            let shape = format!("{dtype:?} x {n}×{c}×{h}×{w}, w {o}×{c}×{k}×{k}, stride {s}, pad {p}");
            for (what, a, r) in
                [("y", &ours.0, &reference.0), ("dx", &ours.1, &reference.1), ("dw", &ours.2, &reference.2)]
            {
                assert_eq!(a.dtype(), dtype, "{what} {shape}");
                let e = rel_err(a, r);
                assert!(e < tol, "{what} {shape}: rel err {e:e}");
            }
        }
    }
}

#[test]
fn gradients_match_f64_central_differences() {
    // Odd and even sides of the 3×3 stride-2 down conv (whose even sides candle's stock backward cannot check).
    for (h, w) in [(5, 4), (4, 5), (6, 6), (1, 2)] {
        central_differences(h, w, 3, 2, 1);
    }
    // Stride-1 "same" convs, whose input gradient runs as a conv of dy with the rotated, transposed kernel: 3×3
    // and 5×5, a map narrower than the kernel.
    for (h, w, k) in [(5, 4, 3), (3, 7, 3), (4, 3, 5), (1, 2, 3)] {
        central_differences(h, w, k, 1, k / 2);
    }
}

fn central_differences(h: usize, wd: usize, k: usize, s: usize, p: usize) {
    let x = tensor(&[2, 2, h, wd], 7, DType::F64);
    let w = tensor(&[3, 2, k, k], 8, DType::F64);
    let (y, dx, dw) = run(|x, w| conv2d(x, w, s, p), &x, &w, 9);
    let r = tensor(y.dims(), 9, DType::F64);
    let loss = |x: &Tensor, w: &Tensor| -> f64 {
        (conv2d(x, w, s, p).unwrap() * &r).unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap()
    };
    let eps = 1e-6;
    let bump = |t: &Tensor, i: usize, d: f64| -> Tensor {
        let mut v = t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        v[i] += d;
        Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
    };
    let dx = dx.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    for i in 0..x.elem_count() {
        let num = (loss(&bump(&x, i, eps), &w) - loss(&bump(&x, i, -eps), &w)) / (2.0 * eps);
        assert!((num - dx[i]).abs() < 1e-7, "{h}×{wd} dx[{i}]: numeric {num} vs {}", dx[i]);
    }
    let dw = dw.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    for i in 0..w.elem_count() {
        let num = (loss(&x, &bump(&w, i, eps)) - loss(&x, &bump(&w, i, -eps))) / (2.0 * eps);
        assert!((num - dw[i]).abs() < 1e-7, "{h}×{wd} dw[{i}]: numeric {num} vs {}", dw[i]);
    }
}

/// Output and the gradients of x, w and b of `sum(f(x, w, b) · r)`.
fn run_bias(
    f: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>,
    (x, w, b): (&Tensor, &Tensor, &Tensor),
    seed: u64,
) -> [Tensor; 4] {
    let vars = [x, w, b].map(|t| Var::from_tensor(t).unwrap());
    let y = f(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor()).unwrap();
    let r = tensor(y.dims(), seed, y.dtype());
    let grads = (&y * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let g = |v: &Var| grads.get(v.as_tensor()).unwrap().clone();
    [y, g(&vars[0]), g(&vars[1]), g(&vars[2])]
}

#[test]
fn bias_silu_conv_matches_silu_of_the_bias_conv_and_refuses_backward() {
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        for (i, &(n, c, h, w, o, k, s, p)) in SHAPES.iter().enumerate() {
            let seed = 500 + 10 * i as u64;
            let x = tensor(&[n, c, h, w], seed, dtype);
            let wt = tensor(&[o, c, k, k], seed + 1, dtype);
            let b = tensor(&[o], seed + 2, dtype);
            let fused = conv2d_bias_silu(&x, &wt, &b, s, p).unwrap();
            let composed = conv2d(&x, &wt, s, p).unwrap().broadcast_add(&b.reshape((1, o, 1, 1)).unwrap()).unwrap();
            let err = rel_err(&fused, &composed.silu().unwrap());
            assert!(err < tol, "{dtype:?} x {n}×{c}×{h}×{w} w {o}×{c}×{k}×{k} s{s} p{p}: {err}");
        }
    }
    // Inference only: a backward through it is a clear error, not a silently missing gradient.
    let w = Var::from_tensor(&tensor(&[4, 3, 3, 3], 1, DType::F32)).unwrap();
    let y = conv2d_bias_silu(&tensor(&[1, 3, 6, 6], 2, DType::F32), w.as_tensor(), &tensor(&[4], 3, DType::F32), 1, 1);
    let err = y.unwrap().sum_all().unwrap().backward().unwrap_err().to_string();
    assert!(err.contains("no backward"), "{err}");
}

#[test]
fn bias_conv_matches_conv_plus_broadcast_bias_with_gradients() {
    for dtype in [DType::F64, DType::F32] {
        let tol = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
        for (i, &(n, c, h, w, o, k, s, p)) in SHAPES.iter().enumerate() {
            let seed = 300 + 10 * i as u64;
            let x = tensor(&[n, c, h, w], seed, dtype);
            let wt = tensor(&[o, c, k, k], seed + 1, dtype);
            let b = tensor(&[o], seed + 2, dtype);
            let fused = run_bias(|x, w, b| conv2d_bias(x, w, b, s, p), (&x, &wt, &b), seed + 3);
            let composed = run_bias(
                |x, w, b| conv2d(x, w, s, p)?.broadcast_add(&b.reshape((1, o, 1, 1))?),
                (&x, &wt, &b),
                seed + 3,
            );
            for (what, a, e) in ["y", "dx", "dw", "db"].iter().zip(&fused).zip(&composed).map(|((w, a), e)| (w, a, e)) {
                let err = rel_err(a, e);
                assert!(err < tol, "{dtype:?} {what} x {n}×{c}×{h}×{w} w {o}×{c}×{k}×{k} s{s} p{p}: {err}");
            }
        }
    }
}

#[test]
fn bias_gradient_matches_central_differences_and_bad_bias_is_refused() {
    let x = tensor(&[2, 3, 5, 5], 41, DType::F64);
    let w = tensor(&[4, 3, 1, 1], 42, DType::F64);
    let b = tensor(&[4], 43, DType::F64);
    let [y, _, _, db] = run_bias(|x, w, b| conv2d_bias(x, w, b, 1, 0), (&x, &w, &b), 44);
    let r = tensor(y.dims(), 44, DType::F64);
    let loss = |b: &Tensor| -> f64 {
        (conv2d_bias(&x, &w, b, 1, 0).unwrap() * &r).unwrap().sum_all().unwrap().to_scalar::<f64>().unwrap()
    };
    let db = db.to_vec1::<f64>().unwrap();
    let bv = b.to_vec1::<f64>().unwrap();
    for i in 0..4 {
        let bump = |d: f64| {
            let mut v = bv.clone();
            v[i] += d;
            Tensor::new(v, &Device::Cpu).unwrap()
        };
        let num = (loss(&bump(1e-6)) - loss(&bump(-1e-6))) / 2e-6;
        assert!((num - db[i]).abs() < 1e-7, "db[{i}]: numeric {num} vs {}", db[i]);
    }
    let err = conv2d_bias(&x, &w, &tensor(&[3], 1, DType::F64), 1, 0).unwrap_err().to_string();
    assert!(err.contains("bias has shape"), "{err}");
}

#[test]
fn composes_in_an_autograd_graph_with_vars() {
    // conv 3×3 s2 → silu → conv 1×1 → add a bias → mean of squares, gradients for every Var, ours vs stock.
    let x = Var::from_tensor(&tensor(&[3, 3, 11, 9], 11, DType::F64)).unwrap();
    let w1 = Var::from_tensor(&tensor(&[5, 3, 3, 3], 12, DType::F64)).unwrap();
    let w2 = Var::from_tensor(&tensor(&[4, 5, 1, 1], 13, DType::F64)).unwrap();
    let b = Var::from_tensor(&tensor(&[1, 4, 1, 1], 14, DType::F64)).unwrap();
    let graph = |c1: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>, c2: &dyn Fn(&Tensor, &Tensor) -> Result<Tensor>| {
        let h = c1(x.as_tensor(), w1.as_tensor()).unwrap().silu().unwrap();
        let y = c2(&h, w2.as_tensor()).unwrap().broadcast_add(b.as_tensor()).unwrap();
        let loss = y.sqr().unwrap().mean_all().unwrap();
        let g = loss.backward().unwrap();
        let grads: Vec<Tensor> = [&x, &w1, &w2, &b].iter().map(|v| g.get(v.as_tensor()).unwrap().clone()).collect();
        (loss, grads)
    };
    let (l1, ours) = graph(&|x, w| conv2d(x, w, 2, 1), &|x, w| conv2d(x, w, 1, 0));
    let (l2, stock) = graph(&|x, w| x.conv2d(w, 1, 2, 1, 1), &|x, w| x.conv2d(w, 0, 1, 1, 1));
    assert!(rel_err(&l1, &l2) < 1e-12);
    for (a, b) in ours.iter().zip(&stock) {
        assert!(rel_err(a, b) < 1e-12, "{}", rel_err(a, b));
    }
    assert!(peak_workspace_bytes() > 0, "the 3×3 conv went through the im2col workspace");
}

#[test]
fn an_untracked_input_gets_no_gradient_and_the_weights_still_match() {
    // The network's input is a plain tensor: its gradient is never computed, the weight's equals stock's.
    let x = tensor(&[2, 3, 9, 7], 31, DType::F64);
    let w = Var::from_tensor(&tensor(&[4, 3, 3, 3], 32, DType::F64)).unwrap();
    let grads = |y: Tensor| y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    let ours = grads(conv2d(&x, w.as_tensor(), 2, 1).unwrap());
    let stock = grads(x.conv2d(w.as_tensor(), 1, 2, 1, 1).unwrap());
    assert!(ours.get(&x).is_none());
    assert!(rel_err(ours.get(w.as_tensor()).unwrap(), stock.get(w.as_tensor()).unwrap()) < 1e-12);
}

#[test]
fn non_contiguous_input_still_matches() {
    // A transposed (strided) input is made contiguous first.
    let x = tensor(&[2, 3, 8, 7], 21, DType::F32).transpose(2, 3).unwrap();
    let w = tensor(&[4, 3, 3, 3], 22, DType::F32);
    assert!(rel_err(&conv2d(&x, &w, 1, 1).unwrap(), &x.conv2d(&w, 1, 1, 1, 1).unwrap()) < 1e-5);
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let x = tensor(&[1, 3, 8, 8], 1, DType::F32);
    let msg = |r: Result<Tensor>| r.unwrap_err().to_string();
    assert!(msg(conv2d(&x, &tensor(&[4, 2, 3, 3], 2, DType::F32), 1, 1)).contains("channels"));
    assert!(msg(conv2d(&x, &tensor(&[4, 3, 3, 1], 2, DType::F32), 1, 1)).contains("square"));
    assert!(msg(conv2d(&x, &tensor(&[4, 3, 11, 11], 2, DType::F32), 1, 1)).contains("does not fit"));
    assert!(msg(conv2d(&x, &tensor(&[4, 3, 3, 3], 2, DType::F32), 0, 1)).contains("does not fit"));
    assert!(msg(conv2d(&x.flatten_all().unwrap(), &tensor(&[4, 3, 3, 3], 2, DType::F32), 1, 1)).contains("n×c×h×w"));
}
