//! The GPU step's cost held to its committed budgets: the op ledger of one YOLOv8n training step and one validation
//! batch at 640, batch 32, SGD, in f32 and under fp16 autocast (`sluice bench step-cost --budget [--amp fp16]`),
//! recorded as a model of the CUDA step on the CPU. A change that raises (or lowers) a phase's kernel launches or
//! bytes moved by more than 2 % fails here and prints the ops that changed; a change that lowers it updates
//! `tests/data/step_cost/` with
//! `sluice bench step-cost --budget > crates/sluice-ledger/tests/data/step_cost/yolov8n_640_b32_f32_sgd.json` and
//! `sluice bench step-cost --budget --amp fp16 > crates/sluice-ledger/tests/data/step_cost/yolov8n_640_b32_fp16_sgd.json`;
//! the f32 step on every opt-in device path of the step (the run a device check would verify) with
//! `sluice bench step-cost --budget --device-paths fused_step,fused_ciou,fused_bce,fused_pool >
//! crates/sluice-ledger/tests/data/step_cost/yolov8n_640_b32_f32_sgd_opt_in.json`.

use candle_core::DType;
use sluice_infer::DevicePaths;
use sluice_ledger::{Budget, StepCostOptions, budget, budget_changes, record_step};

/// The ledger records process-wide: one recording at a time.
static RECORDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn keeps_to(committed: &str, amp: Option<DType>, device_paths: DevicePaths) -> Result<(), Box<dyn std::error::Error>> {
    let _one = RECORDING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let committed: Budget = serde_json::from_str(committed)?;
    let opts = StepCostOptions { amp, device_paths, ..StepCostOptions::new("yolov8n") };
    let records = record_step(&opts)?;
    let now = budget(&opts, &records);
    // The ledger models the device: a validation batch reads nothing back but its packed rows, a training step
    // nothing but its loss items.
    let reads = |phase: &str| now.phases.iter().find(|p| p.phase == phase).map(|p| p.host_reads);
    assert_eq!(reads("val"), Some(1), "validation batch host reads");
    let train_reads: u64 = now.phases.iter().filter(|p| p.phase != "val").map(|p| p.host_reads).sum();
    assert_eq!(train_reads, 1, "training step host reads");
    let changes = budget_changes(&committed, &now, 0.02);
    assert!(
        changes.is_empty(),
        "the {} step's ledger left its budget by more than 2 %:\n{}\nif the change is meant, regenerate the budget \
         (see this file's header)",
        committed.amp,
        changes.join("\n")
    );
    Ok(())
}

#[test]
fn the_yolov8n_step_keeps_to_its_budget_of_launches_and_bytes() -> Result<(), Box<dyn std::error::Error>> {
    keeps_to(include_str!("data/step_cost/yolov8n_640_b32_f32_sgd.json"), None, DevicePaths::default())
}

#[test]
fn the_yolov8n_fp16_step_keeps_to_its_budget_of_launches_and_bytes() -> Result<(), Box<dyn std::error::Error>> {
    keeps_to(include_str!("data/step_cost/yolov8n_640_b32_fp16_sgd.json"), Some(DType::F16), DevicePaths::default())
}

#[test]
fn the_yolov8n_step_on_the_opt_in_device_paths_keeps_to_its_budget() -> Result<(), Box<dyn std::error::Error>> {
    let paths =
        DevicePaths { fused_step: true, fused_ciou: true, fused_bce: true, fused_pool: true, ..DevicePaths::default() };
    keeps_to(include_str!("data/step_cost/yolov8n_640_b32_f32_sgd_opt_in.json"), None, paths)
}
