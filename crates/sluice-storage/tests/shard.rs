//! Shard round trips and damage: every truncation and corruption is refused on open or reported with the record
//! id on read — never a panic, never bytes that were not written.

use std::path::Path;

use sluice_core::Reader;
use sluice_storage::{PackedReader, ShardWriter, StorageError, Verify, pack_files};

fn records() -> Vec<(String, Vec<u8>, Vec<u8>)> {
    (0..20u8)
        .map(|i| {
            let image: Vec<u8> =
                (0..(i as usize * 97 + 1)).map(|k| (k as u8).wrapping_mul(i).wrapping_add(3)).collect();
            (format!("images/{i:03}.jpg"), image, vec![i; i as usize % 5])
        })
        .collect()
}

fn write(path: &Path) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let recs = records();
    let mut w = ShardWriter::create(path).expect("create");
    for (name, image, labels) in &recs {
        w.add(name, image, labels).expect("add");
    }
    let summary = w.finish().expect("finish");
    assert_eq!(summary.records, recs.len() as u64);
    assert_eq!(summary.file_bytes, std::fs::metadata(path).expect("meta").len());
    recs
}

#[test]
fn round_trip_serves_slices_of_the_map() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("train.sluice");
    let recs = write(&path);
    let reader = PackedReader::open(&path).expect("open");
    assert_eq!(reader.len(), recs.len());
    let mut scratch = Vec::new();
    for (id, (name, image, labels)) in recs.iter().enumerate() {
        let r = reader.record(id as u64).expect("record");
        assert_eq!((r.name, r.image, r.labels), (name.as_str(), image.as_slice(), labels.as_slice()));
        let bytes = reader.read(id as u64, &mut scratch).expect("read");
        assert_eq!(bytes, image.as_slice());
        assert!(scratch.is_empty(), "no copy into scratch");
        assert!(reader.verify_all().is_empty());
    }
    let err = reader.read(20, &mut scratch).expect_err("out of range").to_string();
    assert!(err.contains("sample 20 out of range") && err.contains("train.sluice"), "{err}");
    // No temporary file is left next to the shard.
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 1);
}

#[test]
fn empty_shard_is_valid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("empty.sluice");
    ShardWriter::create(&path).expect("create").finish().expect("finish");
    let reader = PackedReader::open(&path).expect("open");
    assert!(reader.is_empty());
}

#[test]
fn every_truncation_is_refused_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.sluice");
    write(&path);
    let full = std::fs::read(&path).expect("read");
    let cut_path = dir.path().join("cut.sluice");
    let index_offset = u64::from_le_bytes(full[24..32].try_into().expect("8 bytes")) as usize;
    let edges = [1, 63, 64, 65, index_offset - 1, index_offset, index_offset + 1, full.len() - 1];
    for cut in (0..full.len()).step_by(53).chain(edges) {
        std::fs::write(&cut_path, &full[..cut]).expect("write");
        let err = PackedReader::open(&cut_path).expect_err("truncated shard must be refused");
        let msg = err.to_string();
        assert!(msg.contains("cut.sluice") && msg.contains("not a valid sluice shard"), "cut {cut}: {msg}");
    }
    let mut longer = full.clone();
    longer.extend_from_slice(b"junk");
    std::fs::write(&cut_path, &longer).expect("write");
    assert!(PackedReader::open(&cut_path).expect_err("trailing bytes").to_string().contains("unexpected bytes"));
}

#[test]
fn corrupt_records_are_reported_with_their_id_and_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.sluice");
    let recs = write(&path);
    let mut bytes = std::fs::read(&path).expect("read");
    // Record 7 starts after the 64-byte header and the records before it.
    let offset = 64 + recs[..7].iter().map(|(_, i, l)| i.len() + l.len()).sum::<usize>();
    bytes[offset + 10] ^= 0xff;
    std::fs::write(&path, &bytes).expect("write");
    let reader = PackedReader::open(&path).expect("index intact");
    let mut scratch = Vec::new();
    assert!(reader.read(6, &mut scratch).is_ok());
    let err = reader.record(7).expect_err("corrupt");
    assert!(matches!(err, StorageError::CorruptRecord { id: 7, .. }), "{err}");
    assert!(err.to_string().contains("images/007.jpg"), "{err}");
    let bad = reader.verify_all();
    assert_eq!(bad.len(), 1);
    // With verification off the bytes are served as they are (the caller chose to trust the shard).
    let trusting = PackedReader::open(&path).expect("open").with_verify(Verify::Never);
    assert_eq!(trusting.image(7).expect("unchecked").len(), recs[7].1.len());
}

#[test]
fn corrupt_header_and_index_bytes_are_refused_on_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("s.sluice");
    write(&path);
    let full = std::fs::read(&path).expect("read");
    let index_offset = u64::from_le_bytes(full[24..32].try_into().expect("8 bytes")) as usize;
    let bad_path = dir.path().join("bad.sluice");
    // Every header byte and every third byte of the index and names.
    for at in (0..64).chain((index_offset..full.len()).step_by(3)) {
        let mut b = full.clone();
        b[at] ^= 0x41;
        std::fs::write(&bad_path, &b).expect("write");
        let msg = PackedReader::open(&bad_path).expect_err("corrupt metadata").to_string();
        assert!(msg.contains("not a valid sluice shard"), "byte {at}: {msg}");
    }
}

#[test]
fn pack_files_is_atomic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a.jpg");
    std::fs::write(&a, b"\xff\xd8\xff fake jpeg a").expect("write");
    let out = dir.path().join("out.sluice");
    let summary = pack_files(vec![(a.clone(), b"labels a".to_vec())], &out).expect("pack");
    assert_eq!((summary.records, summary.label_bytes), (1, 8));
    let reader = PackedReader::open(&out).expect("open");
    assert_eq!(reader.image(0).expect("image"), b"\xff\xd8\xff fake jpeg a");
    assert_eq!(reader.name(0).expect("name"), a.to_string_lossy());
    drop(reader);
    // A missing image fails the pack, names the file, and leaves the previous shard untouched.
    let missing = dir.path().join("missing.jpg");
    let err = pack_files(vec![(a, Vec::new()), (missing, Vec::new())], &out).expect_err("missing").to_string();
    assert!(err.contains("missing.jpg"), "{err}");
    assert_eq!(PackedReader::open(&out).expect("old shard").len(), 1);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("dir")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}
