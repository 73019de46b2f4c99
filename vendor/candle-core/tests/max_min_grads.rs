//! Sluice patch: the backward of `maximum` and `minimum` sends the gradient to the operand the result equals,
//! halved where both do, by `where` selections on the comparison masks. Each case's gradients against the ones
//! written out by hand, with ties, both operands tracked or one, and a non-finite gradient where an operand is not
//! selected (PyTorch's rule: 0 there); with `--features ledger`, the ops the backward runs.

use candle_core::{DType, Device, Result, Tensor, Var};

fn vec(t: &Tensor) -> Result<Vec<f32>> {
    t.to_dtype(DType::F32)?.to_vec1()
}

#[test]
fn the_gradient_goes_to_the_selected_operand_and_halves_on_ties() -> Result<()> {
    let dev = Device::Cpu;
    let a = Var::new(&[1.0f32, 5.0, -2.0, 3.0, 0.0], &dev)?;
    let b = Var::new(&[4.0f32, 5.0, -3.0, 3.0, -1.0], &dev)?;
    // Distinct upstream gradients, one negative, so a misplaced or unhalved one shows.
    let w = Tensor::new(&[2.0f32, 6.0, -4.0, 8.0, 10.0], &dev)?;
    // (op, want d/da, want d/db)
    let cases: [(&str, fn(&Tensor, &Tensor) -> Result<Tensor>, [f32; 5], [f32; 5]); 2] = [
        ("maximum", |a, b| a.maximum(b), [0.0, 3.0, -4.0, 4.0, 10.0], [2.0, 3.0, 0.0, 4.0, 0.0]),
        ("minimum", |a, b| a.minimum(b), [2.0, 3.0, 0.0, 4.0, 0.0], [0.0, 3.0, -4.0, 4.0, 10.0]),
    ];
    for (name, op, want_a, want_b) in cases {
        let g = (op(a.as_tensor(), b.as_tensor())? * &w)?.sum_all()?.backward()?;
        assert_eq!(vec(g.get(a.as_tensor()).expect("d/da"))?, want_a, "{name}: d/da");
        assert_eq!(vec(g.get(b.as_tensor()).expect("d/db"))?, want_b, "{name}: d/db");
        // One operand tracked: the same gradient for it.
        let c = b.as_tensor().detach();
        let g = (op(a.as_tensor(), &c)? * &w)?.sum_all()?.backward()?;
        assert_eq!(vec(g.get(a.as_tensor()).expect("d/da"))?, want_a, "{name}: d/da, b constant");
    }
    // An infinite upstream gradient reaches only the selected operand.
    let w = Tensor::new(&[f32::INFINITY, 1.0, 1.0, 1.0, 1.0], &dev)?;
    let g = (a.as_tensor().maximum(b.as_tensor())? * &w)?.sum_all()?.backward()?;
    assert_eq!(vec(g.get(a.as_tensor()).expect("d/da"))?[0], 0.0, "a is not selected where b is larger");
    assert_eq!(vec(g.get(b.as_tensor()).expect("d/db"))?[0], f32::INFINITY);
    #[cfg(feature = "ledger")]
    ops_of_the_backward()?;
    Ok(())
}

/// The op ledger is process-wide, so this runs inside the one test of this file: with one operand tracked, two
/// comparisons, the halving and two selections; no conversion, multiplication or division.
#[cfg(feature = "ledger")]
fn ops_of_the_backward() -> Result<()> {
    let dev = Device::Cpu;
    let a = Var::new(&[1.0f32, 5.0, -2.0], &dev)?;
    let b = Tensor::new(&[4.0f32, 5.0, -3.0], &dev)?;
    let y = a.as_tensor().maximum(&b)?;
    let grad = Tensor::new(&[1.0f32, 2.0, 3.0], &dev)?;
    let loss = (y * &grad)?.sum_all()?;
    candle_core::ledger::start("test");
    let grads = loss.backward();
    let records = candle_core::ledger::stop();
    grads?;
    let count = |op: &str| records.iter().filter(|r| r.op == op).count();
    assert_eq!((count("cmp:eq"), count("where_cond"), count("affine")), (2, 2, 1), "{records:?}");
    assert_eq!((count("binary:div"), count("to_dtype:f32")), (0, 0), "{records:?}");
    Ok(())
}
