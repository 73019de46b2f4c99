//! Criterion benches of the fused BatchNorm(train)+SiLU, eval affine+SiLU, max-pool, upsample, DFL decode, BCE and
//! depthwise-convolution kernels against
//! the composed candle ops, on YOLOv8n's layer shapes at 320×320, batch 8 (CPU backend), forward and
//! forward+backward, in the same run so the ratios are comparable.

use std::time::Duration;

use candle_core::{DType, Device, Tensor, Var};
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, measurement::WallTime};
use sluice_kernels::{depthwise, dfl, loss, norm, pool};

const BN_EPS: f64 = 1e-3;

fn group<'a>(c: &'a mut Criterion, name: &str, elems: usize) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(elems as u64));
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g
}

/// Forward and forward+backward of `f(x)·w` summed, for a variable `x`.
fn fwd_bwd(x: &Var, w: &Tensor, f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>) {
    let y = f(x.as_tensor()).expect("forward");
    let g = y.mul(w).expect("mul").sum_all().expect("sum").backward().expect("backward");
    assert!(g.get(x.as_tensor()).is_some());
}

fn batch_norm_silu(c: &mut Criterion) {
    let dev = Device::Cpu;
    for (n, ch, h, w) in [(8, 16, 160, 160), (8, 64, 40, 40), (8, 256, 10, 10)] {
        let x = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("x");
        let wt = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("w");
        let gamma = Var::from_tensor(&Tensor::ones(ch, DType::F32, &dev).expect("g")).expect("var");
        let beta = Var::from_tensor(&Tensor::zeros(ch, DType::F32, &dev).expect("b")).expect("var");
        let xv = Var::from_tensor(&x).expect("var");
        let (gt, bt) = (gamma.as_tensor(), beta.as_tensor());
        let mut g = group(c, &format!("bn_silu_train_cpu_f32/{n}x{ch}x{h}x{w}"), x.elem_count());
        g.bench_function("fused_fwd", |b| b.iter(|| norm::batch_norm_silu_train(&x, gt, bt, BN_EPS).expect("bn")));
        g.bench_function("composed_fwd", |b| {
            b.iter(|| norm::batch_norm_silu_train_composed(&x, gt, bt, BN_EPS).expect("bn"))
        });
        g.bench_function("fused_fwd_bwd", |b| {
            b.iter(|| fwd_bwd(&xv, &wt, &|t| Ok(norm::batch_norm_silu_train(t, gt, bt, BN_EPS)?.0)))
        });
        g.bench_function("composed_fwd_bwd", |b| {
            b.iter(|| fwd_bwd(&xv, &wt, &|t| Ok(norm::batch_norm_silu_train_composed(t, gt, bt, BN_EPS)?.0)))
        });
        g.finish();
        let mut g = group(c, &format!("affine_silu_eval_cpu_f32/{n}x{ch}x{h}x{w}"), x.elem_count());
        let (s, t) = (gamma.as_tensor().detach(), beta.as_tensor().detach());
        g.bench_function("fused_fwd", |b| b.iter(|| norm::affine_silu(&x, &s, &t).expect("affine")));
        g.bench_function("composed_fwd", |b| b.iter(|| norm::affine_silu_composed(&x, &s, &t).expect("affine")));
        g.finish();
    }
}

/// YOLO11's depthwise 3×3 convolutions (its head's class branches at P3 and P5 of 320×320, batch 8).
fn depthwise_conv(c: &mut Criterion) {
    let dev = Device::Cpu;
    for (n, ch, h, w) in [(8, 64, 40, 40), (8, 256, 10, 10)] {
        let x = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("x");
        let wt = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("w");
        let k = Tensor::randn(0f32, 0.3, (ch, 1, 3, 3), &dev).expect("k");
        let xv = Var::from_tensor(&x).expect("var");
        let mut g = group(c, &format!("depthwise3x3_cpu_f32/{n}x{ch}x{h}x{w}"), x.elem_count());
        g.bench_function("fused_fwd", |b| b.iter(|| depthwise::depthwise_conv2d(&x, &k, 1).expect("dw")));
        g.bench_function("composed_fwd", |b| b.iter(|| depthwise::depthwise_conv2d_composed(&x, &k, 1).expect("dw")));
        g.bench_function("fused_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| depthwise::depthwise_conv2d(t, &k, 1))));
        g.bench_function("composed_fwd_bwd", |b| {
            b.iter(|| fwd_bwd(&xv, &wt, &|t| depthwise::depthwise_conv2d_composed(t, &k, 1)))
        });
        g.finish();
    }
}

fn pool_upsample(c: &mut Criterion) {
    let dev = Device::Cpu;
    // SPPF's pool input at 320 for yolov8n (128 channels at 10×10), and a larger map for scale.
    for (n, ch, h, w) in [(8, 128, 10, 10), (8, 128, 40, 40)] {
        let x = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("x");
        let wt = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("w");
        let xv = Var::from_tensor(&x).expect("var");
        let mut g = group(c, &format!("max_pool_k5_cpu_f32/{n}x{ch}x{h}x{w}"), x.elem_count());
        g.bench_function("fused_fwd", |b| b.iter(|| pool::max_pool2d_same(&x, 5).expect("pool")));
        g.bench_function("composed_native_fwd", |b| b.iter(|| pool::max_pool2d_same_composed(&x, 5).expect("pool")));
        g.bench_function("fused_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| pool::max_pool2d_same(t, 5))));
        g.bench_function("composed_fwd_bwd", |b| {
            b.iter(|| fwd_bwd(&xv, &wt, &|t| pool::max_pool2d_same_composed(t, 5)))
        });
        g.bench_function("gather_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| pool::max_pool2d_same_gather(t, 5))));
        g.finish();
    }
    // The neck's two upsamples at 320 for yolov8n.
    for (n, ch, h, w) in [(8, 256, 10, 10), (8, 128, 20, 20)] {
        let x = Tensor::randn(0f32, 1.0, (n, ch, h, w), &dev).expect("x");
        let wt = Tensor::randn(0f32, 1.0, (n, ch, 2 * h, 2 * w), &dev).expect("w");
        let xv = Var::from_tensor(&x).expect("var");
        let mut g = group(c, &format!("upsample2x_cpu_f32/{n}x{ch}x{h}x{w}"), x.elem_count());
        g.bench_function("fused_fwd", |b| b.iter(|| pool::upsample_nearest2x(&x).expect("up")));
        g.bench_function("composed_native_fwd", |b| b.iter(|| pool::upsample_nearest2x_composed(&x).expect("up")));
        g.bench_function("fused_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &pool::upsample_nearest2x)));
        g.bench_function("composed_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &pool::upsample_nearest2x_composed)));
        g.finish();
    }
}

fn dfl_decode(c: &mut Criterion) {
    let dev = Device::Cpu;
    // The head's box logits at 320 (2100 anchors) and 640 (8400), batch 8, reg_max 16.
    for a in [2100, 8400] {
        let x = Tensor::randn(0f32, 2.0, (8, 64, a), &dev).expect("x");
        let wt = Tensor::randn(0f32, 1.0, (8, 4, a), &dev).expect("w");
        let xv = Var::from_tensor(&x).expect("var");
        let mut g = group(c, &format!("dfl_decode_cpu_f32/8x64x{a}"), x.elem_count());
        g.bench_function("fused_fwd", |b| b.iter(|| dfl::dfl_decode(&x, 16).expect("dfl")));
        g.bench_function("composed_fwd", |b| b.iter(|| dfl::dfl_decode_composed(&x, 16).expect("dfl")));
        g.bench_function("fused_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| dfl::dfl_decode(t, 16))));
        g.bench_function("composed_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| dfl::dfl_decode_composed(t, 16))));
        g.finish();
    }
}

fn bce(c: &mut Criterion) {
    let dev = Device::Cpu;
    // The class loss at 320 (2100 anchors), batch 8, 80 classes.
    let x = Tensor::randn(0f32, 3.0, (8, 80, 2100), &dev).expect("x");
    let z = Tensor::rand(0f32, 0.5, (8, 80, 2100), &dev).expect("z");
    let wt = Tensor::randn(0f32, 1.0, (8, 80, 2100), &dev).expect("w");
    let xv = Var::from_tensor(&x).expect("var");
    let mut g = group(c, "bce_with_logits_cpu_f32/8x80x2100", x.elem_count());
    g.bench_function("fused_fwd", |b| b.iter(|| loss::bce_with_logits(&x, &z).expect("bce")));
    g.bench_function("composed_fwd", |b| b.iter(|| loss::bce_with_logits_composed(&x, &z).expect("bce")));
    g.bench_function("fused_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| loss::bce_with_logits(t, &z))));
    g.bench_function("composed_fwd_bwd", |b| b.iter(|| fwd_bwd(&xv, &wt, &|t| loss::bce_with_logits_composed(t, &z))));
    let p = Tensor::ones_like(&x).expect("p").affine(0.5, 0.0).expect("p");
    let one = Tensor::new(1f32, &dev).expect("one");
    let label: Vec<u32> = (0..8 * 2100u32).map(|i| i * 37 % 80).collect();
    let label = Tensor::from_vec(label, (8, 2100), &dev).expect("label");
    let weight = Tensor::rand(0f32, 1.0, (8, 2100), &dev).expect("weight");
    let zh = loss::one_hot_targets(&label, &weight, 80).expect("one-hot");
    g.bench_function("composed_sum_one_hot_fwd_bwd", |b| {
        b.iter(|| fwd_bwd(&xv, &one, &|t| loss::bce_with_logits_composed(t, &zh)?.sum_all()))
    });
    g.bench_function("sum_one_hot_given_probs_fwd_bwd", |b| {
        b.iter(|| fwd_bwd(&xv, &one, &|t| loss::bce_with_logits_sum_one_hot_given_probs(t, &label, &weight, &p)))
    });
    g.finish();
}

criterion_group!(benches, batch_norm_silu, pool_upsample, dfl_decode, bce, depthwise_conv);
// The `sluice` binary's allocator and thread policy, so the figures are the binary's (`sluice_kernels::memory`).
#[global_allocator]
static GLOBAL: sluice_kernels::memory::MiMalloc = sluice_kernels::memory::MiMalloc;

fn main() {
    // SAFETY: first in `main`, before criterion or candle start any thread.
    unsafe { sluice_kernels::memory::setup_process(&|k| std::env::var(k).ok()) };
    benches();
    Criterion::default().configure_from_args().final_summary();
}
