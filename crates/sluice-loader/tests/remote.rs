//! A dataset whose splits are shards in object storage (`path: s3://bucket/ds`, `train: train.sluice`): indexed
//! and decoded exactly as the same shards on local disk, from one local copy per split that a second load reuses;
//! a URL split that is not a shard is an error naming it; without the `object-store` feature a URL split is an
//! error that says how to build one that reads it.

use std::path::Path;

use sluice_dataset::synth::{SynthConfig, generate};
use sluice_dataset::{DataConfig, IndexOptions, Split};
use sluice_loader::load_split;

const OPTS: IndexOptions = IndexOptions { cache: false, find_orphans: false };

/// A generated dataset; returns its data.yaml.
fn dataset(dir: &Path) -> std::path::PathBuf {
    let cfg = SynthConfig { out: dir.to_path_buf(), seed: 3, train: 10, val: 5, imgsz: 96, ..Default::default() };
    generate(&cfg).expect("generate").data_yaml
}

/// A data.yaml naming `train`/`val` under `path`, with the names of `like`.
fn yaml_at(dir: &Path, path: &str, train: &str, like: &Path) -> std::path::PathBuf {
    let names = DataConfig::load(like).expect("yaml").names;
    let y = dir.join("remote.yaml");
    let text = format!("path: {path}\ntrain: {train}\nval: val.sluice\nnames: {names:?}\n");
    std::fs::write(&y, text).expect("write yaml");
    y
}

#[cfg(not(feature = "object-store"))]
#[test]
fn without_the_feature_a_url_split_says_how_to_read_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let like = dataset(&dir.path().join("ds"));
    let y = yaml_at(dir.path(), "s3://bucket/ds", "train.sluice", &like);
    let err = load_split(&y, Split::Train, &OPTS, true).expect_err("no object storage").to_string();
    assert!(err.contains("s3://bucket/ds/train.sluice") && err.contains("`object-store` feature"), "{err}");
    assert!(err.contains("remote.yaml") && err.contains("train split"), "{err}");
}

#[cfg(feature = "object-store")]
#[test]
fn shards_in_object_storage_load_as_the_local_shards_do() {
    use sluice_core::ImageSource;
    use sluice_loader::{DecodedSource, RemoteConfig, load_split_observed, load_split_with, pack_index};
    use sluice_testkit::s3::MotoServer;

    let Some(server) = MotoServer::start("sluice-loader") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let like = dataset(&dir.path().join("ds"));
    for (split, name) in [(Split::Train, "train"), (Split::Val, "val")] {
        let local = load_split(&like, split, &OPTS, true).expect("local split");
        let shard = dir.path().join(format!("{name}.sluice"));
        pack_index(local.index(), &shard).expect("pack");
        server.put(&format!("ds/{name}.sluice"), &std::fs::read(&shard).expect("shard"));
    }
    let y = yaml_at(dir.path(), &server.url("ds"), "train.sluice", &like);
    let cache = dir.path().join("copies");
    let remote = RemoteConfig { cache_dir: Some(cache.clone()), settings: server.settings() };
    for (split, name) in [(Split::Train, "train"), (Split::Val, "val")] {
        let mut arrived = Vec::new();
        let from_store = load_split_observed(&y, split, &OPTS, true, &remote, &mut |url, done, total| {
            arrived.push((url.to_string(), done, total))
        })
        .expect("staged split");
        let sluice_loader::SourceKind::Packed(copy) = &from_store.source else { panic!("a shard") };
        assert!(copy.starts_with(&cache), "{}", copy.display());
        let shard = dir.path().join(format!("{name}.sluice"));
        assert_eq!(std::fs::read(copy).expect("copy"), std::fs::read(&shard).expect("shard"));
        // The copy's progress names the object and counts its bytes to the end.
        let size = std::fs::metadata(&shard).expect("shard").len();
        let url = server.url(&format!("ds/{name}.sluice"));
        assert!(arrived.iter().all(|(u, _, total)| *u == url && *total == size), "{arrived:?}");
        assert!(arrived.windows(2).all(|w| w[0].1 <= w[1].1), "{arrived:?}");
        assert_eq!(arrived.last().map(|a| a.1), Some(size), "{arrived:?}");
        let direct = sluice_loader::split::index_shard(&shard, &from_store.config.names).expect("local index");
        assert_eq!(from_store.index().samples, direct.index.samples, "{name}: the same samples");
        let a = DecodedSource::open(&from_store.source, from_store.index().clone(), 64, false, 0).expect("source");
        let b =
            DecodedSource::open(&sluice_loader::SourceKind::Packed(shard), direct.index, 64, false, 0).expect("source");
        for id in 0..a.index().len() as u64 {
            let (x, y) = (a.get(id).expect("remote sample"), b.get(id).expect("local sample"));
            assert_eq!((&x.image, &x.labels), (&y.image, &y.labels), "{name} sample {id}");
        }
        // A second load reuses the copy and fetches nothing.
        let again = load_split_observed(&y, split, &OPTS, true, &remote, &mut |url, _, _| panic!("fetched {url}"))
            .expect("again");
        assert_eq!(again.source, from_store.source);
    }
    assert_eq!(std::fs::read_dir(&cache).expect("copies").count(), 2, "one copy per split");

    let folder = yaml_at(dir.path(), &server.url("ds"), "images/train", &like);
    let err = load_split_with(&folder, Split::Train, &OPTS, true, &remote).expect_err("a folder").to_string();
    assert!(err.contains("/ds/images/train") && err.contains("`sluice pack`"), "{err}");
}
