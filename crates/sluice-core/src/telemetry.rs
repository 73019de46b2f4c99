//! Per-stage telemetry of a pipeline (items, bytes, busy time, time blocked on input and on output) and the
//! bottleneck report built from it: which stage limits throughput, and how much of the consumer's time was spent
//! waiting for data.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

/// Live counters of one stage, shared by its workers (relaxed atomics: a handful per item).
#[derive(Debug, Default)]
pub(crate) struct StageCounters {
    pub(crate) items: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) busy_ns: AtomicU64,
    pub(crate) wait_in_ns: AtomicU64,
    pub(crate) wait_out_ns: AtomicU64,
}

impl StageCounters {
    pub(crate) fn add(counter: &AtomicU64, d: Duration) {
        counter.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, name: &'static str, workers: usize) -> StageReport {
        let secs = |c: &AtomicU64| c.load(Ordering::Relaxed) as f64 * 1e-9;
        StageReport {
            name,
            workers,
            items: self.items.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            busy_s: secs(&self.busy_ns),
            wait_input_s: secs(&self.wait_in_ns),
            wait_output_s: secs(&self.wait_out_ns),
        }
    }
}

/// What one stage did, summed over its workers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageReport {
    /// The stage's name.
    pub name: &'static str,
    /// Worker threads of the stage.
    pub workers: usize,
    /// Items processed.
    pub items: u64,
    /// Bytes reported by the stage (see `StageCtx::add_bytes`).
    pub bytes: u64,
    /// Seconds spent working, summed over workers.
    pub busy_s: f64,
    /// Seconds blocked waiting for input, summed over workers.
    pub wait_input_s: f64,
    /// Seconds blocked waiting for room downstream, summed over workers.
    pub wait_output_s: f64,
}

impl StageReport {
    /// The most items per second this stage could deliver with its workers busy all the time.
    pub fn capacity_per_s(&self) -> f64 {
        if self.busy_s > 0.0 { self.items as f64 * self.workers as f64 / self.busy_s } else { f64::INFINITY }
    }

    /// Fraction of its workers' wall time spent working.
    pub fn utilisation(&self, wall_s: f64) -> f64 {
        if wall_s > 0.0 { self.busy_s / (wall_s * self.workers as f64) } else { 0.0 }
    }
}

/// The whole pipeline's telemetry, as printed every epoch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PipelineReport {
    /// One entry per stage, source first.
    pub stages: Vec<StageReport>,
    /// Items the consumer received.
    pub delivered: u64,
    /// Seconds from the first pull to now (or to the end of the stream).
    pub wall_s: f64,
    /// Seconds the consumer spent blocked in `next()` waiting for an item.
    pub consumer_wait_s: f64,
    /// `consumer_wait_s / wall_s`: the fraction of the consumer's time spent waiting for data.
    pub consumer_wait_fraction: f64,
    /// The stage that limits throughput, or `"consumer"` when the consumer itself is the slowest part.
    pub bottleneck: String,
}

/// The consumer is called the bottleneck when it waits for data less than this fraction of its time.
pub const CONSUMER_BOUND_WAIT_FRACTION: f64 = 0.05;

/// The bottleneck of a pipeline whose stages measured `stages` while the consumer waited for data
/// `consumer_wait_fraction` of its time: the stage with the lowest capacity (`items × workers / busy`), unless the
/// consumer waited less than [`CONSUMER_BOUND_WAIT_FRACTION`], in which case the consumer itself.
pub fn bottleneck_of(stages: &[StageReport], consumer_wait_fraction: f64) -> String {
    let slowest = stages
        .iter()
        .filter(|s| s.items > 0)
        .min_by(|a, b| a.capacity_per_s().total_cmp(&b.capacity_per_s()))
        .map(|s| s.name.to_string());
    match slowest {
        Some(stage) if consumer_wait_fraction >= CONSUMER_BOUND_WAIT_FRACTION => stage,
        _ => "consumer".to_string(),
    }
}

impl PipelineReport {
    pub(crate) fn new(stages: Vec<StageReport>, delivered: u64, wall_s: f64, consumer_wait_s: f64) -> Self {
        let consumer_wait_fraction = if wall_s > 0.0 { (consumer_wait_s / wall_s).min(1.0) } else { 0.0 };
        let bottleneck = bottleneck_of(&stages, consumer_wait_fraction);
        Self { stages, delivered, wall_s, consumer_wait_s, consumer_wait_fraction, bottleneck }
    }
}

impl fmt::Display for PipelineReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = if self.wall_s > 0.0 { self.delivered as f64 / self.wall_s } else { 0.0 };
        writeln!(
            f,
            "pipeline: {} items in {:.2}s ({rate:.1}/s), consumer waited {:.1}% of its time, bottleneck: {}",
            self.delivered,
            self.wall_s,
            100.0 * self.consumer_wait_fraction,
            self.bottleneck
        )?;
        writeln!(
            f,
            "  {:<12} {:>7} {:>10} {:>10} {:>7} {:>9} {:>9} {:>10}",
            "stage", "workers", "items", "MB", "util%", "in-wait", "out-wait", "cap/s"
        )?;
        for s in &self.stages {
            writeln!(
                f,
                "  {:<12} {:>7} {:>10} {:>10.1} {:>7.1} {:>8.2}s {:>8.2}s {:>10.1}",
                s.name,
                s.workers,
                s.items,
                s.bytes as f64 / 1e6,
                100.0 * s.utilisation(self.wall_s),
                s.wait_input_s,
                s.wait_output_s,
                s.capacity_per_s()
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(name: &'static str, workers: usize, items: u64, busy_s: f64) -> StageReport {
        StageReport { name, workers, items, bytes: 0, busy_s, wait_input_s: 0.0, wait_output_s: 0.0 }
    }

    #[test]
    fn slowest_stage_per_worker_capacity_is_the_bottleneck() {
        // decode: 100 items in 10 busy-seconds on 4 workers = 40/s; augment: 100 in 4 s on 1 worker = 25/s.
        let r = PipelineReport::new(vec![stage("decode", 4, 100, 10.0), stage("augment", 1, 100, 4.0)], 100, 5.0, 2.0);
        assert_eq!(r.bottleneck, "augment");
        assert!((r.consumer_wait_fraction - 0.4).abs() < 1e-12);
        assert!(r.to_string().contains("bottleneck: augment"));
    }

    #[test]
    fn a_consumer_that_never_waits_is_the_bottleneck() {
        let r = PipelineReport::new(vec![stage("decode", 1, 10, 1.0)], 10, 10.0, 0.01);
        assert_eq!(r.bottleneck, "consumer");
    }

    #[test]
    fn a_slow_consumer_is_named_the_bottleneck_whatever_the_stages_capacities() {
        // A source and a fast stage feeding a consumer that takes 2 ms an item: the stages are idle most of the
        // time and the consumer barely waits (1 % of its time), so the consumer bounds the pipeline even though one
        // stage has far less capacity than the other.
        let stages = [stage("source", 1, 100, 0.001), stage("fast", 2, 100, 0.02)];
        assert_eq!(bottleneck_of(&stages, 0.01), "consumer");
        // Just under the threshold it is still the consumer; at it, the slowest stage.
        assert_eq!(bottleneck_of(&stages, CONSUMER_BOUND_WAIT_FRACTION - 1e-9), "consumer");
        assert_eq!(bottleneck_of(&stages, CONSUMER_BOUND_WAIT_FRACTION), "fast");
        // A consumer that waits most of its time names the stage with the lowest items × workers / busy.
        let stages = [stage("source", 1, 200, 0.01), stage("decode", 2, 200, 0.1), stage("slow", 1, 200, 0.4)];
        assert_eq!(bottleneck_of(&stages, 0.8), "slow");
        // A stage that delivered nothing has no capacity to compare.
        let stages = [stage("idle", 1, 0, 0.0), stage("decode", 2, 50, 1.0)];
        assert_eq!(bottleneck_of(&stages, 0.5), "decode");
        assert_eq!(bottleneck_of(&[], 0.5), "consumer");
    }
}
