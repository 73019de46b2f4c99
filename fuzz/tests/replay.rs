//! Replays every file of `corpus/<target>/` (the committed `seed_*` files and whatever a local fuzzing run added)
//! and of `regressions/<target>/` (minimised inputs of fixed findings) through the target functions the fuzzer
//! runs. Stable Rust, no libFuzzer: `cargo test` in `fuzz/`.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for dir in [root.join("corpus").join(target), root.join("regressions").join(target)] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        let mut files: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_file()).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).expect("read a corpus file");
            eprintln!("{target}: {}", f.display());
            run(&data);
            n += 1;
        }
    }
    assert!(n > 0, "no corpus for {target}");
}

#[test]
fn yolo_labels() {
    replay("yolo_labels", sluice_fuzz::yolo_labels);
}

#[test]
fn packed_reader() {
    replay("packed_reader", sluice_fuzz::packed_reader);
}

#[test]
fn decode() {
    replay("decode", sluice_fuzz::decode);
}

#[test]
fn read_header() {
    replay("read_header", sluice_fuzz::read_header);
}

#[test]
fn data_yaml() {
    replay("data_yaml", sluice_fuzz::data_yaml);
}

#[test]
fn label_cache() {
    replay("label_cache", sluice_fuzz::label_cache);
}

#[test]
fn coco_json() {
    replay("coco_json", sluice_fuzz::coco_json);
}

#[test]
fn pt_checkpoint() {
    replay("pt_checkpoint", sluice_fuzz::pt_checkpoint);
}

/// The harness's repairs really produce a shard the reader accepts, so the fuzzer gets past the checksums.
#[test]
fn fixups_make_valid_shards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let valid = std::fs::read(root.join("corpus/packed_reader/seed_valid_4")).expect("seed");
    let mut damaged = valid.clone();
    damaged[0] = 0x0f;
    damaged[1..9].copy_from_slice(b"XXXXXXXX"); // magic
    damaged[1 + 49] ^= 0xff; // index checksum
    damaged[1 + 61] ^= 0xff; // header checksum
    assert_eq!(sluice_fuzz::shard_bytes(&damaged), valid[1..]);
}

/// The valid cache seeds decode (so the fuzzer starts past the header and checksum), with and without the
/// harness writing the header.
#[test]
fn cache_seeds_decode() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for seed in ["seed_valid_nc4", "seed_valid_nc4_fixheader"] {
        let data = std::fs::read(root.join("corpus/label_cache").join(seed)).expect("seed");
        let (bytes, nc) = sluice_fuzz::cache_bytes(&data);
        assert_eq!(nc, 4);
        let got = sluice_dataset::cache::decode(&bytes, Path::new("t.cache"), nc).expect(seed);
        assert_eq!(got.len(), 2, "{seed}");
    }
}
