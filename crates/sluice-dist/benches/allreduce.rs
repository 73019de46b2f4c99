//! The data-parallel step's collective on the host: `Mpi::all_reduce_sum` of one yolov8n gradient bucket
//! (3,157,184 floats, 12.6 MB) and of one 25 MiB bucket. Run as one process, MPI starts as a singleton (world 1),
//! so this times the engine's fixed cost per call (its copies through the receive buffer), not the network; the
//! two-rank traffic is measured end to end by `benches/ddp_scaling.sh`.
//!
//!   cargo bench -p sluice-dist --features mpi --bench allreduce

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_dist::{Collective, Mpi};

fn bench(c: &mut Criterion) {
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("allreduce bench: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("mpi_all_reduce_sum");
    for (name, n) in [("yolov8n_grads", 3_157_184usize), ("bucket_25MiB", 25 * 1024 * 1024 / 4)] {
        let mut buf: Vec<f32> = (0..n).map(|i| (i % 977) as f32 * 1e-3).collect();
        g.throughput(Throughput::Bytes((n * 4) as u64));
        g.bench_function(name, |b| b.iter(|| mpi.all_reduce_sum(&mut buf)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
