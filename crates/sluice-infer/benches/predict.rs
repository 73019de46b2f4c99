//! The prediction hot path on the CPU: one 640x480 image through a YOLOv8n (random weights, so NMS sees many
//! candidates at `conf 0.001`) at imgsz 320: letterbox, fused forward, NMS, boxes mapped back.

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::ImageRgb8;
use sluice_infer::{PredictOptions, Predictor};
use sluice_model::candle_core::{DType, Device};
use sluice_model::{Arch, Scale, Yolo, YoloConfig};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let weights = dir.path().join("n80.safetensors");
    Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu)
        .and_then(|m| m.save(&weights))
        .expect("save a model");
    let (w, h) = (640u32, 480u32);
    let data: Vec<u8> = (0..(w * h * 3) as usize).map(|i| ((i * 7 + i / 1920 * 13) % 256) as u8).collect();
    let img = ImageRgb8::from_raw(w, h, (w * 3) as usize, data).expect("image");
    let opts = PredictOptions { imgsz: 320, conf: 0.001, ..PredictOptions::default() };
    let mut p = Predictor::load(&weights, Arch::v8(Scale::N), None, opts).expect("load");
    c.bench_function("predict_image yolov8n 640x480 at 320", |b| {
        b.iter(|| p.predict_image(&img, Path::new("bench.png")).expect("predict"))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
