//! Data-parallel training across two real processes under `mpirun` (feature `mpi`): the all-reduced gradient
//! against one process's DDP combination of the same halves, and bit-equal replicas after optimizer steps. The
//! rank itself is `src/bin/dist_check.rs`.
#![cfg(feature = "mpi")]

#[test]
fn two_ranks_sum_gradients_as_ddp_and_stay_bit_equal() {
    let rank = env!("CARGO_BIN_EXE_sluice-train-dist-check");
    let lookup = sluice_dist::mpirun::MpirunLookup::from_vars(|k| std::env::var_os(k));
    let out = sluice_dist::mpirun::mpirun_command(&lookup, 2, rank, &[] as &[&str])
        .expect("mpirun")
        .env("CANDLE_NUM_THREADS", "1")
        .output()
        .expect("running mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for check in ["ddp_gradient", "reduction_changes_the_gradient", "weights_bit_equal", "weights_moved"] {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("ok {check}"))), "{check}\n{stdout}\n{stderr}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}\n{stderr}");
}
