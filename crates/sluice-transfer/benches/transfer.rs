//! CPU transfer throughput: a 16 × 3 × 320 × 320 batch to an f32 tensor, against a baseline of candle's own
//! `from_slice(u8) → to_dtype(f32) → affine(1/255)` chain measured in the same run.

use std::hint::black_box;

use candle_core::{DType, Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{Batch, BatchShape, Transfer};
use sluice_transfer::CpuTransfer;

fn bench(c: &mut Criterion) {
    let shape = BatchShape::rgb(16, 320, 320);
    let mut batch = Batch::new(shape, 0);
    for i in 0..16 {
        let (_, slot) = batch.push_slot(i).expect("slot");
        for (j, v) in slot.iter_mut().enumerate() {
            *v = (j * 31 + i as usize) as u8;
        }
    }
    let mut g = c.benchmark_group("transfer");
    g.throughput(Throughput::Bytes(shape.len() as u64));
    let cpu = CpuTransfer::new(Device::Cpu, DType::F32);
    g.bench_function("cpu/f32/sluice", |b| b.iter(|| black_box(cpu.transfer(&batch).expect("transfer"))));
    g.bench_function("cpu/f32/candle-chain-baseline", |b| {
        b.iter(|| {
            let t = Tensor::from_slice(batch.pixels(), (16, 3, 320, 320), &Device::Cpu)
                .and_then(|t| t.to_dtype(DType::F32))
                .and_then(|t| t.affine(1.0 / 255.0, 0.0))
                .expect("tensor");
            black_box(t)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
