//! `sluice train --nproc 2` end to end (feature `mpi`, two CPU ranks under `mpirun`), on a generated shapes set,
//! fine-tuning `tests/data/tiny_synthetic_f16.safetensors` (the EMA of the embedded default's YOLOv8-tiny, trained
//! on the same generator, in half precision) so that validation finds objects:
//! - the run finishes (its decoded images in one node cache), rank 0 alone writes the run folder, and the
//!   validation of the epoch (each rank validating its share of the batches, the metric states gathered) equals a
//!   single-process `sluice val` of the saved weights; with `cache: disk` the two ranks share one file per split,
//!   built once, and the run is the same;
//! - killing one rank ends the run with an error naming that rank well within 30 s.
#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_dataset::synth::{SynthConfig, generate};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

fn data(dir: &Path) -> PathBuf {
    data_sized(dir, 32)
}

fn data_sized(dir: &Path, train: usize) -> PathBuf {
    let synth = SynthConfig { out: dir.join("data"), seed: 11, train, val: 24, ..SynthConfig::quick(dir) };
    generate(&synth).expect("generate").data_yaml
}

fn train_args(data: &Path, project: &Path, name: &str, epochs: &str) -> Vec<String> {
    let weights = repo_file("crates/sluice-cli/tests/data/tiny_synthetic_f16.safetensors");
    let model = repo_file("configs/models/yolov8-tiny.yaml");
    [
        "train",
        "--data",
        data.to_str().expect("utf-8"),
        "--model",
        model.to_str().expect("utf-8"),
        "--weights",
        weights.to_str().expect("utf-8"),
        "--epochs",
        epochs,
        "--imgsz",
        "192",
        "--batch",
        "8",
        "--workers",
        "1",
        "--nproc",
        "2",
        "--project",
        project.to_str().expect("utf-8"),
        "--name",
        name,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    // Two ranks on a small machine: one compute thread each.
    c.env("RAYON_NUM_THREADS", "1").env("CANDLE_NUM_THREADS", "1");
    c
}

#[test]
fn two_ranks_train_and_validate_as_one_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data(dir.path());
    let project = dir.path().join("runs");
    let mut args = train_args(&data, &project, "two", "1");
    // The decoded images in one node cache that both ranks map.
    args.extend(["--cache".into(), "ram".into(), "--json".into()]);
    let out = sluice().args(&args).output().expect("sluice train");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("data-parallel: 2 ranks (mpi, mpirun), 4 images per rank per batch"), "{stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("summary line")).expect("summary JSON");
    let run = project.join("two");
    // Rank 0 alone writes: one header and one row.
    let csv = std::fs::read_to_string(run.join("results.csv")).expect("results.csv");
    assert_eq!(csv.lines().count(), 2, "{csv}");

    let best = run.join("weights/best.safetensors");
    // Each rank validated with twice its training batch: 2 x 4.
    let val = sluice()
        .args(["val", "--weights", best.to_str().expect("utf-8"), "--data", data.to_str().expect("utf-8")])
        .args(["--imgsz", "192", "--batch", "8", "--workers", "1", "--json"])
        .output()
        .expect("sluice val");
    assert!(val.status.success(), "{}", String::from_utf8_lossy(&val.stderr));
    let v: serde_json::Value = serde_json::from_slice(&val.stdout).expect("val JSON");
    assert_eq!(v["images"], 24);
    let m = &summary["best_metrics"];
    assert!(m["map50"].as_f64().expect("map50") > 0.3, "the fine-tuned model finds the shapes: {m}");
    for (key, val_key) in
        [("precision", "precision"), ("recall", "recall"), ("map50", "map50"), ("map50_95", "map50_95")]
    {
        let (a, b) = (m[key].as_f64().expect(key), v[val_key].as_f64().expect(val_key));
        assert!((a - b).abs() <= 1e-12, "{key}: two ranks {a}, one process {b}");
    }

    // `cache: disk`: the node's local rank 0 builds one file per split, both ranks map it, and the run is the
    // run with the node cache in memory.
    let files = dir.path().join("imgcache");
    let mut args = train_args(&data, &project, "two_disk", "1");
    args.extend(["--cache", "disk", "--cache-dir", files.to_str().expect("utf-8")].map(String::from));
    let out = sluice().args(&args).output().expect("sluice train");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("cache=disk: decoded train images").count(), 1, "{stderr}");
    let mut names: Vec<String> = std::fs::read_dir(&files)
        .expect("the cache folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "one file per split, no temporary file left: {names:?}");
    assert!(names.iter().all(|n| n.ends_with(".imgcache")), "{names:?}");
    assert_eq!(rows_without_time(&run), rows_without_time(&project.join("two_disk")));
}

/// The `sluice` processes whose environment says they are rank `rank` under mpirun, started for `project`.
fn rank_pids(project: &Path, rank: usize) -> Vec<u32> {
    let want = format!("OMPI_COMM_WORLD_RANK={rank}");
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(project.to_str().unwrap_or("?")) {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        if environ.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn killing_a_rank_ends_the_run_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data(dir.path());
    let project = dir.path().join("runs");
    let mut child = sluice()
        .args(train_args(&data, &project, "killed", "200"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice train");
    // Wait for rank 1 to be training: the run folder exists once the ranks met and built the run.
    let t = Instant::now();
    let victim = loop {
        let pids = rank_pids(&project, 1);
        if project.join("killed/args.yaml").exists() && !pids.is_empty() {
            break pids;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "the ranks did not start");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(2));
    for pid in &victim {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("the run still runs 30 s after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let ended_in = killed.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("rank 1"), "the error names the lost rank: {stderr}");
    assert!(ended_in < Duration::from_secs(30), "{ended_in:?}");
    eprintln!("ended {ended_in:?} after the kill:\n{stderr}");
}

/// The rows of `results.csv` without the time column.
fn rows_without_time(run: &Path) -> Vec<String> {
    let csv = std::fs::read_to_string(run.join("results.csv")).expect("results.csv");
    csv.lines()
        .map(|l| {
            let mut cols: Vec<&str> = l.split(',').collect();
            cols.remove(1);
            cols.join(",")
        })
        .collect()
}

#[test]
fn an_interrupted_two_rank_run_resumes_exactly() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data_sized(dir.path(), 96);
    let project = dir.path().join("runs");
    let whole = sluice().args(train_args(&data, &project, "whole", "3")).output().expect("sluice train");
    assert!(whole.status.success(), "{}", String::from_utf8_lossy(&whole.stderr));

    // The same run, stopped by Ctrl-C (SIGINT to the launcher's process group, as a terminal sends it) while it
    // trains, then resumed.
    let child = sluice()
        .args(train_args(&data, &project, "cut", "3"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice train");
    let csv = project.join("cut/results.csv");
    let t = Instant::now();
    while !csv.exists() {
        assert!(t.elapsed() < Duration::from_secs(120), "the run did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(700));
    let status = Command::new("kill").args(["-s", "INT", "--", &format!("-{}", child.id())]).status().expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let cut_rows = std::fs::read_to_string(&csv).expect("results.csv").lines().count() - 1;
    assert!(cut_rows < 3, "the run was not interrupted ({cut_rows} epochs): {stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");

    let resumed = sluice()
        .args(["train", "--resume", project.join("cut").to_str().expect("utf-8"), "--nproc", "2"])
        .output()
        .expect("sluice train --resume");
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert_eq!(rows_without_time(&project.join("cut")), rows_without_time(&project.join("whole")));
}
