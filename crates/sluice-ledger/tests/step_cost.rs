//! The GPU step's cost held to its committed budget: the op ledger of one YOLOv8n training step and one validation
//! batch at 640, batch 32, f32, SGD (`sluice bench step-cost --budget`), recorded as a model of the CUDA step on
//! the CPU. A change that raises (or lowers) a phase's kernel launches or bytes moved by more than 2 % fails here
//! and prints the ops that changed; a change that lowers it updates `tests/data/step_cost/` with
//! `sluice bench step-cost --budget > crates/sluice-ledger/tests/data/step_cost/yolov8n_640_b32_f32_sgd.json`.

use sluice_ledger::{Budget, StepCostOptions, budget, budget_changes, record_step};

const BUDGET: &str = include_str!("data/step_cost/yolov8n_640_b32_f32_sgd.json");

#[test]
fn the_yolov8n_step_keeps_to_its_budget_of_launches_and_bytes() -> Result<(), Box<dyn std::error::Error>> {
    let committed: Budget = serde_json::from_str(BUDGET)?;
    let opts = StepCostOptions::new("yolov8n");
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
        "the step's ledger left its budget by more than 2 %:\n{}\nif the change is meant, regenerate the budget \
         (see this file's header)",
        changes.join("\n")
    );
    Ok(())
}
