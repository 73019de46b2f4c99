//! The training loader's hot path: one epoch of mosaic batches from a warm decoded-image cache (decode skipped, so
//! the figure is the augment stage composing samples into pooled batch slots), on a small generated dataset.
//! Throughput in images.

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_augment::Hyp;
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_dataset::{IndexOptions, Split};
use sluice_loader::split::load_split;
use sluice_loader::{DecodedSource, LoaderConfig, RAM_CACHE_BYTES, TrainLoader};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg =
        SynthConfig { out: dir.path().to_path_buf(), seed: 1, train: 32, val: 4, imgsz: 320, ..Default::default() };
    let yaml = generate(&cfg).expect("generate").data_yaml;
    let split =
        load_split(&yaml, Split::Train, &IndexOptions { cache: false, find_orphans: false }, true).expect("split");
    let images = split.index().len() as u64;
    let source = DecodedSource::open(&split.source, split.indexed.index, 320, true, RAM_CACHE_BYTES).expect("source");
    let loader =
        TrainLoader::new(Arc::new(source), LoaderConfig { workers: 2, ..LoaderConfig::new(320, 8, 0) }, Hyp::default())
            .expect("loader");
    // Fill the cache once, so the timed epochs measure the loader, not the decoder.
    for b in loader.epoch(0, 100) {
        b.expect("batch");
    }
    let mut group = c.benchmark_group("train_loader");
    group.throughput(Throughput::Elements(images));
    group.sample_size(10);
    let mut epoch = 1;
    group.bench_function("epoch_warm_320_b8_2w", |b| {
        b.iter(|| {
            for batch in loader.epoch(epoch, 100) {
                std::hint::black_box(batch.expect("batch").len());
            }
            epoch += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
