//! `Var::set_owned` (a Sluice addition): the same values as `Var::set`, by exchanging buffers when the source is
//! the only handle of its own, by copying otherwise.
use candle_core::{Device, Result, Storage, Tensor, Var};

/// Where a CPU tensor's values live.
fn data_ptr(t: &Tensor) -> usize {
    match &*t.storage_and_layout().0 {
        Storage::Cpu(s) => s.as_slice::<f32>().map(|v| v.as_ptr() as usize).unwrap_or(0),
        _ => 0,
    }
}

#[test]
fn set_owned_gives_set_values_and_swaps_only_a_sole_fresh_buffer() -> Result<()> {
    let dev = Device::Cpu;
    let v = Var::new(&[1f32, 2., 3., 4.], &dev)?;
    let seen = v.as_tensor().clone();
    // A fresh tensor: exchanged. Every handle of the variable sees the new values.
    let fresh = Tensor::new(&[5f32, 6., 7., 8.], &dev)?;
    let fresh_at = data_ptr(&fresh);
    v.set_owned(fresh)?;
    assert_eq!(seen.to_vec1::<f32>()?, [5., 6., 7., 8.]);
    assert_eq!(data_ptr(v.as_tensor()), fresh_at, "the variable took the fresh buffer");
    // A tensor with another handle: copied, and the other handle keeps its values.
    let shared = Tensor::new(&[9f32, 10., 11., 12.], &dev)?;
    let other = shared.clone();
    v.set_owned(shared)?;
    assert_eq!(v.as_tensor().to_vec1::<f32>()?, [9., 10., 11., 12.]);
    assert_ne!(data_ptr(v.as_tensor()), data_ptr(&other), "a shared buffer is copied, not taken");
    other.affine(2.0, 0.0)?; // still usable
    assert_eq!(other.to_vec1::<f32>()?, [9., 10., 11., 12.]);
    v.set_owned(Tensor::new(&[0f32; 4], &dev)?)?;
    assert_eq!(other.to_vec1::<f32>()?, [9., 10., 11., 12.], "a copied source is not changed afterwards");
    // A view of a larger buffer and a wrong shape: copied, or refused as `set` refuses it.
    let big = Tensor::arange(0f32, 8., &dev)?;
    v.set_owned(big.narrow(0, 4, 4)?)?;
    assert_eq!(v.as_tensor().to_vec1::<f32>()?, [4., 5., 6., 7.]);
    assert!(v.set_owned(Tensor::new(&[1f32, 2.], &dev)?).is_err());
    Ok(())
}

#[test]
fn parts_of_a_variable_follow_it_and_never_take_a_buffer_of_their_own() -> Result<()> {
    let dev = Device::Cpu;
    let whole = Var::new(&[1f32, 2., 3., 4., 5., 6.], &dev)?;
    let first = Var::sharing(&whole.as_tensor().narrow(0, 0, 2)?)?;
    let rest = Var::sharing(&whole.as_tensor().narrow(0, 2, 4)?.reshape((2, 2))?)?;
    // The whole takes a fresh buffer: both parts read their share of it.
    whole.set_owned(Tensor::new(&[7f32, 8., 9., 10., 11., 12.], &dev)?)?;
    assert_eq!(first.as_tensor().to_vec1::<f32>()?, [7., 8.]);
    assert_eq!(rest.as_tensor().to_vec2::<f32>()?, [[9., 10.], [11., 12.]]);
    // The first part starts its buffer with its own shape, yet covers only a third of it: `set_owned` copies into
    // its share instead of handing the whole buffer over, and the other part keeps its values.
    let fresh = Tensor::new(&[0f32, -1.], &dev)?;
    let fresh_at = data_ptr(&fresh);
    first.set_owned(fresh)?;
    assert_ne!(data_ptr(first.as_tensor()), fresh_at, "a part copied, not swapped");
    assert_eq!(whole.as_tensor().to_vec1::<f32>()?, [0., -1., 9., 10., 11., 12.]);
    assert_eq!(rest.as_tensor().to_vec2::<f32>()?, [[9., 10.], [11., 12.]]);
    // A part written through `set` shows in the whole.
    rest.set(&Tensor::new(&[[1f32, 1.], [1., 1.]], &dev)?)?;
    assert_eq!(whole.as_tensor().to_vec1::<f32>()?, [0., -1., 1., 1., 1., 1.]);
    // Only contiguous views are shared.
    let grid = Tensor::arange(0f32, 6., &dev)?.reshape((2, 3))?;
    assert!(Var::sharing(&grid.t()?).is_err());
    Ok(())
}
