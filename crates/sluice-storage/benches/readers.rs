//! Reader throughput on the same images: `FileReader` (open + read per sample), `PackedReader` (slices of an
//! mmap'd shard, crc32-checked on every read, and unchecked), and `CachedReader<FileReader>` (warm RAM cache).
//! One iteration = every sample once; the consumer touches one byte per 64 (every cache line), as a decoder
//! would read them all. Throughput in bytes (MB/s).
//!
//! Images: `images/train2017` of coco128 where `sluice_testkit::locations` finds it (`$SLUICE_COCO128`, by default
//! `$SLUICE_DATASETS/coco128`, by default under `../shared` beside the repository), else the JPEGs committed in
//! `crates/sluice-decode/tests/data`. Run: `cargo bench -p sluice-storage`.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::Reader;
use sluice_storage::{CachedReader, FileReader, PackedReader, Verify, pack_files};

fn images() -> Vec<PathBuf> {
    let coco = sluice_testkit::locations::coco128_dir().join("images/train2017");
    let fallback = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../sluice-decode/tests/data");
    let dir = if coco.is_dir() { coco } else { fallback };
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("image directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    files.sort();
    eprintln!("{} images from {}", files.len(), dir.display());
    files
}

fn touch(bytes: &[u8]) -> u8 {
    bytes.iter().step_by(64).fold(0, |a, &b| a ^ b)
}

fn pass(reader: &dyn Reader, scratch: &mut Vec<u8>) -> u8 {
    let mut x = 0;
    for id in 0..reader.len() as u64 {
        x ^= touch(reader.read(id, scratch).expect("read"));
    }
    x
}

fn readers(c: &mut Criterion) {
    let paths = images();
    let total: u64 = paths.iter().map(|p| std::fs::metadata(p).expect("size").len()).sum();
    let dir = tempfile::tempdir().expect("tempdir");
    let shard = dir.path().join("bench.sluice");
    pack_files(paths.iter().map(|p| (p.clone(), Vec::new())), &shard).expect("pack");

    let file = FileReader::new(paths.clone());
    let packed = PackedReader::open(&shard).expect("open");
    let unchecked = PackedReader::open(&shard).expect("open").with_verify(Verify::Never);
    let cached = CachedReader::new(FileReader::new(paths), usize::MAX);
    let mut scratch = Vec::new();
    pass(&cached, &mut scratch); // Fill the cache.

    let mut group = c.benchmark_group("read");
    group.sample_size(20).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Bytes(total));
    let cases: [(&str, &dyn Reader); 4] =
        [("file", &file), ("packed", &packed), ("packed-noverify", &unchecked), ("cached-file", &cached)];
    for (name, reader) in cases {
        group.bench_function(name, |b| b.iter(|| black_box(pass(reader, &mut scratch))));
    }
    group.finish();
    let u = cached.usage();
    eprintln!("cache: {} entries, {} bytes, hit rate {:.3}", u.entries, u.used_bytes, u.hit_rate());
}

criterion_group!(benches, readers);
criterion_main!(benches);
