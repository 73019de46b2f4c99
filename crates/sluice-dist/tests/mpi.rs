//! The MPI engine across real processes: `mpirun -np N` on the probe binary, every collective checked.
#![cfg(feature = "mpi")]

use sluice_dist::mpirun::{MpirunLookup, mpirun_command};

fn run(np: usize) {
    let probe = env!("CARGO_BIN_EXE_sluice-dist-mpi-check");
    let lookup = MpirunLookup::from_vars(|k| std::env::var_os(k));
    let out = mpirun_command(&lookup, np, probe, &[] as &[&str]).expect("mpirun").output().expect("running mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "np {np}: {:?}\n{stdout}\n{stderr}", out.status);
    for check in ["all_reduce_sum", "same_bits", "broadcast", "broadcast_bytes", "all_gather_bytes", "barrier"] {
        assert!(stdout.lines().any(|l| l == format!("ok {check}")), "np {np}: {check} missing\n{stdout}\n{stderr}");
    }
}

#[test]
fn two_ranks() {
    run(2);
}

#[test]
fn three_ranks() {
    run(3);
}
