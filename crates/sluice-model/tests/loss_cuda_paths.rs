//! The dense loss on CUDA's op paths, run on the CPU (`sluice_kernels::ledger::set_model_cuda`): the class loss's
//! sum from the probabilities and its one-op gradient, the composed ops where the CPU has fused kernels, against the
//! same Ultralytics 8.4 fixture and host path as `tests/loss.rs`. A binary of its own, because the switch is global.
#![allow(clippy::unwrap_used)] // Test helpers panic on broken fixtures.

mod common;

#[test]
fn the_dense_loss_on_cuda_paths_matches_ultralytics_and_the_host_path() {
    sluice_kernels::ledger::set_model_cuda(true);
    // The class loss's sum from the probabilities lands 1e-6 from Ultralytics' and the host's fused op 4e-5 from
    // it, so the two paths are held to each other at Ultralytics' bound.
    common::loss_fixture::dense_loss_matches_ultralytics_and_the_host_path(1e-4);
}
