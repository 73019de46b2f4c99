//! A seeded model starts from the weights Ultralytics' trainer starts from with the same seed: every float tensor
//! of yolov8n, yolo11n and yolo26n (6 classes, seed 0) against `data/torch_init/torch_init.json`, Ultralytics
//! 8.4.190's `DetectionModel` after `init_seeds(0)` (`make_torch_init.py` beside it). The first and last value of
//! each tensor are compared exactly, its sum and sum of squares to float32 summation error. The values come from the
//! order of the draws, so a change in the order the builder creates tensors fails here.

use sluice_model::candle_core::{DType, Device};
use sluice_model::{Yolo, parse_model};

const FIXTURE: &str = include_str!("data/torch_init/torch_init.json");

#[test]
fn seeded_weights_are_ultralytics_initial_weights() {
    let fixture: serde_json::Value = serde_json::from_str(FIXTURE).expect("fixture JSON");
    let seed = fixture["seed"].as_u64().expect("seed");
    let nc = fixture["nc"].as_u64().expect("nc") as usize;
    let models = fixture["models"].as_object().expect("models");
    assert_eq!(models.len(), 3);
    for (name, digests) in models {
        let arch = parse_model(name).expect("model name");
        let m = Yolo::new_seeded(arch.config(nc), DType::F32, &Device::Cpu, seed).expect("model");
        let digests = digests.as_object().expect("digests");
        let mut wrong = Vec::new();
        // The DFL's fixed 0..reg_max projection is a constant of the head here, not a tensor of the model.
        for (key, want) in digests.iter().filter(|(k, _)| !k.contains(".dfl.")) {
            let want: Vec<f64> = want.as_array().expect("digest").iter().map(|v| v.as_f64().expect("number")).collect();
            let var = m.var(key).unwrap_or_else(|| panic!("{name}: no tensor {key}"));
            let v: Vec<f32> = var.as_tensor().flatten_all().and_then(|t| t.to_vec1()).expect("values");
            let (sum, sq) =
                v.iter().fold((0f64, 0f64), |(s, q), &x| (s + f64::from(x), q + f64::from(x) * f64::from(x)));
            let scale = sq.sqrt().max(1.0) * (v.len() as f64).sqrt();
            let ends = v[0] == want[0] as f32 && v[v.len() - 1] == want[1] as f32;
            if !ends || (sum - want[2]).abs() > 1e-6 * scale || (sq - want[3]).abs() > 1e-6 * want[3].max(1.0) {
                wrong.push(format!(
                    "{key}: first/last {} {} sum {sum} sq {sq}, Ultralytics {want:?}",
                    v[0],
                    v[v.len() - 1]
                ));
            }
        }
        assert!(wrong.is_empty(), "{name}: {} of {} tensors differ:\n{}", wrong.len(), digests.len(), wrong.join("\n"));
    }
}
