//! Sluice patch: the backward pass computes no gradient for an operand that tracks no op (a constant), and the
//! gradients of the tracked operands are those of the full computation.

use candle_core::{DType, Device, Result, Tensor, Var};

#[test]
fn constants_get_no_gradient_and_variables_the_same_one() -> Result<()> {
    let dev = Device::Cpu;
    let x = Var::new(&[1.0f32, -2.0, 3.0, 0.0], &dev)?;
    let c = Tensor::new(&[2.0f32, 2.0, -1.0, 0.0], &dev)?;
    let mask = Tensor::new(&[1u8, 0, 1, 0], &dev)?;
    // Every binary op with the constant on either side, and a `where` with a constant branch.
    let ops: [(&str, Box<dyn Fn(&Tensor) -> Result<Tensor>>, [f32; 4]); 9] = [
        ("x + c", Box::new(|x| x + &c), [1.0, 1.0, 1.0, 1.0]),
        ("c - x", Box::new(|x| &c - x), [-1.0, -1.0, -1.0, -1.0]),
        ("x * c", Box::new(|x| x * &c), [2.0, 2.0, -1.0, 0.0]),
        ("x / c", Box::new(|x| (x / &c.affine(1.0, 4.0)?)), [1.0 / 6.0, 1.0 / 6.0, 1.0 / 3.0, 0.25]),
        ("c / x", Box::new(|x| &c / &x.affine(1.0, 4.0)?), [-2.0 / 25.0, -2.0 / 4.0, 1.0 / 49.0, 0.0]),
        ("max(x, c)", Box::new(|x| x.maximum(&c)), [0.0, 0.0, 1.0, 0.5]),
        ("min(c, x)", Box::new(|x| c.minimum(x)), [1.0, 1.0, 0.0, 0.5]),
        ("where(m, x, c)", Box::new(|x| mask.where_cond(x, &c)), [1.0, 0.0, 1.0, 0.0]),
        ("where(m, c, x)", Box::new(|x| mask.where_cond(&c, x)), [0.0, 1.0, 0.0, 1.0]),
    ];
    for (name, op, want) in ops {
        let y = op(x.as_tensor())?;
        let grads = y.sum_all()?.backward()?;
        assert!(grads.get(&c).is_none(), "{name}: the constant got a gradient");
        let gx = grads.get(x.as_tensor()).expect("the variable's gradient").to_dtype(DType::F32)?.to_vec1::<f32>()?;
        for (g, w) in gx.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{name}: {gx:?} vs {want:?}");
        }
    }
    Ok(())
}
