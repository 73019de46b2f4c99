//! Sluice patch: the gradient of a tensor that is read only through `narrow`s is assembled from the pieces in one
//! concatenation (zeros only where no piece lies). Each case's gradient against the one written out by hand:
//! split halves, pieces with a gap, overlapping pieces and pieces along two dimensions (both summed as upstream),
//! a variable narrowed directly, and a tensor also read whole (upstream's rule).

use candle_core::{DType, Device, Result, Tensor, Var};

/// `x` (3×6, values 1..18) as a variable, and `y = 2x`: every case's pieces come from `y`, so `dx = 2·dy`.
fn setup() -> Result<(Var, Tensor)> {
    let x = Var::from_tensor(&Tensor::arange(1f32, 19., &Device::Cpu)?.reshape((3, 6))?)?;
    let y = x.as_tensor().affine(2.0, 0.0)?;
    Ok((x, y))
}

/// The weights `w` of `sum(w · piece)` for a piece of shape `dims`: distinct values, so a piece in the wrong place
/// shows.
fn weights(dims: (usize, usize), seed: f32) -> Result<Tensor> {
    let n = dims.0 * dims.1;
    Tensor::arange(0f32, n as f32, &Device::Cpu)?.affine(1.0, f64::from(seed))?.reshape(dims)
}

fn grad_of(x: &Var, loss: &Tensor) -> Result<Vec<Vec<f32>>> {
    let g = loss.backward()?;
    g.get(x.as_tensor()).expect("a gradient").to_dtype(DType::F32)?.to_vec2()
}

#[test]
fn narrow_pieces_give_the_gradient_of_the_whole() -> Result<()> {
    // (pieces as (dim, start, len)), and whether the tensor is also read whole.
    // The backward meets the pieces in the reverse order of their use, so both orders are here.
    let cases: [(&str, Vec<(usize, usize, usize)>, bool); 7] = [
        ("two halves", vec![(1, 0, 3), (1, 3, 3)], false),
        ("pieces with gaps", vec![(1, 1, 2), (1, 4, 1)], false),
        ("pieces with gaps, used in the other order", vec![(1, 4, 1), (1, 1, 2)], false),
        ("overlapping pieces", vec![(1, 0, 4), (1, 2, 4)], false),
        ("two dimensions", vec![(0, 1, 2), (1, 0, 2)], false),
        ("one piece, whole", vec![(1, 0, 6)], false),
        ("pieces and the whole", vec![(1, 0, 3), (1, 3, 3)], true),
    ];
    for (name, pieces, whole) in cases {
        let (x, y) = setup()?;
        let mut want = vec![vec![0f32; 6]; 3];
        let mut loss = Tensor::zeros((), DType::F32, &Device::Cpu)?;
        for (k, &(dim, start, len)) in pieces.iter().enumerate() {
            let piece = y.narrow(dim, start, len)?;
            let (rows, cols) = piece.dims2()?;
            let w = weights((rows, cols), 10.0 * k as f32)?;
            loss = (loss + (piece * &w)?.sum_all()?)?;
            let w = w.to_vec2::<f32>()?;
            for (r, row) in w.iter().enumerate() {
                for (c, v) in row.iter().enumerate() {
                    let (i, j) = if dim == 0 { (start + r, c) } else { (r, start + c) };
                    want[i][j] += 2.0 * v;
                }
            }
        }
        if whole {
            loss = (loss + y.sum_all()?)?;
            want.iter_mut().flatten().for_each(|v| *v += 2.0);
        }
        assert_eq!(grad_of(&x, &loss)?, want, "{name}");
    }
    // A variable narrowed directly: its gradient is assembled too.
    let (x, _) = setup()?;
    let (a, b) = (x.as_tensor().narrow(1, 0, 2)?, x.as_tensor().narrow(1, 2, 4)?);
    let loss = ((a * weights((3, 2), 0.0)?)?.sum_all()? + (b * weights((3, 4), 7.0)?)?.sum_all()?)?;
    let want: Vec<Vec<f32>> =
        (0..3).map(|r| (0..6).map(|c| if c < 2 { (2 * r + c) as f32 } else { (4 * r + c - 2) as f32 + 7.0 }).collect()).collect();
    assert_eq!(grad_of(&x, &loss)?, want, "a narrowed variable");
    #[cfg(feature = "ledger")]
    two_halves_take_one_concatenation()?;
    Ok(())
}

/// The op ledger is process-wide, so this runs inside the one test of this file: the backward of a split into two
/// halves fills no zeros and adds nothing, where upstream fills two halves and adds two full tensors.
#[cfg(feature = "ledger")]
fn two_halves_take_one_concatenation() -> Result<()> {
    let (x, y) = setup()?;
    let loss = ((y.narrow(1, 0, 3)? * 3.0)?.sum_all()? + (y.narrow(1, 3, 3)? * 5.0)?.sum_all()?)?;
    candle_core::ledger::start("test");
    let grads = loss.backward();
    let records = candle_core::ledger::stop();
    grads?;
    let count = |op: &str| records.iter().filter(|r| r.op == op).count();
    assert_eq!((count("zeros"), count("binary:add")), (0, 0), "{records:?}");
    let _ = x;
    Ok(())
}
