//! The v8 loss on one batch of yolov8n head outputs at 320 / batch 8: the host assigner path (the CPU's) against
//! the dense tensor-op path (the GPU's), same inputs, same process.
use candle_core::{DType, Device, Tensor};
use criterion::{Criterion, criterion_group};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DenseTargets, DetectionLoss, Mode, Scale, Yolo, YoloConfig};

fn loss(c: &mut Criterion) {
    let (b, side, nc) = (8usize, 320usize, 80usize);
    let model = Yolo::new_seeded(YoloConfig::new(Scale::N, nc), DType::F32, &Device::Cpu, 0).expect("model");
    let x = Tensor::rand(0f32, 1.0, (b, 3, side, side), &Device::Cpu).expect("input");
    let (raw, _) = model.forward_raw(&x, Mode::Train).expect("forward");
    let raw = sluice_model::RawHead {
        boxes: raw.boxes.detach(),
        scores: raw.scores.detach(),
        grids: raw.grids,
        one2one: None,
    };
    // Six boxes per image on a grid, different classes: a typical coco128 load.
    let mut targets = Vec::new();
    for image in 0..b as u32 {
        for k in 0..6u32 {
            let (x0, y0) = (20.0 + 45.0 * k as f32, 30.0 + 30.0 * (k % 3) as f32);
            targets.push(Target {
                image,
                class: (image * 7 + k) % nc as u32,
                bbox: BoxXyxy::new(x0, y0, x0 + 60.0, y0 + 90.0),
            });
        }
    }
    let m = 6;
    let mut cls = vec![0f32; b * m];
    let mut boxes = vec![0f32; b * m * 4];
    for (i, t) in targets.iter().enumerate() {
        cls[i] = t.class as f32;
        boxes[i * 4..i * 4 + 4].copy_from_slice(&[t.bbox.x1, t.bbox.y1, t.bbox.x2, t.bbox.y2]);
    }
    let cls = Tensor::from_vec(cls, (b, m), &Device::Cpu).expect("classes");
    let boxes = Tensor::from_vec(boxes, (b, m, 4), &Device::Cpu).expect("boxes");
    let mask = Tensor::ones((b, m), DType::F32, &Device::Cpu).expect("mask");
    let l = DetectionLoss::new(nc);
    let mut g = c.benchmark_group("loss_320_b8");
    g.sample_size(20);
    g.bench_function("host_assigner", |bch| bch.iter(|| l.compute(&raw, &targets).expect("loss")));
    g.bench_function("dense", |bch| {
        bch.iter(|| l.compute_dense(&raw, DenseTargets { classes: &cls, boxes: &boxes, mask: &mask }).expect("loss"))
    });
    g.finish();
}

criterion_group!(benches, loss);
// The `sluice` binary's allocator and thread policy, so the figures are the binary's (`sluice_kernels::memory`).
#[global_allocator]
static GLOBAL: sluice_kernels::memory::MiMalloc = sluice_kernels::memory::MiMalloc;

fn main() {
    // SAFETY: first in `main`, before criterion or candle start any thread.
    unsafe { sluice_kernels::memory::setup_process(&|k| std::env::var(k).ok()) };
    benches();
    Criterion::default().configure_from_args().final_summary();
}
