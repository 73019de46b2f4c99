//! Element-wise ops with a scalar operand (a Sluice change): the scalar is made once per device, dtype and value,
//! and the ops give the values they gave with a scalar made per call.
use candle_core::{DType, Device, Result, Tensor};

#[test]
fn scalar_operands_give_the_same_values_as_explicit_tensors() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::new(&[-1.5f32, -0.25, 0.0, 0.3, 0.5, 2.0, 7.0], &dev)?;
    let full = |v: f64| Tensor::new(v, &dev)?.to_dtype(DType::F32)?.broadcast_as(x.shape());
    for _ in 0..2 {
        assert_eq!(x.maximum(0.0)?.to_vec1::<f32>()?, x.maximum(&full(0.0)?)?.to_vec1::<f32>()?);
        assert_eq!(x.minimum(0.3f64)?.to_vec1::<f32>()?, x.minimum(&full(0.3)?)?.to_vec1::<f32>()?);
        assert_eq!(x.clamp(-0.25, 6.99)?.to_vec1::<f32>()?, [-0.25, -0.25, 0.0, 0.3, 0.5, 2.0, 6.99]);
        assert_eq!(x.ge(0.5)?.to_vec1::<u8>()?, [0, 0, 0, 0, 1, 1, 1]);
        assert_eq!(x.lt(0.0)?.to_vec1::<u8>()?, [1, 1, 0, 0, 0, 0, 0]);
    }
    // The scalar's own dtype converts first, as a scalar made per call did: 300 as u32 wraps to 44 in u8.
    let bytes = Tensor::new(&[44u8, 45], &dev)?;
    let direct = bytes.eq(&Tensor::new(300u32, &dev)?.to_dtype(DType::U8)?.broadcast_as(2)?)?;
    assert_eq!(bytes.eq(300u32)?.to_vec1::<u8>()?, direct.to_vec1::<u8>()?);
    // Another dtype of the same value is another scalar.
    let h = x.to_dtype(DType::F16)?;
    assert_eq!(h.maximum(0.3f64)?.to_dtype(DType::F32)?.to_vec1::<f32>()?[0], half::f16::from_f64(0.3).to_f32());
    // The cached scalar itself, broadcast as a constant branch of `where_cond`: the values of a filled tensor.
    let pi_4 = candle_core::scalar::cached_scalar((DType::F64, std::f64::consts::FRAC_PI_4), DType::F32, &dev)?;
    let filled = x.zeros_like()?.affine(1.0, std::f64::consts::FRAC_PI_4)?;
    let mask = x.ge(0.5)?;
    assert_eq!(
        mask.where_cond(&pi_4.broadcast_as(x.shape())?, &x)?.to_vec1::<f32>()?,
        mask.where_cond(&filled, &x)?.to_vec1::<f32>()?
    );
    #[cfg(feature = "ledger")]
    a_scalar_operand_is_uploaded_once()?;
    Ok(())
}

/// The op ledger is process-wide, so this runs inside the one test of this file.
#[cfg(feature = "ledger")]
fn a_scalar_operand_is_uploaded_once() -> Result<()> {
    let x = Tensor::new(&[1f32, 2., 3.], &Device::Cpu)?;
    x.maximum(1.25)?.ge(2.5f32)?; // both scalars made here
    let mask = x.ge(2.0)?;
    let cached = || candle_core::scalar::cached_scalar((DType::F64, -1.0), DType::F32, &Device::Cpu);
    cached()?;
    candle_core::ledger::start("test");
    for _ in 0..3 {
        x.maximum(1.25)?.ge(2.5f32)?;
        mask.where_cond(&cached()?.broadcast_as(3)?, &x)?;
    }
    let records = candle_core::ledger::stop();
    let uploads = records.iter().filter(|r| r.op == "from_host").count();
    assert_eq!(uploads, 0, "{records:?}");
    assert_eq!(records.iter().filter(|r| r.op.contains("maximum")).count(), 3);
    // A broadcast scalar operand is a view: nothing is filled or allocated for it.
    assert_eq!(records.iter().filter(|r| r.op.contains("where")).count(), 3);
    assert!(records.iter().all(|r| !r.op.contains("const_set") && !r.op.contains("zeros")), "{records:?}");
    Ok(())
}
