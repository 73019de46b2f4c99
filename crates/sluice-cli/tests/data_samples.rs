//! `sluice data samples` on a tiny generated dataset: one JSON line per sample the training loader delivers, with
//! mosaic on from epoch 0 and off in the last `close_mosaic` epochs, boxes inside the canvas, pixel moments in
//! [0, 1], and the same lines for the same seed; `sluice data draws`: every sample of every epoch once, with its
//! mosaic's images until `close_mosaic`.

use std::path::Path;
use std::process::Command;

use sluice_dataset::synth::{SynthConfig, generate};

fn samples(data: &Path, out: &Path, epoch: &str, seed: &str) -> Vec<serde_json::Value> {
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["data", "samples", "--data", data.to_str().expect("utf-8"), "--out", out.to_str().expect("utf-8")])
        .args(["--samples", "20", "--imgsz", "64", "--batch", "4", "--epochs", "13", "--epoch", epoch])
        .args(["--seed", seed])
        .status()
        .expect("run sluice");
    assert!(status.success());
    let text = std::fs::read_to_string(out).expect("samples file");
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

#[test]
fn samples_are_dumped_per_phase_and_repeat_for_a_seed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 3, train: 8, val: 2, imgsz: 96, ..Default::default() };
    let data = generate(&synth).expect("generate").data_yaml;
    let out = dir.path().join("s.jsonl");
    // 8 images an epoch: 20 samples read epochs 0, 1 and half of 2.
    let on = samples(&data, &out, "0", "1");
    assert_eq!(on.len(), 20);
    let epochs: Vec<u64> = on.iter().map(|l| l["epoch"].as_u64().expect("epoch")).collect();
    assert_eq!((epochs[0], epochs[8], epochs[16]), (0, 1, 2));
    assert!(on.iter().all(|l| l["mosaic"] == true));
    for l in &on {
        let n = l["cls"].as_array().expect("cls").len();
        assert_eq!(l["w"].as_array().expect("w").len(), n);
        for v in l["w"].as_array().expect("w").iter().chain(l["h"].as_array().expect("h")) {
            let v = v.as_f64().expect("a number");
            assert!(v > 0.0 && v <= 1.0, "{l}");
        }
        for (m, q) in l["mean"].as_array().expect("mean").iter().zip(l["sq"].as_array().expect("sq")) {
            let (m, q) = (m.as_f64().expect("mean"), q.as_f64().expect("sq"));
            assert!((0.0..=1.0).contains(&m) && q >= m * m - 1e-12 && q <= 1.0, "{l}");
        }
    }
    // Epochs 3 to 12 of 13 are the last 10: mosaic is off.
    let off = samples(&data, &out, "3", "1");
    assert!(off.iter().all(|l| l["mosaic"] == false));
    assert_eq!(samples(&data, &out, "0", "1"), on, "the same seed gives the same samples");
    assert_ne!(samples(&data, &out, "0", "2"), on, "another seed gives other samples");
}

#[test]
fn draws_list_every_sample_of_every_epoch_with_its_mosaic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let synth =
        SynthConfig { out: dir.path().join("data"), seed: 3, train: 8, val: 2, imgsz: 96, ..Default::default() };
    let data = generate(&synth).expect("generate").data_yaml;
    let out = dir.path().join("d.jsonl");
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["data", "draws", "--data", data.to_str().expect("utf-8"), "--out", out.to_str().expect("utf-8")])
        .args(["--imgsz", "64", "--batch", "4", "--epochs", "5", "--close-mosaic", "2", "--seed", "1"])
        .status()
        .expect("run sluice");
    assert!(status.success());
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .expect("draws file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 5 * 8);
    for (epoch, lines) in lines.chunks(8).enumerate() {
        let mut ids: Vec<u64> = lines.iter().map(|l| l["id"].as_u64().expect("id")).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..8).collect::<Vec<u64>>(), "epoch {epoch}: every sample once");
        for (pos, l) in lines.iter().enumerate() {
            assert_eq!((l["epoch"].as_u64(), l["pos"].as_u64()), (Some(epoch as u64), Some(pos as u64)));
            if epoch < 3 {
                let mosaic: Vec<u64> =
                    l["mosaic"].as_array().expect("mosaic").iter().map(|v| v.as_u64().expect("id")).collect();
                assert_eq!((mosaic.len(), mosaic[0]), (4, l["id"].as_u64().expect("id")), "{l}");
                assert!(mosaic.iter().all(|&i| i < 8), "{l}");
            } else {
                assert!(l["mosaic"].is_null() && l["centre"].is_null(), "epoch {epoch}: mosaic is closed: {l}");
            }
        }
    }
}
