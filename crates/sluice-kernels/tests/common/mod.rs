//! Shared helpers for the kernel tests: deterministic random tensors, gradients, error measures and central
//! differences.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor, Var};

/// SplitMix64: a deterministic stream of values so failures reproduce.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u = self.uniform().max(1e-300);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// A tensor of `mean + std·N(0, 1)` values.
    pub(crate) fn tensor(&mut self, shape: &[usize], mean: f64, std: f64, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| mean + std * self.normal()).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
    }

    /// A tensor of small integers in `[0, k)` (many ties).
    pub(crate) fn ints(&mut self, shape: &[usize], k: u64, dtype: DType) -> Tensor {
        let n: usize = shape.iter().product();
        let v: Vec<f64> = (0..n).map(|_| (self.next_u64() % k) as f64).collect();
        Tensor::from_vec(v, shape, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
    }
}

/// All values of a tensor as f64.
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap()
}

/// `max |a − b| / max(max |b|, floor)`: the error relative to the reference's scale.
pub(crate) fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.dims(), b.dims());
    rel_err_vec(&values(a), &values(b))
}

/// Gradients of `f(vars)` (a scalar) with respect to each var.
pub(crate) fn grads(vars: &[&Var], f: impl Fn(&[&Tensor]) -> candle_core::Result<Tensor>) -> Vec<Tensor> {
    let ts: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
    let loss = f(&ts).unwrap();
    let g = loss.backward().unwrap();
    vars.iter().map(|v| g.get(v.as_tensor()).expect("no gradient").clone()).collect()
}

/// Central differences of the f64 scalar `f` with respect to every element of `inputs[which]`.
pub(crate) fn numeric_grad(inputs: &[Tensor], which: usize, h: f64, f: impl Fn(&[Tensor]) -> f64) -> Vec<f64> {
    let base = values(&inputs[which]);
    let shape = inputs[which].dims().to_vec();
    (0..base.len())
        .map(|i| {
            let eval = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let mut ins = inputs.to_vec();
                ins[which] = Tensor::from_vec(v, shape.as_slice(), &Device::Cpu).unwrap();
                f(&ins)
            };
            (eval(h) - eval(-h)) / (2.0 * h)
        })
        .collect()
}

/// `max |a − b| / max |b|` for plain vectors; infinite when either side holds a NaN or an infinity (`f64::max`
/// alone would skip a NaN, so an unwritten output element would pass).
pub(crate) fn rel_err_vec(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    if a.iter().chain(b).any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}
