//! Sluice patch: `Tensor::cat` copies consecutive arguments that are adjacent blocks of one storage with one
//! `copy2d`. Each case's result against the values written out by hand: the halves of a split along an inner
//! dimension and along the outer one, a 1-D run with a second storage after it, pieces with a gap, pieces in the
//! other order, and the gradient through a merged run; with `--features ledger`, the number of copies.

use candle_core::{DType, Device, Result, Tensor, Var};

/// `y` (3×6, values 0..18).
fn y() -> Result<Tensor> {
    Tensor::arange(0f32, 18., &Device::Cpu)?.reshape((3, 6))
}

fn row_major(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_vec1()
}

/// The op ledger is process-wide, so the cases run in this one test, one after another: a concatenation in another
/// test would be counted by the ledger check.
#[test]
fn runs_of_adjacent_blocks() -> Result<()> {
    adjacent_blocks_concatenate_to_their_values()?;
    the_gradient_through_a_merged_run_is_each_pieces()?;
    #[cfg(feature = "ledger")]
    copies_per_run()?;
    Ok(())
}

fn adjacent_blocks_concatenate_to_their_values() -> Result<()> {
    let y = y()?;
    let flat = y.flatten_all()?;
    let other = Tensor::new(&[100f32, 101.], &Device::Cpu)?;
    // (name, pieces, dim, the result row-major)
    let cases: Vec<(&str, Vec<Tensor>, usize, Vec<f32>)> = vec![
        ("a split's halves along dim 1", vec![y.narrow(1, 0, 2)?, y.narrow(1, 2, 4)?], 1, (0..18).map(|v| v as f32).collect()),
        ("three parts along dim 1", vec![y.narrow(1, 0, 1)?, y.narrow(1, 1, 2)?, y.narrow(1, 3, 3)?], 1, (0..18).map(|v| v as f32).collect()),
        ("a split's halves along dim 0", vec![y.narrow(0, 0, 1)?, y.narrow(0, 1, 2)?], 0, (0..18).map(|v| v as f32).collect()),
        ("a 1-D run, then another storage", vec![flat.narrow(0, 2, 3)?, flat.narrow(0, 5, 2)?, other.clone()], 0, vec![2., 3., 4., 5., 6., 100., 101.]),
        ("pieces with a gap", vec![flat.narrow(0, 0, 2)?, flat.narrow(0, 3, 2)?], 0, vec![0., 1., 3., 4.]),
        ("pieces in the other order", vec![flat.narrow(0, 3, 2)?, flat.narrow(0, 0, 3)?], 0, vec![3., 4., 0., 1., 2.]),
        (
            "halves in the other order along dim 1",
            vec![y.narrow(1, 3, 3)?, y.narrow(1, 0, 3)?],
            1,
            (0..3).flat_map(|r| [3, 4, 5, 0, 1, 2].map(|c| (6 * r + c) as f32)).collect(),
        ),
        (
            "the same half twice along dim 1",
            vec![y.narrow(1, 0, 3)?, y.narrow(1, 0, 3)?],
            1,
            (0..3).flat_map(|r| [0, 1, 2, 0, 1, 2].map(|c| (6 * r + c) as f32)).collect(),
        ),
    ];
    for (name, pieces, dim, want) in cases {
        assert_eq!(row_major(&Tensor::cat(&pieces, dim)?)?, want, "{name}");
    }
    Ok(())
}

fn the_gradient_through_a_merged_run_is_each_pieces() -> Result<()> {
    let x = Var::from_tensor(&y()?)?;
    let h = x.as_tensor().affine(2.0, 0.0)?;
    let cat = Tensor::cat(&[h.narrow(1, 0, 2)?, h.narrow(1, 2, 4)?, x.as_tensor().narrow(1, 5, 1)?], 1)?;
    let w = Tensor::arange(0f32, 21., &Device::Cpu)?.reshape((3, 7))?;
    let g = (cat * &w)?.sum_all()?.backward()?;
    let got: Vec<Vec<f32>> = g.get(x.as_tensor()).expect("a gradient").to_dtype(DType::F32)?.to_vec2()?;
    // d/dx: 2·w over the first six columns, plus w's last column on column 5.
    let want: Vec<Vec<f32>> = (0..3)
        .map(|r| (0..6).map(|c| 2.0 * (7 * r + c) as f32 + if c == 5 { (7 * r + 6) as f32 } else { 0.0 }).collect())
        .collect();
    assert_eq!(got, want);
    Ok(())
}

/// A run of adjacent blocks is one copy, a gap or another storage starts the next.
#[cfg(feature = "ledger")]
fn copies_per_run() -> Result<()> {
    let y = y()?;
    let flat = y.flatten_all()?;
    let other = Tensor::new(&[100f32, 101.], &Device::Cpu)?;
    let copies = |f: &dyn Fn() -> Result<Tensor>| -> Result<usize> {
        candle_core::ledger::start("test");
        let out = f();
        let records = candle_core::ledger::stop();
        out?;
        Ok(records.iter().filter(|r| r.op == "copy2d").count())
    };
    assert_eq!(copies(&|| Tensor::cat(&[y.narrow(1, 0, 2)?, y.narrow(1, 2, 4)?], 1))?, 1, "a split's halves");
    assert_eq!(copies(&|| Tensor::cat(&[y.narrow(0, 0, 1)?, y.narrow(0, 1, 2)?], 0))?, 1, "along dim 0");
    assert_eq!(copies(&|| Tensor::cat(&[flat.narrow(0, 2, 3)?, flat.narrow(0, 5, 2)?, other.clone()], 0))?, 2, "a run and another storage");
    assert_eq!(copies(&|| Tensor::cat(&[flat.narrow(0, 0, 2)?, flat.narrow(0, 3, 2)?], 0))?, 2, "a gap");
    Ok(())
}
