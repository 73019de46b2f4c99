//! Shards staged from an S3-compatible store (a local moto server, see `sluice_testkit::s3`): the local copy is
//! the object byte for byte, reused while the object is unchanged and fetched again when it is rewritten; a missing
//! object and an object that is not a shard are errors naming the object, and leave no shard behind; a server that
//! stops in the middle of a copy is retried with back-off and then named in the error, and no partial copy stays.
#![cfg(feature = "object-store")]

use std::path::Path;
use std::time::Duration;

use sluice_storage::remote::{RemoteOptions, Retry, stage_shard};
use sluice_storage::{PackedReader, ShardWriter};
use sluice_testkit::s3::MotoServer;

fn shard_bytes(dir: &Path, records: u8, salt: u8) -> Vec<u8> {
    let path = dir.join(format!("src-{records}-{salt}.sluice"));
    let mut w = ShardWriter::create(&path).expect("create");
    for i in 0..records {
        let image: Vec<u8> =
            (0..(i as usize * 301 + 7)).map(|k| (k as u8).wrapping_mul(i ^ salt).wrapping_add(1)).collect();
        w.add(&format!("images/{i:03}.jpg"), &image, &[i, salt]).expect("add");
    }
    w.finish().expect("finish");
    std::fs::read(&path).expect("read")
}

/// Small ranges, several in flight: the object arrives in many pieces, out of order.
fn opts(server: &MotoServer) -> RemoteOptions {
    RemoteOptions { settings: server.settings(), parallel: 4, chunk_bytes: 1000, retry: Retry::default() }
}

fn shards_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_shard_is_staged_byte_for_byte_and_reused_until_rewritten() {
    let Some(server) = MotoServer::start("sluice-stage") else { return };
    let src = tempfile::tempdir().expect("tempdir");
    let original = shard_bytes(src.path(), 40, 1);
    assert!(original.len() > 100_000, "many ranges: {} bytes", original.len());
    server.put("coco/train.sluice", &original);

    let cache = tempfile::tempdir().expect("tempdir");
    let mut calls = Vec::new();
    let url = server.url("coco/train.sluice");
    let first =
        stage_shard(&url, cache.path(), &opts(&server), &mut |done, total| calls.push((done, total))).expect("staged");
    assert_eq!((first.bytes, first.fetched), (original.len() as u64, original.len() as u64));
    assert_eq!(std::fs::read(&first.path).expect("copy"), original);
    assert_eq!(calls.last(), Some(&(original.len() as u64, original.len() as u64)));
    assert_eq!(calls.len(), original.len().div_ceil(1000));
    let reader = PackedReader::open(&first.path).expect("a shard");
    assert_eq!(reader.records(), 40);
    assert!(reader.verify_all().is_empty());
    assert_eq!(shards_in(cache.path()).len(), 1, "no temporary file left: {:?}", shards_in(cache.path()));

    let again =
        stage_shard(&url, cache.path(), &opts(&server), &mut |_, _| panic!("nothing is fetched")).expect("reused");
    assert_eq!((again.path.as_path(), again.fetched), (first.path.as_path(), 0));

    let rewritten = shard_bytes(src.path(), 41, 2);
    server.put("coco/train.sluice", &rewritten);
    let third = stage_shard(&url, cache.path(), &opts(&server), &mut |_, _| {}).expect("fetched again");
    assert_ne!(third.path, first.path);
    assert_eq!(third.fetched, rewritten.len() as u64);
    assert_eq!(std::fs::read(&third.path).expect("copy"), rewritten);
}

#[test]
fn missing_and_foreign_objects_are_errors_naming_the_object() {
    let Some(server) = MotoServer::start("sluice-errors") else { return };
    let cache = tempfile::tempdir().expect("tempdir");
    let url = server.url("nowhere/train.sluice");
    let err = stage_shard(&url, cache.path(), &opts(&server), &mut |_, _| {}).expect_err("missing").to_string();
    assert!(err.starts_with(&url) && err.to_lowercase().contains("not found"), "{err}");

    server.put("junk/train.sluice", &[7u8; 5000]);
    let url = server.url("junk/train.sluice");
    let err = stage_shard(&url, cache.path(), &opts(&server), &mut |_, _| {}).expect_err("not a shard").to_string();
    assert!(err.starts_with(&url) && err.contains("not a valid sluice shard") && err.contains("wrong magic"), "{err}");
    assert!(shards_in(cache.path()).is_empty(), "nothing left behind: {:?}", shards_in(cache.path()));

    let err = stage_shard("s3://", cache.path(), &opts(&server), &mut |_, _| {}).expect_err("bad url").to_string();
    assert!(err.starts_with("s3://"), "{err}");
}

#[test]
fn a_server_stopped_mid_copy_is_retried_then_named_and_leaves_no_copy() {
    let Some(mut server) = MotoServer::start("sluice-stopped") else { return };
    let src = tempfile::tempdir().expect("tempdir");
    let original = shard_bytes(src.path(), 40, 3);
    server.put("coco/train.sluice", &original);
    let cache = tempfile::tempdir().expect("tempdir");
    let url = server.url("coco/train.sluice");
    // Short waits so that the retries are over in well under a second.
    let retry = Retry {
        max_retries: 3,
        timeout: Duration::from_secs(60),
        first_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
    };
    let opts = RemoteOptions { settings: server.settings(), parallel: 1, chunk_bytes: 1000, retry };
    let mut arrived = Vec::new();
    let err = stage_shard(&url, cache.path(), &opts, &mut |done, _| {
        arrived.push(done);
        if arrived.len() == 3 {
            server.stop();
        }
    })
    .expect_err("the server is gone")
    .to_string();
    assert_eq!(arrived, [1000, 2000, 3000], "nothing arrives once the server is stopped");
    assert!(err.starts_with(&url) && err.contains("bytes 3000..4000"), "names the object and the range: {err}");
    assert!(err.contains("after 3 retries"), "retried as configured: {err}");
    assert!(shards_in(cache.path()).is_empty(), "no partial copy left: {:?}", shards_in(cache.path()));
}
