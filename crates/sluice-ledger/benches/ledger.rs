//! Criterion bench of the ledger's hot path: recording one small yolov8n step and validation batch (128 px,
//! batch 2) with the op ledger on, and summarising its records.

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_ledger::{StepCostOptions, record_step, summarize};

fn ledger(c: &mut Criterion) {
    let opts = StepCostOptions { imgsz: 128, batch: 2, ..StepCostOptions::new("yolov8n") };
    let mut g = c.benchmark_group("ledger_yolov8n_128_b2");
    g.sample_size(10);
    g.bench_function("record_step", |b| b.iter(|| record_step(&opts).expect("recorded")));
    let records = record_step(&opts).expect("recorded");
    g.bench_function("summarize", |b| b.iter(|| summarize(&opts, &records)));
    g.finish();
}

criterion_group!(benches, ledger);
criterion_main!(benches);
