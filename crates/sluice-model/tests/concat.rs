//! The channel concat and split the model's C2f / SPPF / neck use (`Tensor::cat` on dim 1, `narrow` +
//! `contiguous`) on tensors large enough for the patched candle-core's parallel copies (vendor/README.md), checked
//! element by element against index arithmetic, forward and backward.
#![allow(clippy::unwrap_used)]

use candle_core::{DType, Device, Tensor, Var};

fn ramp(dims: (usize, usize, usize, usize), base: f32) -> Tensor {
    let n = dims.0 * dims.1 * dims.2 * dims.3;
    Tensor::arange(0u32, n as u32, &Device::Cpu)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .affine(1.0, f64::from(base))
        .unwrap()
        .reshape(dims)
        .unwrap()
}

#[test]
fn large_channel_cat_and_split_are_exact() {
    let (n, h, w) = (3, 40, 41);
    let chans = [24usize, 40, 8];
    let parts: Vec<Tensor> = chans.iter().enumerate().map(|(i, &c)| ramp((n, c, h, w), 1e6 * i as f32)).collect();
    let cat = Tensor::cat(&parts, 1).unwrap();
    let total: usize = chans.iter().sum();
    assert_eq!(cat.dims(), [n, total, h, w]);
    let got = cat.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let plane = h * w;
    for b in 0..n {
        let mut c0 = 0;
        for (i, &c) in chans.iter().enumerate() {
            for ch in 0..c {
                for p in 0..plane {
                    let want = 1e6 * i as f32 + ((b * c + ch) * plane + p) as f32;
                    assert_eq!(
                        got[(b * total + c0 + ch) * plane + p],
                        want,
                        "image {b}, part {i}, channel {ch}, pixel {p}"
                    );
                }
            }
            c0 += c;
        }
    }
    // The split back (a strided view made contiguous) returns each part exactly.
    let mut c0 = 0;
    for (part, &c) in parts.iter().zip(&chans) {
        let back = cat.narrow(1, c0, c).unwrap().contiguous().unwrap();
        assert_eq!(
            back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            part.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        c0 += c;
    }
}

#[test]
fn cat_gradient_reaches_each_part_unchanged() {
    let (n, h, w) = (2, 48, 48);
    let a = Var::from_tensor(&ramp((n, 16, h, w), 0.0)).unwrap();
    let b = Var::from_tensor(&ramp((n, 32, h, w), 5.0)).unwrap();
    let cat = Tensor::cat(&[a.as_tensor(), b.as_tensor()], 1).unwrap();
    let r = ramp((n, 48, h, w), 0.5).affine(1e-3, 0.0).unwrap();
    let grads = (&cat * &r).unwrap().sum_all().unwrap().backward().unwrap();
    let ga = grads.get(a.as_tensor()).unwrap();
    let gb = grads.get(b.as_tensor()).unwrap();
    let want_a = r.narrow(1, 0, 16).unwrap().contiguous().unwrap();
    let want_b = r.narrow(1, 16, 32).unwrap().contiguous().unwrap();
    let v = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(v(ga), v(&want_a));
    assert_eq!(v(gb), v(&want_b));
    // And the expected values follow from the index arithmetic, not only from another copy.
    let ra = v(&r);
    let plane = h * w;
    assert_eq!(v(ga)[plane * 16 + 7], ra[plane * 48 + 7], "image 1, channel 0");
}
