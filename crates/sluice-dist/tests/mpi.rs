//! The MPI engine across real processes: `mpirun -np N` on this test binary run again as the helper [`mpi_rank`],
//! every collective checked.
#![cfg(feature = "mpi")]

use sluice_dist::mpirun::{MpirunLookup, mpirun_command};
use sluice_dist::{Collective, Mpi};

fn run(np: usize) {
    let (exe, args) = sluice_testkit::helper::program("mpi_rank");
    let (k, v) = sluice_testkit::helper::env("mpi_rank");
    let lookup = MpirunLookup::from_vars(|k| std::env::var_os(k));
    let out = mpirun_command(&lookup, np, exe, &args).expect("mpirun").env(k, v).output().expect("running mpirun");
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

/// A rank (started by [`run`] under `mpirun`): exercises every collective and, on rank 0, prints one line per
/// check (`ok NAME` or `FAIL NAME: why`); it exits with code 1 when a check failed, 2 when MPI did not start.
#[test]
#[ignore = "a rank of `two_ranks` and `three_ranks`, which start it under mpirun"]
fn mpi_rank() {
    if !sluice_testkit::helper::is("mpi_rank") {
        return;
    }
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("FAIL init: {e}");
            std::process::exit(2);
        }
    };
    let (rank, world) = (mpi.rank(), mpi.world());
    let mut failed = false;
    let mut report = |name: &str, ok: bool, why: String| {
        if rank == 0 {
            if ok { println!("ok {name}") } else { println!("FAIL {name}: {why}") }
        }
        failed |= !ok;
    };
    // Sum: rank r holds r + 0.5 + i·0.001 in element i.
    let mut v: Vec<f32> = (0..1000).map(|i| rank as f32 + 0.5 + i as f32 * 0.001).collect();
    let r = mpi.all_reduce_sum(&mut v);
    let want: Vec<f32> =
        (0..1000).map(|i| (0..world).map(|r| r as f32 + 0.5 + i as f32 * 0.001).fold(0.0f32, |a, b| a + b)).collect();
    let close = v.iter().zip(&want).all(|(a, b)| (a - b).abs() <= 1e-5 * b.abs().max(1.0));
    report("all_reduce_sum", r.is_ok() && close, format!("{r:?} {:?} vs {:?}", &v[..3], &want[..3]));
    // Every rank must hold the same bits.
    let bits: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let all = mpi.all_gather_bytes(&bits).unwrap_or_default();
    report("same_bits", all.len() == world && all.iter().all(|b| *b == bits), format!("{} parts", all.len()));
    let mut b: Vec<f32> = vec![rank as f32; 7];
    let r = mpi.broadcast(&mut b, world - 1);
    report("broadcast", r.is_ok() && b.iter().all(|&x| x == (world - 1) as f32), format!("{b:?}"));
    let mut bytes = if rank == 0 { b"from rank 0".to_vec() } else { Vec::new() };
    let r = mpi.broadcast_bytes(&mut bytes, 0);
    report("broadcast_bytes", r.is_ok() && bytes == b"from rank 0", format!("{bytes:?}"));
    let mine = vec![rank as u8; rank * 3 + 1];
    let all = mpi.all_gather_bytes(&mine).unwrap_or_default();
    let ok = all.len() == world && all.iter().enumerate().all(|(r, p)| *p == vec![r as u8; r * 3 + 1]);
    report("all_gather_bytes", ok, format!("{all:?}"));
    report("barrier", mpi.barrier().is_ok(), String::new());
    let host = mpi.processor_name();
    report("processor_name", host.as_ref().is_ok_and(|h| !h.is_empty()), format!("{host:?}"));
    drop(mpi);
    std::process::exit(i32::from(failed));
}
