//! Conv2d forward and backward (input + weight gradients) on YOLOv8n layer shapes at 320×320, batch 8: ours
//! (`sluice_kernels::conv::conv2d`) against candle's stock conv2d in the same run. Throughput is in FLOPs, so the
//! "elem/s" criterion prints are FLOP/s (forward `2·n·o·ho·wo·c·k²`, backward twice that, or as much for a layer
//! benched without its input gradient).
//!
//! `SLUICE_CONV_BENCH_BATCH` overrides the batch (default 8), `SLUICE_CONV_BENCH_IMGSZ` the image size the layer
//! shapes are taken at (default 320; 640 doubles every side, and the group names say the side).
//!
//! `SLUICE_CONV_BENCH_RATIOS=N` adds, after the criterion groups, the backward/forward time ratio measured with the
//! two passes interleaved: N pairs (forward, then backward) per layer, so a change in the shared machine's load
//! hits both passes of a pair alike. It prints each layer's median ratio and range.
#![allow(clippy::unwrap_used, clippy::needless_range_loop, clippy::type_complexity)]

use candle_core::{Device, Tensor, Var};
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group};
use sluice_kernels::conv::{conv2d, peak_workspace_bytes};

/// (name, c_in, c_out, kernel, stride, input side at imgsz 320, whether the backward computes the input gradient)
/// of YOLOv8n convs. The stem's input is the image, which needs no gradient: its backward in a training step is the
/// weight gradient alone, and it is benched that way (`stem_..._with_dx` adds the input gradient, for reference).
const LAYERS: &[(&str, usize, usize, usize, usize, usize, bool)] = &[
    ("stem_3x3s2_3to16", 3, 16, 3, 2, 320, false),
    ("stem_3x3s2_3to16_with_dx", 3, 16, 3, 2, 320, true),
    ("down_3x3s2_16to32", 16, 32, 3, 2, 160, true),
    ("c2f_3x3_32to32", 32, 32, 3, 1, 80, true),
    ("c2f_3x3_64to64", 64, 64, 3, 1, 40, true),
    ("c2f_1x1_96to64", 96, 64, 1, 1, 40, true),
    ("sppf_1x1_256to128", 256, 128, 1, 1, 10, true),
];

fn env(key: &str, default: usize) -> usize {
    std::env::var(key).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// One layer of [`LAYERS`] at the configured batch and image size.
struct Case {
    name: String,
    x: Tensor,
    w: Var,
    s: usize,
    p: usize,
    flops: usize,
    input_grad: bool,
}

fn cases() -> Vec<Case> {
    let batch = env("SLUICE_CONV_BENCH_BATCH", 8);
    let imgsz = env("SLUICE_CONV_BENCH_IMGSZ", 320);
    let dev = Device::Cpu;
    LAYERS
        .iter()
        .map(|&(layer, ci, co, k, s, side320, input_grad)| {
            let side = side320 * imgsz / 320;
            let p = k / 2;
            let x = Tensor::randn(0f32, 1.0, (batch, ci, side, side), &dev).unwrap();
            // A variable when the input gradient is wanted; a plain tensor (no gradient) otherwise.
            let x = if input_grad { Var::from_tensor(&x).unwrap().as_tensor().clone() } else { x };
            let w = Var::from_tensor(&Tensor::randn(0f32, 0.1, (co, ci, k, k), &dev).unwrap()).unwrap();
            let out = (side + 2 * p - k) / s + 1;
            let flops = 2 * batch * co * out * out * ci * k * k;
            Case { name: format!("{layer}_{side}"), x, w, s, p, flops, input_grad }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    for Case { name, x, w, s, p, flops, input_grad } in cases() {
        let mut g = c.benchmark_group(format!("conv_fwd/{name}"));
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
        g.throughput(Throughput::Elements(flops as u64));
        g.bench_function(BenchmarkId::new("cpu", "sluice"), |b| b.iter(|| conv2d(&x, w.as_tensor(), s, p).unwrap()));
        g.bench_function(BenchmarkId::new("cpu", "candle"), |b| {
            b.iter(|| x.conv2d(w.as_tensor(), p, s, 1, 1).unwrap())
        });
        g.finish();

        let mut g = c.benchmark_group(format!("conv_bwd/{name}"));
        g.sampling_mode(SamplingMode::Flat).sample_size(10);
        g.warm_up_time(std::time::Duration::from_millis(500));
        g.measurement_time(std::time::Duration::from_secs(2));
        g.throughput(Throughput::Elements(if input_grad { 2 * flops } else { flops } as u64));
        // The graph is built once; each iteration runs the backward pass (the weight gradient, and the input's when
        // it is wanted) from the output.
        let ours = conv2d(&x, w.as_tensor(), s, p).unwrap();
        g.bench_function(BenchmarkId::new("cpu", "sluice"), |b| b.iter(|| ours.backward().unwrap()));
        let stock = x.conv2d(w.as_tensor(), p, s, 1, 1).unwrap();
        g.bench_function(BenchmarkId::new("cpu", "candle"), |b| b.iter(|| stock.backward().unwrap()));
        g.finish();
    }
    eprintln!("peak conv workspace: {:.1} MiB", peak_workspace_bytes() as f64 / (1 << 20) as f64);
}

criterion_group!(benches, bench);
// The `sluice` binary's allocator and thread policy, so the figures are the binary's (`sluice_kernels::memory`).
#[global_allocator]
static GLOBAL: sluice_kernels::memory::MiMalloc = sluice_kernels::memory::MiMalloc;

fn main() {
    // SAFETY: first in `main`, before criterion or candle start any thread.
    unsafe { sluice_kernels::memory::setup_process(&|k| std::env::var(k).ok()) };
    benches();
    Criterion::default().configure_from_args().final_summary();
    let pairs = env("SLUICE_CONV_BENCH_RATIOS", 0);
    if pairs > 0 {
        interleaved_ratios(pairs);
    }
}

/// Backward time / forward time per layer, from `pairs` interleaved (forward, backward) pairs after two untimed
/// ones: the median of the per-pair ratios and their range, with the median times.
fn interleaved_ratios(pairs: usize) {
    use std::time::Instant;
    eprintln!("backward / forward, {pairs} interleaved pairs per layer:");
    for Case { name, x, w, s, p, .. } in cases() {
        let ours = conv2d(&x, w.as_tensor(), s, p).unwrap();
        let (mut ratios, mut fwd, mut bwd) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..pairs + 2 {
            let t = Instant::now();
            drop(conv2d(&x, w.as_tensor(), s, p).unwrap());
            let f = t.elapsed().as_secs_f64();
            let t = Instant::now();
            drop(ours.backward().unwrap());
            let b = t.elapsed().as_secs_f64();
            if i >= 2 {
                ratios.push(b / f);
                fwd.push(f * 1e3);
                bwd.push(b * 1e3);
            }
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (r, f, b) = (median(&mut ratios), median(&mut fwd), median(&mut bwd));
        eprintln!(
            "  {name:32} {r:.2} ({:.2}–{:.2})  forward {f:.3} ms, backward {b:.3} ms",
            ratios[0],
            ratios[ratios.len() - 1]
        );
    }
}
