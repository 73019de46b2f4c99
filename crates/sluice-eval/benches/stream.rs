//! The streaming validator's overlap of inference and post-processing: with a post-process (NMS + Ultralytics
//! matching) as slow as inference, a validation pass should take about max(inference, post-process), not their
//! sum; this bench prints the ratios that show it.
//!
//! Synthetic predictions (`tests/common/synth.rs`: 8400 anchors, 80 classes, noisy detections around ground
//! truth) are cut into batches. First the post-process alone is timed per batch (sequential NMS + matching on this
//! thread), then "inference" is a busy loop on the producer thread that takes exactly that long per batch; the
//! streamed pass runs both, the post-process on `workers` threads. Printed per worker count: inference alone,
//! post-process alone, the streamed total, and total / max and total / sum (medians over repeats, with the range).
//! A ratio near 1.0 against max means the two overlapped; near 0.5 against sum the same thing. Then a criterion
//! group times `submit` + `finish` per batch with no inference at all (the streaming update cost per batch).
//!
//! `cargo bench -p sluice-eval --bench stream` (needs at least two free cores for the overlap to show).

#[path = "../tests/common/synth.rs"]
#[allow(unreachable_pub)]
mod synth;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{Metric, SampleId};
use sluice_eval::{Layout, Nms, NmsParams, NmsScratch, PredView, StreamConfig, StreamingValidator, UltralyticsMetric};
use synth::SynthImage;

const NC: usize = 80;
const ANCHORS: usize = 8400;
const BATCH: usize = 4;
const BATCHES: usize = 12;
const REPEATS: usize = 5;

fn batches() -> Vec<Vec<SynthImage>> {
    (0..BATCHES).map(|b| synth::images(7, (b * BATCH) as SampleId, BATCH, NC, ANCHORS)).collect()
}

/// Sequential NMS + matching of one batch on this thread (what the workers do), returning the detections kept.
fn post_process(
    batch: &[SynthImage],
    nms: &Nms,
    scratch: &mut NmsScratch,
    dets: &mut Vec<sluice_core::Detection>,
    metric: &mut UltralyticsMetric,
) -> usize {
    let mut kept = 0;
    for (i, im) in batch.iter().enumerate() {
        let view = PredView::new(&im.pred, NC, ANCHORS, Layout::ChannelsFirst).expect("view");
        nms.run(&view, i, scratch, dets, None).expect("nms");
        kept += dets.len();
        metric.update(im.id, dets, &im.labels).expect("update");
    }
    kept
}

/// Spins for `d` (a stand-in for a model forward that keeps this core busy).
fn busy(d: Duration) {
    let t = Instant::now();
    let mut x = 1u64;
    while t.elapsed() < d {
        for _ in 0..256 {
            x = black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407));
        }
    }
    black_box(x);
}

fn streamed(data: &[Vec<SynthImage>], workers: usize, inference: &[Duration]) -> Duration {
    let cfg = StreamConfig { workers, ..StreamConfig::new(NC as u32) };
    let t = Instant::now();
    let mut v = StreamingValidator::new(cfg).expect("validator");
    for (batch, d) in data.iter().zip(inference) {
        busy(*d);
        let mut buf = v.buffer().expect("buffer");
        for im in batch {
            buf.preds.data.extend_from_slice(&im.pred);
        }
        (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (batch.len(), NC, ANCHORS);
        let ids: Vec<SampleId> = batch.iter().map(|im| im.id).collect();
        let labels: Vec<_> = batch.iter().map(|im| im.labels.clone()).collect();
        buf.set_labels(&ids, &labels).expect("labels");
        v.submit(buf).expect("submit");
    }
    black_box(v.finish().expect("finish"));
    t.elapsed()
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn overlap_report(data: &[Vec<SynthImage>]) {
    let nms = Nms::new(NmsParams::ultralytics_val());
    let (mut scratch, mut dets) = (NmsScratch::default(), Vec::new());
    // Post-process alone, per batch (median of the repeats), which becomes the inference time per batch.
    let mut per_batch = vec![Vec::with_capacity(REPEATS); data.len()];
    for _ in 0..REPEATS {
        let mut metric = UltralyticsMetric::new(NC as u32);
        for (b, batch) in data.iter().enumerate() {
            let t = Instant::now();
            black_box(post_process(batch, &nms, &mut scratch, &mut dets, &mut metric));
            per_batch[b].push(t.elapsed().as_secs_f64());
        }
    }
    let inference: Vec<Duration> = per_batch.into_iter().map(|v| Duration::from_secs_f64(median(v).0)).collect();
    let inf_total: f64 = inference.iter().map(Duration::as_secs_f64).sum();
    println!(
        "stream overlap: {} batches x {BATCH} images ({ANCHORS} anchors, {NC} classes); inference per batch = \
         post-process per batch; {REPEATS} repeats",
        data.len()
    );
    for workers in [1, 2] {
        let totals: Vec<f64> = (0..REPEATS).map(|_| streamed(data, workers, &inference).as_secs_f64()).collect();
        let (t, lo, hi) = median(totals);
        println!(
            "  workers {workers}: inference {:.0} ms, post-process {:.0} ms, streamed {:.0} ms (range {:.0}..{:.0}) \
             -> total/max {:.2}, total/sum {:.2}",
            inf_total * 1e3,
            inf_total * 1e3,
            t * 1e3,
            lo * 1e3,
            hi * 1e3,
            t / inf_total,
            t / (2.0 * inf_total)
        );
    }
}

fn bench(c: &mut Criterion) {
    let data = batches();
    overlap_report(&data);
    let mut g = c.benchmark_group("stream");
    g.throughput(Throughput::Elements((BATCHES * BATCH) as u64));
    g.sample_size(10);
    g.bench_function("submit_finish_1worker_no_inference", |b| {
        let none = vec![Duration::ZERO; data.len()];
        b.iter(|| streamed(&data, 1, &none));
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
