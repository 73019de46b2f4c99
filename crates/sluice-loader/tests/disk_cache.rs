//! `cache: disk` on a small generated dataset: batches byte-identical to `cache: ram`'s for the same seed, served
//! from the mapped file without copying the pixels; a file left by a killed build (a stray temporary file, or a
//! partly written file under the final name), a truncated or damaged file, or a file built before an image changed
//! is never read as pixels but rebuilt; an image that fails to decode is absent from the file and fails as it would
//! without a cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sluice_augment::{Hyp, TrainAugment};
use sluice_core::{Augment, ImageSource};
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_dataset::{DataConfig, IndexOptions, SampleIndex, Split};
use sluice_loader::{
    CacheFile, DecodedSource, LoaderConfig, NodeCache, RAM_CACHE_BYTES, SourceKind, TrainLoader, ValLoader,
    disk_cache_path,
};

/// Smaller than the generated side, so decoding resizes and the labels are scaled.
const IMGSZ: u32 = 128;

fn dataset(dir: &Path) -> (SampleIndex, SampleIndex) {
    let cfg = SynthConfig { out: dir.to_path_buf(), seed: 5, train: 12, val: 6, imgsz: 160, ..Default::default() };
    let data = DataConfig::load(&generate(&cfg).expect("generate").data_yaml).expect("data.yaml");
    let opts = IndexOptions { cache: false, find_orphans: false };
    let train = data.index(Split::Train, &opts).expect("train index").index;
    let val = data.index(Split::Val, &opts).expect("val index").index;
    (train, val)
}

fn plain(index: &SampleIndex, augment: bool, budget: usize) -> DecodedSource {
    DecodedSource::open(&SourceKind::Files, index.clone(), IMGSZ, augment, budget).expect("source")
}

/// The disk-cached source of `index` with its file at `path`, and how the file came about.
fn disk(index: &SampleIndex, augment: bool, path: &Path) -> (DecodedSource, CacheFile) {
    let src = plain(index, augment, 0);
    let (cache, how) = src.open_or_build_disk_cache(path, &mut |_, _| {}).expect("open or build");
    (src.with_node_cache(cache).expect("attach"), how)
}

fn cache_path(index: &SampleIndex, augment: bool) -> PathBuf {
    disk_cache_path(index, IMGSZ, augment, None).expect("a non-empty split has a cache path")
}

/// Every sample through `a` and `b` is the same image with the same labels.
fn assert_same_images(a: &DecodedSource, b: &DecodedSource) {
    for id in 0..a.index().len() as u64 {
        let (x, y) = (a.get(id).expect("a"), b.get(id).expect("b"));
        assert_eq!(x.image, y.image, "sample {id}: pixels differ");
        assert_eq!(x.labels, y.labels, "sample {id}: labels differ");
    }
}

/// One delivered batch, flattened: (batch index, pixels, targets as bits, sample ids).
type Flat = (u64, Vec<u8>, Vec<[u32; 6]>, Vec<u64>);

fn flat(b: &sluice_core::Batch) -> Flat {
    let t = b.targets.iter().map(|t| {
        [t.image, t.class, t.bbox.x1.to_bits(), t.bbox.y1.to_bits(), t.bbox.x2.to_bits(), t.bbox.y2.to_bits()]
    });
    (b.index, b.pixels().to_vec(), t.collect(), b.sample_ids.clone())
}

fn train_epoch(loader: &TrainLoader, epoch: u32) -> Vec<Flat> {
    loader.epoch(epoch, 3).map(|b| flat(&b.expect("batch"))).collect()
}

fn val_pass(loader: &ValLoader) -> Vec<Flat> {
    loader.pass().map(|b| flat(&b.expect("batch"))).collect()
}

fn config() -> LoaderConfig {
    LoaderConfig { workers: 2, ..LoaderConfig::new(IMGSZ, 4, 17) }
}

#[test]
fn disk_batches_equal_ram_batches_and_read_the_map_in_place() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, val) = dataset(dir.path());
    let (train_path, val_path) = (cache_path(&train, true), cache_path(&val, false));
    assert_ne!(train_path, val_path, "each split and resize mode has its own file");

    let ram = TrainLoader::new(Arc::new(plain(&train, true, RAM_CACHE_BYTES)), config(), Hyp::default()).expect("ram");
    let (src, how) = disk(&train, true, &train_path);
    assert_eq!(how, CacheFile::Built { replaced: None });
    assert!(train_path.is_file(), "{} written beside the label cache", train_path.display());
    assert!(src.get(0).expect("sample 0").image.is_shared(), "a hit reads the mapped bytes, not a copy");
    let on_disk = TrainLoader::new(Arc::new(src), config(), Hyp::default()).expect("disk");
    for epoch in 0..2 {
        let want = train_epoch(&ram, epoch);
        assert!(want.iter().any(|(_, _, t, _)| !t.is_empty()), "mosaics carry boxes");
        assert_eq!(train_epoch(&on_disk, epoch), want, "epoch {epoch}: disk vs ram");
    }
    let stats = on_disk.source().stats();
    assert_eq!(stats.misses, 0, "every image came from the file");
    assert!(stats.hits >= 2 * 12, "{stats:?}");
    assert_eq!((stats.node_cache_images, stats.cached_images, stats.cached_bytes), (12, 0, 0));
    assert_eq!(stats.node_cache_bytes, 12 * (IMGSZ * IMGSZ * 3) as usize);
    // Each batch asked for exactly the rows its samples' augmentation reads, and no whole images.
    let (mut want, mut whole) = (0u64, 0u64);
    for epoch in 0..2 {
        for (_, recipe) in on_disk.recipes(epoch, 3) {
            TrainAugment
                .source_rows(&recipe, on_disk.source(), &mut |id, rows| {
                    let img = on_disk.source().get(id).expect("image");
                    let len = img.image.as_bytes().len();
                    let (a, b) = (rows.start as usize * img.image.stride(), rows.end as usize * img.image.stride());
                    want += (b.min(len) - a) as u64;
                    whole += len as u64;
                })
                .expect("rows");
        }
    }
    assert!(want > 0 && want < whole, "rows asked {want} of {whole} bytes");
    assert_eq!(stats.prefetch_bytes, want, "bytes asked to be read ahead");
    assert_eq!(ram.source().stats().prefetch_bytes, 0, "nothing to read ahead in memory");

    let ram_val = ValLoader::new(Arc::new(plain(&val, false, RAM_CACHE_BYTES)), config());
    let (src, _) = disk(&val, false, &val_path);
    let disk_val = ValLoader::new(Arc::new(src), config());
    assert_eq!(val_pass(&disk_val), val_pass(&ram_val), "validation: disk vs ram");
    let val_bytes = (0..val.len() as u64).map(|id| disk_val.source().get(id).expect("image").image.as_bytes().len());
    assert_eq!(disk_val.source().stats().prefetch_bytes, val_bytes.sum::<usize>() as u64, "each whole image once");

    // A folder named for the cache is made when missing.
    let elsewhere = disk_cache_path(&train, IMGSZ, true, Some(&dir.path().join("new/cache"))).expect("path");
    let (src, how) = disk(&train, true, &elsewhere);
    assert_eq!((how, src.stats().node_cache_images), (CacheFile::Built { replaced: None }, 12));

    // A later run reuses the file.
    let (again, how) = disk(&train, true, &train_path);
    assert_eq!(how, CacheFile::Reused);
    assert_same_images(&plain(&train, true, 0), &again);
}

#[test]
fn a_killed_build_is_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, _) = dataset(dir.path());
    let path = cache_path(&train, true);
    let whole = dir.path().join("whole.bin");
    let src = plain(&train, true, 0);
    NodeCache::build(&whole, &src, src.node_cache_key(), usize::MAX).expect("build");
    let bytes = std::fs::read(&whole).expect("read");

    // A build killed before its rename leaves a temporary file beside the cache and nothing under its name. The
    // next build removes it once it has gone unmodified long enough that no live build can own it.
    let name = path.file_name().expect("name").to_string_lossy().into_owned();
    let stray = path.with_file_name(format!(".{name}.killed.tmp"));
    let live = path.with_file_name(format!(".{name}.live.tmp"));
    for p in [&stray, &live] {
        std::fs::write(p, &bytes[..bytes.len() / 2]).expect("stray");
    }
    let old = SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&stray).and_then(|f| f.set_modified(old)).expect("mtime");
    let (cached, how) = disk(&train, true, &path);
    assert_eq!(how, CacheFile::Built { replaced: None });
    assert_same_images(&plain(&train, true, 0), &cached);
    assert!(!stray.exists(), "the leftover of a killed build is removed");
    assert!(live.exists(), "a temporary file written recently may be another build's");

    // A file written in place and cut short under the final name (another tool, a copy interrupted).
    for cut in [bytes.len() / 2, 100, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..cut]).expect("partial");
        let (cached, how) = disk(&train, true, &path);
        let CacheFile::Built { replaced: Some(why) } = how else { panic!("cut at {cut}: {how:?}") };
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert_same_images(&plain(&train, true, 0), &cached);
    }
}

#[test]
fn a_changed_image_is_decoded_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, _) = dataset(dir.path());
    let path = cache_path(&train, true);
    let (before, _) = disk(&train, true, &path);
    let old = before.get(0).expect("sample 0").image.clone();
    drop(before);

    // Sample 0's file now holds sample 1's image (same size in bytes), written later.
    let (img0, img1) = (&train.samples[0].image, &train.samples[1].image);
    std::fs::copy(img1, img0).expect("rewrite");
    let later = SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options().write(true).open(img0).and_then(|f| f.set_modified(later)).expect("mtime");

    let (after, how) = disk(&train, true, &path);
    let CacheFile::Built { replaced: Some(why) } = how else { panic!("not rebuilt: {how:?}") };
    assert!(why.contains("key"), "{why}");
    let new = after.get(0).expect("sample 0").image.clone();
    assert_ne!(new, old, "the cached image follows the file");
    assert_eq!(new, plain(&train, true, 0).get(0).expect("fresh").image);
}

#[test]
fn a_truncated_or_damaged_file_is_rejected_and_rebuilt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, _) = dataset(dir.path());
    let path = cache_path(&train, true);
    let key = plain(&train, true, 0).node_cache_key();
    drop(disk(&train, true, &path));
    let bytes = std::fs::read(&path).expect("read");

    // The last pixel byte gone: the length no longer matches the header.
    std::fs::write(&path, &bytes[..bytes.len() - 1]).expect("truncate");
    let err = NodeCache::open(&path, key).expect_err("truncated").to_string();
    assert!(err.contains(&path.display().to_string()) && err.contains("truncated"), "{err}");
    let (cached, how) = disk(&train, true, &path);
    assert!(matches!(how, CacheFile::Built { replaced: Some(_) }), "{how:?}");
    assert_same_images(&plain(&train, true, 0), &cached);
    assert_eq!(std::fs::read(&path).expect("read"), bytes, "rebuilt to the same bytes");

    // One table byte changed (sample 0's original width, which only scales its labels): the checksum no longer
    // matches.
    let mut damaged = bytes.clone();
    damaged[64 + 32] ^= 0x01;
    std::fs::write(&path, &damaged).expect("damage");
    let err = NodeCache::open(&path, key).expect_err("damaged").to_string();
    assert!(err.contains("checksum"), "{err}");
    let (cached, how) = disk(&train, true, &path);
    assert!(matches!(how, CacheFile::Built { replaced: Some(_) }), "{how:?}");
    assert_same_images(&plain(&train, true, 0), &cached);
}

#[test]
fn a_bad_image_is_absent_and_fails_as_without_a_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, _) = dataset(dir.path());
    let bad = &train.samples[3].image;
    std::fs::write(bad, b"\xff\xd8\xff\xe0 not really a jpeg").expect("corrupt");
    let (cached, _) = disk(&train, true, &cache_path(&train, true));
    assert_eq!(cached.node_cache().map(NodeCache::images), Some(11));
    let err = cached.get(3).expect_err("a bad image").to_string();
    assert!(err.contains(&bad.display().to_string()), "{err}");
    assert!(cached.get(4).is_ok());
    assert_eq!((cached.stats().hits, cached.stats().misses), (1, 1));
}

#[test]
fn reading_ahead_counts_only_rows_the_file_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (train, _) = dataset(dir.path());
    let (src, _) = disk(&train, true, &cache_path(&train, true));
    let node = src.node_cache().expect("node cache");
    let stride = src.get(0).expect("sample 0").image.stride() as u64;
    let asked = |f: &dyn Fn()| {
        let before = node.prefetched_bytes();
        f();
        node.prefetched_bytes() - before
    };
    assert_eq!(asked(&|| node.prefetch(0, 10..20)), 10 * stride);
    // Rows past the image are cut at its last row; empty ranges, and samples the file lacks, ask for nothing.
    assert_eq!(asked(&|| node.prefetch(1, IMGSZ - 3..IMGSZ + 50)), 3 * stride);
    assert_eq!(asked(&|| node.prefetch(2, 7..7)), 0);
    assert_eq!(asked(&|| node.prefetch(2, IMGSZ + 1..IMGSZ + 9)), 0);
    assert_eq!(asked(&|| node.prefetch(train.len() as u64, 0..4)), 0);
    // Waiting for rows reads them in place, past the image and for absent samples too, without a fault.
    for (id, rows) in [(0, 0..IMGSZ), (1, IMGSZ - 1..u32::MAX), (2, 5..5), (train.len() as u64, 0..4)] {
        node.fault_in(id, rows.clone());
        src.fault_in(id, rows);
    }
    assert_same_images(&plain(&train, true, 0), &src);
}
