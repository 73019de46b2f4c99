//! The export's hot path: `Yolo::graph` (BatchNorm folding, weights to the host) and the ONNX writer with its
//! protobuf encoding, for yolov8n (80 classes) at 640, the size Ultralytics exports by default.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_export::{ExportArgs, Metadata, OnnxOptions, to_onnx_bytes};
use sluice_model::candle_core::{DType, Device};
use sluice_model::{Scale, Yolo, YoloConfig};

fn meta(nc: usize) -> Metadata {
    Metadata {
        description: "bench".into(),
        author: "sluice".into(),
        date: "1970-01-01T00:00:00+00:00".into(),
        version: "0".into(),
        license: "none".into(),
        docs: "none".into(),
        stride: 32,
        task: "detect".into(),
        head: "Detect".into(),
        batch: 1,
        imgsz: (640, 640),
        names: (0..nc).map(|i| i.to_string()).collect(),
        args: ExportArgs { batch: 1, half: false, nms: false, dynamic: false, opset: 17 },
        channels: 3,
        end2end: false,
    }
}

fn bench(c: &mut Criterion) {
    let Ok(model) = Yolo::new_seeded(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu, 0) else {
        panic!("building yolov8n");
    };
    let opts = OnnxOptions::default();
    let meta = meta(80);
    let size = to_onnx_bytes(&model.graph().expect("graph"), &opts, &meta).expect("export").len();
    let mut g = c.benchmark_group("export");
    g.throughput(Throughput::Bytes(size as u64));
    g.bench_function("yolov8n_onnx_cpu", |b| {
        b.iter(|| to_onnx_bytes(&model.graph().expect("graph"), &opts, &meta).expect("export"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
