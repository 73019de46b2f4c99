//! Criterion bench of the model's hot path on the CPU backend: yolov8n eval forward at 320×320 and at 640×640
//! batch 1 (the baseline) against the Conv+BN-folded forward, measured in the same run, plus the SPPF max-pool workaround (native
//! padded pool vs the differentiable shifted-maximum form), and the whole `bench_model` run (eval, fused, train step).

use candle_core::{DType, Device, Tensor, Var};
use criterion::{Criterion, Throughput, criterion_group};
use sluice_model::{BenchOptions, Scale, Yolo, YoloConfig, bench_model, ops};

fn forward(c: &mut Criterion) {
    let dev = Device::Cpu;
    let model = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &dev).expect("model");
    let fused = model.fuse().expect("fuse");
    let x = Tensor::rand(0f32, 1.0, (1, 3, 320, 320), &dev).expect("input");
    let mut g = c.benchmark_group("yolov8n_320_cpu");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function("eval_forward", |b| b.iter(|| model.forward(&x).expect("forward")));
    g.bench_function("fused_forward", |b| b.iter(|| fused.forward(&x).expect("forward")));
    g.finish();

    // The inference target of `sluice bench model` (`infer1`): one 640×640 image.
    let x = Tensor::rand(0f32, 1.0, (1, 3, 640, 640), &dev).expect("input");
    let mut g = c.benchmark_group("yolov8n_640_b1_cpu");
    g.throughput(Throughput::Elements(1));
    g.sample_size(10);
    g.bench_function("eval_forward", |b| b.iter(|| model.forward(&x).expect("forward")));
    g.bench_function("fused_forward", |b| b.iter(|| fused.forward(&x).expect("forward")));
    g.finish();

    let p = Tensor::rand(0f32, 1.0, (8, 128, 20, 20), &dev).expect("input");
    let v = Var::from_tensor(&p).expect("var");
    let mut g = c.benchmark_group("sppf_pool_cpu");
    g.throughput(Throughput::Elements(p.elem_count() as u64));
    g.bench_function("native_padded", |b| b.iter(|| ops::max_pool2d_same(&p, 5).expect("pool")));
    g.bench_function("shifted_max_tracked", |b| b.iter(|| ops::max_pool2d_same(v.as_tensor(), 5).expect("pool")));
    g.finish();
}

fn train_step(c: &mut Criterion) {
    // One training step (train-mode forward + loss + backward + AdamW) at a small size, via the same code as
    // `sluice model bench`; the eval forward of the same batch is the baseline.
    let opts = BenchOptions { config: YoloConfig::new(Scale::N, 80), imgsz: 160, batch: 2, warmup: 0, iters: 1 };
    let mut g = c.benchmark_group("yolov8n_160_b2_cpu");
    g.sample_size(10);
    g.bench_function("bench_model_all_paths", |b| b.iter(|| bench_model(&opts, &Device::Cpu).expect("bench")));
    g.finish();
}

criterion_group!(benches, forward, train_step);
// The `sluice` binary's allocator and thread policy, so the figures are the binary's (`sluice_kernels::memory`).
#[global_allocator]
static GLOBAL: sluice_kernels::memory::MiMalloc = sluice_kernels::memory::MiMalloc;

fn main() {
    // SAFETY: first in `main`, before criterion or candle start any thread.
    unsafe { sluice_kernels::memory::setup_process(&|k| std::env::var(k).ok()) };
    benches();
    Criterion::default().configure_from_args().final_summary();
}
