//! Criterion bench of the trainer's hot path on the CPU backend: one yolov8n training step (train-mode forward,
//! loss, backward, optimizer step and EMA, through `Optimization`, as `Trainer::step` runs it) at 160 px, batch 4,
//! on a synthetic batch, the host loss path (the CPU default) against the dense device path (`dense_loss`) in the
//! same run. The step's device work is measured as a ledger instead (`sluice bench step-cost`).

use candle_core::{DType, Device};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::Transfer;
use sluice_infer::loss_path::step_loss;
use sluice_ledger::synthetic_batch;
use sluice_model::{DetectionLoss, Mode, Yolo};
use sluice_train::optim::{OptimSettings, Optimization, OptimizerKind, RunShape, StepOptions, StepPath};
use sluice_transfer::DeviceTransfer;

const BATCH: usize = 4;
const IMGSZ: usize = 160;

fn step(c: &mut Criterion) {
    let dev = Device::Cpu;
    let arch = sluice_model::parse_model("yolov8n").expect("model name");
    let model = Yolo::new_seeded(arch.config(80), DType::F32, &dev, 0).expect("model");
    let loss = DetectionLoss::new(80);
    let batch = synthetic_batch(BATCH, IMGSZ, 8, 80).expect("batch");
    let x = DeviceTransfer::new(&dev, DType::F32).expect("transfer").transfer(&batch).expect("transferred");
    let mut g = c.benchmark_group("train_step_yolov8n_cpu");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.sample_size(10);
    for dense in [false, true] {
        let settings = OptimSettings { optimizer: OptimizerKind::Sgd, nbs: BATCH, ..OptimSettings::default() };
        let shape = RunShape { batch: BATCH, epochs: 100, batches_per_epoch: 1000, train_images: 1000 * BATCH };
        let path = if dense { StepPath::Device } else { StepPath::Host };
        let step = StepOptions { path, loss_scaling: None };
        let mut opt = Optimization::with_step(&model, &settings, shape, step).expect("optimization");
        let mut ni = 0;
        let name = if dense { "dense_loss_device_checks" } else { "host_loss" };
        g.bench_function(name, |b| {
            b.iter(|| {
                let (raw, _) = model.forward_raw(&x.images, Mode::Train).expect("forward");
                let l = step_loss(&loss, &raw, &batch, &x, dense).expect("loss");
                opt.batch_known_finite(&model, &l.total, true, ni, 0).expect("step");
                ni += 1;
            })
        });
    }
    g.finish();
}

criterion_group!(benches, step);
criterion_main!(benches);
