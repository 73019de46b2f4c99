//! Runner overhead: items/s through pipelines of no-op stages (1 and 3 stages; per-item-per-stage overhead is the
//! difference divided by two), and a steady-state allocation count for the queue + pool path, measured with a
//! counting global allocator and printed before the timings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{Batch, BatchShape, Pipeline, Pool};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged, only counting calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ITEMS: u64 = 20_000;

fn noop_pipeline(stages: usize, workers: usize, ordered: bool) -> u64 {
    let mut p = Pipeline::from_iter("source", 0..ITEMS).stage("s0", workers, |x: u64, _| Ok(x));
    for _ in 1..stages {
        p = p.stage("s", workers, |x: u64, _| Ok(x));
    }
    p.ordered(ordered).into_iter().map(|r| r.unwrap_or(0)).sum()
}

/// Allocations per batch once the pipeline is warm: pooled batches filled by a stage and dropped by the consumer.
fn steady_state_allocations_per_batch(batches: u64) -> f64 {
    let pool = Pool::new(8, || Batch::new(BatchShape::rgb(4, 64, 64), 64));
    let run = |n: u64| {
        let pool = pool.clone();
        let pipeline = Pipeline::from_iter("sampler", 0..n).stage("fill", 2, move |i: u64, ctx| {
            let mut batch = pool.acquire(ctx.cancel())?;
            batch.reset(BatchShape::rgb(4, 64, 64), i);
            for b in 0..4 {
                let (_, slot) = batch.push_slot(i * 4 + b)?;
                slot.fill(b as u8);
            }
            Ok(batch)
        });
        let mut iter = pipeline.into_iter();
        // Warm up: threads, queues, ring and pool items are created here.
        for _ in 0..16 {
            black_box(iter.next());
        }
        let before = ALLOCS.load(Ordering::Relaxed);
        let mut seen = 0u64;
        for batch in iter.by_ref() {
            black_box(batch.map(|b| b.len()).unwrap_or(0));
            seen += 1;
        }
        let after = ALLOCS.load(Ordering::Relaxed);
        (after - before, seen)
    };
    let (allocs, seen) = run(batches + 16);
    allocs as f64 / seen.max(1) as f64
}

fn bench(c: &mut Criterion) {
    let per_batch = steady_state_allocations_per_batch(5_000);
    println!("steady state: {per_batch:.4} allocations per batch (queue + pool + ordered ring)");

    let mut g = c.benchmark_group("runner");
    g.throughput(Throughput::Elements(ITEMS));
    g.sample_size(20);
    for (stages, workers, ordered) in [(1, 1, true), (3, 1, true), (1, 2, true), (3, 2, false)] {
        let name = format!("noop/{stages}stages/{workers}workers/{}", if ordered { "ordered" } else { "unordered" });
        g.bench_function(name, |b| b.iter(|| noop_pipeline(stages, workers, ordered)));
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
