//! `sluice train` on a dataset whose splits are shards in an S3-compatible store (a local moto server), reached
//! with the credentials and endpoint of the standard `AWS_*` variables, or of a profile of the AWS shared files:
//! the run is the run made from the same shards on local disk, to the digit; a second run reads no object again. Built with `--features object-store`.
#![cfg(feature = "object-store")]

use std::path::Path;
use std::process::{Command, Output};

use sluice_dataset::synth::{SynthConfig, generate};
use sluice_testkit::s3::MotoServer;

/// `sluice` with `args` and, of the `AWS_*` variables, only those of `env` (and no shared files of the user's).
fn sluice(args: &[&str], env: &[(String, String)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("AWS_")) {
        cmd.env_remove(k);
    }
    cmd.env("HOME", std::env::temp_dir().join("sluice-remote-test-no-home"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sluice")
}

fn ok(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn train(data: &Path, project: &Path, name: &str, cache_dir: &Path, env: &[(String, String)]) -> String {
    let (data, project, cache) = (data.to_str().expect("utf-8"), project.to_str().expect("utf-8"), cache_dir);
    let args = [
        "train",
        "--data",
        data,
        "--model",
        "yolov8n",
        "--epochs",
        "1",
        "--imgsz",
        "64",
        "--batch",
        "4",
        "--workers",
        "1",
        "--project",
        project,
        "--name",
        name,
        "--cache-dir",
        cache.to_str().expect("utf-8"),
    ];
    ok(sluice(&args, env))
}

/// The results table without its wall-clock column.
fn results(run: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(run.join("results.csv")).expect("results.csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').map(str::trim).collect();
    let keep: Vec<usize> = (0..header.len()).filter(|&i| header[i] != "time").collect();
    let pick = |l: &str| {
        let cells: Vec<&str> = l.split(',').collect();
        keep.iter().map(|&i| cells[i].trim()).collect::<Vec<_>>().join(",")
    };
    std::iter::once(pick(&header.join(","))).chain(lines.map(pick)).collect()
}

#[test]
fn training_from_object_storage_is_training_from_the_same_shards() {
    let Some(server) = MotoServer::start("sluice-train") else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 5, train: 8, val: 4, imgsz: 96, ..Default::default() };
    let data = generate(&synth).expect("generate").data_yaml;
    let names = std::fs::read_to_string(&data).expect("yaml");
    let names = names.lines().skip_while(|l| !l.starts_with("names:")).collect::<Vec<_>>().join("\n");
    for split in ["train", "val"] {
        let shard = dir.path().join(format!("{split}.sluice"));
        let (d, s) = (data.to_str().expect("utf-8"), shard.to_str().expect("utf-8"));
        ok(sluice(&["pack", "--data", d, "--split", split, "--out", s], &[]));
        server.put(&format!("coco/{split}.sluice"), &std::fs::read(&shard).expect("shard"));
    }
    let local = dir.path().join("local.yaml");
    std::fs::write(&local, format!("path: {}\ntrain: train.sluice\nval: val.sluice\n{names}\n", dir.path().display()))
        .expect("yaml");
    let remote = dir.path().join("remote.yaml");
    std::fs::write(&remote, format!("path: {}\ntrain: train.sluice\nval: val.sluice\n{names}\n", server.url("coco")))
        .expect("yaml");
    let env: Vec<(String, String)> = [
        ("AWS_ENDPOINT_URL", server.endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();

    let (project, copies) = (dir.path().join("runs"), dir.path().join("copies"));
    train(&local, &project, "local", &copies, &[]);
    let first = train(&remote, &project, "remote", &copies, &env);
    let url = server.url("coco/train.sluice");
    assert!(first.contains(&format!("train split: {url}: fetched")), "{first}");
    assert_eq!(results(&project.join("local")), results(&project.join("remote")));
    let staged: Vec<_> = std::fs::read_dir(&copies).expect("copies").map(|e| e.expect("entry").path()).collect();
    assert_eq!(staged.len(), 2, "one local copy per split: {staged:?}");
    for split in ["train", "val"] {
        let copy = staged.iter().find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(split)));
        let copy = copy.unwrap_or_else(|| panic!("no copy of {split}: {staged:?}"));
        assert_eq!(
            std::fs::read(copy).expect("copy"),
            std::fs::read(dir.path().join(format!("{split}.sluice"))).expect("shard")
        );
    }

    // A second run reuses the copies: nothing is fetched or rewritten.
    let stamps = |paths: &[std::path::PathBuf]| -> Vec<std::time::SystemTime> {
        paths.iter().map(|p| std::fs::metadata(p).and_then(|m| m.modified()).expect("mtime")).collect()
    };
    let before = stamps(&staged);
    let again = train(&remote, &project, "again", &copies, &env);
    assert!(
        again.contains(&format!("train split: {url}: the local copy")) && again.contains("nothing fetched"),
        "{again}"
    );
    assert_eq!(stamps(&staged), before);
    assert_eq!(std::fs::read_dir(&copies).expect("copies").count(), 2);

    // The same store reached through the AWS shared files alone (a profile's credentials, its region and endpoint),
    // with no AWS_* variable: a fresh copy is fetched and the run is the same.
    let aws = dir.path().join("aws");
    std::fs::create_dir_all(&aws).expect("mkdir");
    std::fs::write(aws.join("credentials"), "[lab]\naws_access_key_id = test\naws_secret_access_key = test\n")
        .expect("credentials");
    let config = format!("[profile lab]\nregion = us-east-1\nendpoint_url = {}\n", server.endpoint);
    std::fs::write(aws.join("config"), config).expect("config");
    let files: Vec<(String, String)> = [
        ("AWS_PROFILE", "lab".to_string()),
        ("AWS_SHARED_CREDENTIALS_FILE", aws.join("credentials").display().to_string()),
        ("AWS_CONFIG_FILE", aws.join("config").display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let from_files = train(&remote, &project, "files", &dir.path().join("copies2"), &files);
    assert!(from_files.contains(&format!("train split: {url}: fetched")), "{from_files}");
    assert_eq!(results(&project.join("local")), results(&project.join("files")));

    // A missing object is an error naming it.
    let missing = dir.path().join("missing.yaml");
    std::fs::write(&missing, format!("path: {}\ntrain: train.sluice\nval: val.sluice\n{names}\n", server.url("gone")))
        .expect("yaml");
    let out = sluice(
        &["train", "--data", missing.to_str().expect("utf-8"), "--project", project.to_str().expect("utf-8")],
        &env,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&server.url("gone/train.sluice")) && stderr.to_lowercase().contains("not found"),
        "{stderr}"
    );
}
