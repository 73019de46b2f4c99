//! Label parsing and indexing throughput: `parse_yolo_labels` on coco128-like label text (rows/s), and a full
//! index build of a generated dataset, scanning every file vs reusing the label cache (images/s). The cached
//! build is the baseline the scan is compared with in the same run.

use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_dataset::index::{IndexOptions, build_index, cache_path_for};
use sluice_dataset::parse_yolo_labels;

fn label_text(rows: usize) -> String {
    (0..rows)
        .map(|i| {
            let f = i as f32 / rows as f32;
            format!("{} {:.6} {:.6} {:.6} {:.6}\n", i % 80, 0.1 + 0.8 * f, 0.9 - 0.8 * f, 0.05 + 0.1 * f, 0.2)
        })
        .collect()
}

fn bench_parse(c: &mut Criterion) {
    let text = label_text(1000);
    let mut g = c.benchmark_group("labels");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("parse_yolo/1000_rows", |b| {
        b.iter(|| parse_yolo_labels(std::hint::black_box(&text), Path::new("bench.txt"), 80).map(|p| p.rows.len()))
    });
    g.finish();
}

fn bench_index(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = sluice_dataset::synth::SynthConfig {
        out: dir.path().to_path_buf(),
        train: 200,
        val: 0,
        imgsz: 64,
        ..Default::default()
    };
    sluice_dataset::synth::generate(&cfg).expect("generate");
    let data = sluice_dataset::DataConfig::load(dir.path().join("data.yaml")).expect("yaml");
    let images = data.image_files(sluice_dataset::Split::Train).expect("images");
    let cache = cache_path_for(&images).expect("cache path");
    let opts = IndexOptions::default();
    let mut g = c.benchmark_group("index");
    g.throughput(Throughput::Elements(images.len() as u64));
    g.bench_function("scan/200_images", |b| b.iter(|| build_index(&images, &data.names, None, &opts).index.len()));
    build_index(&images, &data.names, Some(&cache), &opts);
    g.bench_function("cached/200_images", |b| {
        b.iter(|| build_index(&images, &data.names, Some(&cache), &opts).index.len())
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_index);
criterion_main!(benches);
