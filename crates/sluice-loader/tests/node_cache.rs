//! The node cache on small generated datasets: images served from it equal a fresh decode bit for bit (pixels and
//! labels), a budget keeps an in-order prefix and the rest decodes as without it, an image that fails to decode
//! still fails naming its file, a wrong key or a damaged file is an error naming the file, and two processes that
//! map it hold one copy between them (measured with their proportional set sizes).

use std::path::{Path, PathBuf};

use sluice_core::ImageSource;
use sluice_dataset::synth::{SynthConfig, generate};
use sluice_dataset::{DataConfig, IndexOptions, SampleIndex, Split};
use sluice_loader::{DecodedSource, NodeCache, SourceKind};

/// Smaller than the generated side, so decoding resizes and the labels are scaled.
const IMGSZ: u32 = 192;

/// Generates `n` square images of `side` px under `dir` and returns the `data.yaml`.
fn generate_dataset(dir: &Path, n: usize, side: u32) -> PathBuf {
    let cfg = SynthConfig { out: dir.to_path_buf(), seed: 7, train: n, val: 0, imgsz: side, ..Default::default() };
    generate(&cfg).expect("generate").data_yaml
}

fn train_index(data_yaml: &Path) -> SampleIndex {
    let data = DataConfig::load(data_yaml).expect("data.yaml");
    // No label cache: the child processes index the same split at the same time.
    let opts = IndexOptions { cache: false, find_orphans: false };
    data.index(Split::Train, &opts).expect("train index").index
}

fn source(index: &SampleIndex, imgsz: u32, augment: bool) -> DecodedSource {
    DecodedSource::open(&SourceKind::Files, index.clone(), imgsz, augment, 0).expect("source")
}

/// Every sample through `a` and `b` is the same image with the same labels.
fn assert_same_images(a: &DecodedSource, b: &DecodedSource) {
    for id in 0..a.index().len() as u64 {
        let (x, y) = (a.get(id).expect("plain"), b.get(id).expect("node cached"));
        assert_eq!(x.image, y.image, "sample {id}: pixels differ");
        assert_eq!(x.labels, y.labels, "sample {id}: labels differ");
    }
}

#[test]
fn images_from_the_node_cache_equal_a_fresh_decode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let index = train_index(&generate_dataset(&dir.path().join("data"), 16, 256));
    let path = dir.path().join("node.bin");
    let built = source(&index, IMGSZ, false).build_node_cache(&path, usize::MAX).expect("build");
    assert_eq!((built.samples(), built.images()), (16, 16));
    assert_eq!(built.len(), 16 * (IMGSZ * IMGSZ * 3) as usize);
    assert!(built.file_len() > built.len());
    drop(built);

    let plain = source(&index, IMGSZ, false);
    let key = plain.node_cache_key();
    assert_eq!(source(&index, IMGSZ, false).node_cache_key(), key, "the key is the same for every source");
    let opened = NodeCache::open(&path, key).expect("open");
    let cached = source(&index, IMGSZ, false).with_node_cache(opened).expect("attach");
    assert_same_images(&plain, &cached);
    let stats = cached.stats();
    assert_eq!((stats.hits, stats.misses), (16, 0));
    assert_eq!((stats.cached_images, stats.cached_bytes, stats.budget_bytes), (0, 0, 0));
    assert_eq!((stats.node_cache_images, stats.node_cache_bytes), (16, 16 * (IMGSZ * IMGSZ * 3) as usize));

    // The key covers the settings: a cache for validation-style resizing or another size does not attach.
    for (imgsz, augment) in [(IMGSZ, true), (IMGSZ + 32, false)] {
        let other = source(&index, imgsz, augment);
        assert_ne!(other.node_cache_key(), key);
        let opened = NodeCache::open(&path, key).expect("open");
        let err = other.with_node_cache(opened).expect_err("another key").to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}

#[test]
fn a_budget_keeps_a_prefix_and_the_rest_decodes_as_without_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let index = train_index(&generate_dataset(&dir.path().join("data"), 16, 256));
    let image_bytes = (IMGSZ * IMGSZ * 3) as usize;
    let budget = 3 * image_bytes + image_bytes / 2;
    let cached = source(&index, IMGSZ, false);
    let node = cached.build_node_cache(&dir.path().join("node.bin"), budget).expect("build");
    assert_eq!(node.images(), 3);
    assert!(node.len() <= budget);
    assert!((0..16).all(|id| node.get(id).is_some() == (id < 3)));
    assert!(node.get(16).is_none());
    let cached = cached.with_node_cache(node).expect("attach");

    let plain = source(&index, IMGSZ, false);
    assert_same_images(&plain, &cached);
    assert_same_images(&plain, &cached);
    let stats = cached.stats();
    // Images outside the node cache are decoded on every use: the private cache is off.
    assert_eq!((stats.hits, stats.misses), (6, 26));
    assert_eq!((stats.cached_images, stats.node_cache_images, stats.node_cache_bytes), (0, 3, 3 * image_bytes));

    let empty = source(&index, IMGSZ, false).build_node_cache(&dir.path().join("empty.bin"), 0).expect("build");
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
}

#[test]
fn an_image_that_fails_to_decode_is_absent_and_still_fails_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let index = train_index(&generate_dataset(&dir.path().join("data"), 6, 128));
    let broken = index.samples[2].image.clone();
    std::fs::write(&broken, b"not an image").expect("corrupt");
    let cached = source(&index, 96, false);
    let node = cached.build_node_cache(&dir.path().join("node.bin"), usize::MAX).expect("build");
    assert_eq!(node.images(), 5);
    assert!(node.get(2).is_none());
    let cached = cached.with_node_cache(node).expect("attach");
    let plain = source(&index, 96, false);
    for id in 0..6 {
        match (plain.get(id), cached.get(id)) {
            (Ok(a), Ok(b)) => assert_eq!((&a.image, &a.labels), (&b.image, &b.labels), "sample {id}"),
            (Err(a), Err(b)) => {
                assert_eq!(id, 2);
                assert_eq!(a.to_string(), b.to_string());
                assert!(b.to_string().contains(&broken.display().to_string()), "{b}");
            }
            (a, b) => panic!("sample {id}: plain {:?}, node cached {:?}", a.err(), b.err()),
        }
    }
}

#[test]
fn a_wrong_key_or_a_damaged_file_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let index = train_index(&generate_dataset(&dir.path().join("data"), 4, 128));
    let path = dir.path().join("node.bin");
    let src = source(&index, 96, false);
    let key = src.node_cache_key();
    drop(src.build_node_cache(&path, usize::MAX).expect("build"));
    let named = |p: &Path, key: u64| {
        let err = NodeCache::open(p, key).expect_err("must fail").to_string();
        assert!(err.contains(&p.display().to_string()), "{err}");
        err
    };

    let err = named(&path, key ^ 1);
    assert!(err.contains(&format!("{key:016x}")) && err.contains(&format!("{:016x}", key ^ 1)), "{err}");

    let bytes = std::fs::read(&path).expect("read");
    let damaged = dir.path().join("damaged.bin");
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("short header", bytes[..10].to_vec()),
        ("header only", bytes[..64].to_vec()),
        ("truncated pixels", bytes[..bytes.len() - 1].to_vec()),
        ("half", bytes[..bytes.len() / 2].to_vec()),
        ("garbage", (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
    ];
    let mut version = bytes.clone();
    version[8] ^= 0xff;
    cases.push(("version", version));
    let mut offset = bytes.clone();
    offset[64 + 40 + 5] = 0x7f; // The second entry's offset, far past the end.
    cases.push(("entry offset", offset));
    let mut count = bytes.clone();
    count[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    cases.push(("sample count", count));
    let mut held = bytes.clone();
    held[32] ^= 1;
    cases.push(("image count", held));
    for (what, content) in cases {
        std::fs::write(&damaged, &content).expect("write");
        let err = named(&damaged, key);
        eprintln!("{what}: {err}");
    }
    named(&dir.path().join("missing.bin"), key);
    // The undamaged file still opens.
    assert_eq!(NodeCache::open(&path, key).expect("open").images(), 4);
}

/// The environment variable that tells [`node_cache_child_process`] to act, holding the parent's folder.
#[cfg(target_os = "linux")]
const CHILD_ENV: &str = "SLUICE_NODE_CACHE_TEST_CHILD";
#[cfg(target_os = "linux")]
const CHILDREN: usize = 2;
#[cfg(target_os = "linux")]
const SHARED_IMGSZ: u32 = 640;

/// (Pss, Rss) of this process in bytes.
#[cfg(target_os = "linux")]
fn pss_rss() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").expect("smaps_rollup");
    let field = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
        let kb: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().expect("kB");
        kb * 1024
    };
    (field("Pss:"), field("Rss:"))
}

/// Marks `stage` done for child `me` under `dir` and waits until every child has.
#[cfg(target_os = "linux")]
fn barrier(dir: &Path, stage: &str, me: usize) {
    std::fs::write(dir.join(format!("{stage}-{me}")), b"").expect("barrier file");
    let t0 = std::time::Instant::now();
    while !(0..CHILDREN).all(|k| dir.join(format!("{stage}-{k}")).exists()) {
        assert!(t0.elapsed().as_secs() < 60, "barrier {stage}: the other child never came");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Run by [`two_processes_hold_one_copy`] as a child process (and a no-op otherwise): maps the node cache, reads
/// every image through the source, and prints its Pss and Rss before opening and after both children have read.
#[cfg(target_os = "linux")]
#[test]
fn node_cache_child_process() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else { return };
    let spec = spec.to_str().expect("utf-8").to_string();
    let (me, dir) = spec.split_once(':').expect("CHILD:DIR");
    let (me, dir): (usize, &Path) = (me.parse().expect("child number"), Path::new(dir));
    let index = train_index(&dir.join("data/data.yaml"));
    let src = source(&index, SHARED_IMGSZ, false);
    let key = src.node_cache_key();
    let before = pss_rss();
    let node = NodeCache::open(&dir.join("node.bin"), key).expect("open");
    let src = src.with_node_cache(node).expect("attach");
    let mut sum = 0u64;
    for id in 0..index.len() as u64 {
        let image = src.get(id).expect("get");
        sum = sum.wrapping_add(image.image.as_bytes().iter().step_by(4099).map(|&b| u64::from(b)).sum::<u64>());
    }
    let stats = src.stats();
    assert_eq!((stats.hits, stats.misses), (index.len() as u64, 0));
    barrier(dir, "read", me);
    let after = pss_rss();
    println!("NODE_CACHE_CHILD {me} {} {} {} {} {sum}", before.0, after.0, before.1, after.1);
    // Stay mapped until the other child has measured too, so each sees the pages shared.
    barrier(dir, "measured", me);
}

#[cfg(target_os = "linux")]
#[test]
fn two_processes_hold_one_copy() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let index = train_index(&generate_dataset(&dir.path().join("data"), 24, SHARED_IMGSZ));
    let node = source(&index, SHARED_IMGSZ, false).build_node_cache(&dir.path().join("node.bin"), usize::MAX);
    let size = node.expect("build").file_len() as f64;
    let exe = std::env::current_exe().expect("test binary");
    let children: Vec<_> = (0..CHILDREN)
        .map(|k| {
            std::process::Command::new(&exe)
                .args(["--exact", "node_cache_child_process", "--nocapture"])
                .env(CHILD_ENV, format!("{k}:{}", dir.path().display()))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let mut pss_sum = 0.0;
    for (k, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child {k}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = stdout.lines().find_map(|l| l.strip_prefix("NODE_CACHE_CHILD ")).expect("child's figures");
        let v: Vec<f64> = line.split(' ').map(|x| x.parse().expect("number")).collect();
        let (pss, rss) = (v[2] - v[1], v[4] - v[3]);
        eprintln!(
            "child {k}: Pss {:.1} -> {:.1} MiB (+{:.1}), Rss {:.1} -> {:.1} MiB (+{:.1}); cache file {:.1} MiB",
            v[1] / 1048576.0,
            v[2] / 1048576.0,
            pss / 1048576.0,
            v[3] / 1048576.0,
            v[4] / 1048576.0,
            rss / 1048576.0,
            size / 1048576.0
        );
        // Each child really touched the whole cache, so the Pss figure below cannot pass vacuously.
        assert!(rss >= 0.8 * size, "child {k}: Rss grew {rss} bytes for a {size}-byte cache");
        pss_sum += pss;
    }
    eprintln!(
        "Pss growth summed over {CHILDREN} children: {:.1} MiB = {:.2} x the cache",
        pss_sum / 1048576.0,
        pss_sum / size
    );
    assert!(pss_sum < 1.5 * size, "the children hold {pss_sum} bytes between them for a {size}-byte cache");
    assert!(pss_sum > 0.5 * size, "the children's Pss grew by only {pss_sum} bytes for a {size}-byte cache");
}
