//! Where an epoch's time went: images/s, the model step, the fraction of the step loop spent waiting for data,
//! each stage's busy share, and the named bottleneck with a hint; then, for a validated epoch, the validation
//! pass's images/s and where its time went ([`ValTelemetry`]). Appended to `telemetry.jsonl`; the `sluice` console
//! prints them as a short table after every epoch.
//!
//! Stage busy % is busy time over the epoch's wall time, summed over that stage's workers, so a stage with 4 busy
//! workers shows 400%: compare it with its worker count. `read` and `decode` come from the decoded-image source
//! (cache misses only), `augment` from the loader pipeline, `transfer` and `model` from the training loop itself.
//! There is no separate collate step: the augment stage composes each sample straight into its pooled batch slot
//! (pixels, targets, ids), so collate's time is inside `augment`'s and the table says `collate (in augment)`
//! instead of a number. Post-processing (NMS + matching) happens only in validation, on the streaming
//! validator's workers; its busy share is over the validation wall time, on the `val` line.

use serde::Serialize;
use sluice_core::PipelineReport;
pub use sluice_core::syncs::SyncTelemetry;
pub use sluice_infer::ValTelemetry;
pub use sluice_loader::telemetry::{COLLATE, EpochShares, LoopTimes, StageShare};

/// How often the device's memory pool grew during an epoch ([`sluice_transfer::PoolGrowth`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PoolTelemetry {
    /// Steps observed.
    pub steps: u64,
    /// Steps in which the pool reserved more memory from the driver.
    pub growth_steps: u64,
    /// `growth_steps / steps`: the device allocations per step.
    pub growths_per_step: f64,
    /// Bytes reserved by those growths.
    pub grown_bytes: u64,
}

impl From<sluice_transfer::PoolGrowth> for PoolTelemetry {
    fn from(g: sluice_transfer::PoolGrowth) -> Self {
        Self {
            steps: g.steps,
            growth_steps: g.growth_steps,
            growths_per_step: g.growth_steps as f64 / g.steps.max(1) as f64,
            grown_bytes: g.grown_bytes,
        }
    }
}

/// The spread of an epoch's step intervals (the time from one batch's end to the next's, data wait included: on a
/// device that queues work, the rate at which steps complete), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepSpread {
    /// Median interval.
    pub median: f64,
    /// Shortest interval.
    pub min: f64,
    /// Longest interval (the first step of a run includes its set-up).
    pub max: f64,
    /// Intervals measured.
    pub steps: usize,
}

impl StepSpread {
    /// The spread of the intervals between consecutive instants; `None` with fewer than two.
    pub fn of(ends: &[std::time::Instant]) -> Option<Self> {
        let mut ms: Vec<f64> = ends.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e3).collect();
        if ms.is_empty() {
            return None;
        }
        ms.sort_by(f64::total_cmp);
        let n = ms.len();
        let median = if n % 2 == 1 { ms[n / 2] } else { (ms[n / 2 - 1] + ms[n / 2]) / 2.0 };
        Some(Self { median, min: ms[0], max: ms[n - 1], steps: n })
    }
}

/// The decoded-image cache during one epoch of training: lookups served from it and decoded instead, and what it
/// holds (`cache: ram` in memory; `cache: disk`, or a data-parallel run's node cache, in a mapped file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CacheTelemetry {
    /// Images served from the cache this epoch.
    pub hits: u64,
    /// Images read and decoded this epoch.
    pub misses: u64,
    /// Images held in this process's memory.
    pub memory_images: usize,
    /// Bytes held in this process's memory.
    pub memory_bytes: usize,
    /// Images held in the mapped cache file (shared by every rank of a machine).
    pub file_images: usize,
    /// Pixel bytes held in the mapped cache file.
    pub file_bytes: usize,
}

impl CacheTelemetry {
    /// The epoch's figures from the source's counters at its start (`before`) and end (`now`).
    pub fn since(before: &sluice_loader::SourceStats, now: &sluice_loader::SourceStats) -> Self {
        Self {
            hits: now.hits - before.hits,
            misses: now.misses - before.misses,
            memory_images: now.cached_images,
            memory_bytes: now.cached_bytes,
            file_images: now.node_cache_images,
            file_bytes: now.node_cache_bytes,
        }
    }

    /// The epoch table's line, `None` when nothing is cached.
    pub fn line(&self) -> Option<String> {
        let mut held = Vec::new();
        if self.memory_images > 0 {
            held.push(format!("{} images, {:.1} MB in memory", self.memory_images, self.memory_bytes as f64 / 1e6));
        }
        if self.file_images > 0 {
            held.push(format!("{} images, {:.1} MB in a mapped file", self.file_images, self.file_bytes as f64 / 1e6));
        }
        (!held.is_empty())
            .then(|| format!("  image cache: {} hits, {} misses · {}", self.hits, self.misses, held.join(" + ")))
    }
}

/// Dynamic loss scaling in one epoch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LossScaleTelemetry {
    /// The scale at the end of the epoch.
    pub scale: f32,
    /// Optimizer steps skipped in the epoch because the scaled gradients overflowed (the scale backed off).
    pub overflow_steps: u64,
}

/// The figures of one epoch: the loader-side shares ([`EpochShares`], flattened into the same JSON object) and
/// the trainer's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochTelemetry {
    /// Images/s, step, data wait, stage shares and the bottleneck.
    #[serde(flatten)]
    pub shares: EpochShares,
    /// Validation wall seconds (0 when not validated).
    pub val_s: f64,
    /// Steps skipped for a non-finite loss or gradient.
    pub nonfinite_steps: u64,
    /// Samples the loader skipped for bad input (this epoch).
    pub skipped_samples: u64,
    /// The decoded-image cache of the training split this epoch.
    pub cache: CacheTelemetry,
    /// Float16 mixed precision: the loss scale and its overflow skips (`None` without loss scaling).
    pub loss_scale: Option<LossScaleTelemetry>,
    /// Median, shortest and longest step interval of the epoch.
    pub step_interval_ms: Option<StepSpread>,
    /// The validation pass of this epoch (`None` when not validated).
    pub val: Option<ValTelemetry>,
    /// Host-blocking device reads during the training loop (all zero on the CPU, where nothing waits).
    pub blocking_syncs: SyncTelemetry,
    /// The most device memory in use after any step of the epoch (CUDA only; the allocator's pool included).
    pub device_memory_peak_bytes: Option<u64>,
    /// Device allocations in the driver's sense: the steps in which the stream-ordered pool had to reserve more
    /// memory (CUDA only; near zero once the pool holds the working set).
    pub device_pool: Option<PoolTelemetry>,
}

impl EpochTelemetry {
    /// Combines the loader's pipeline report, the source's read/decode seconds of this epoch and the loop's times.
    pub fn new(epoch: u32, times: LoopTimes, loader: &PipelineReport, read_s: f64, decode_s: f64) -> Self {
        Self {
            shares: EpochShares::new(epoch, times, loader, read_s, decode_s),
            val_s: 0.0,
            nonfinite_steps: 0,
            skipped_samples: 0,
            cache: CacheTelemetry::default(),
            loss_scale: None,
            step_interval_ms: None,
            val: None,
            blocking_syncs: SyncTelemetry::default(),
            device_memory_peak_bytes: None,
            device_pool: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    #[test]
    fn the_cache_line_counts_the_epoch_and_names_where_images_are_held() {
        let before = sluice_loader::SourceStats { hits: 10, misses: 4, ..Default::default() };
        let now = sluice_loader::SourceStats {
            hits: 138,
            misses: 4,
            node_cache_images: 128,
            node_cache_bytes: 118_000_000,
            ..Default::default()
        };
        let c = CacheTelemetry::since(&before, &now);
        assert_eq!((c.hits, c.misses, c.file_images, c.memory_images), (128, 0, 128, 0));
        let line = c.line().expect("a line");
        assert!(line.contains("128 hits, 0 misses") && line.contains("118.0 MB in a mapped file"), "{line}");
        assert_eq!(CacheTelemetry::since(&before, &before).line(), None);
    }

    #[test]
    fn step_spread_is_the_median_and_range_of_the_intervals() {
        let t0 = std::time::Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let s = StepSpread::of(&[at(0), at(10), at(30), at(35), at(135)]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.steps), (15.0, 5.0, 100.0, 4));
        assert_eq!(StepSpread::of(&[at(0), at(4), at(10)]).unwrap().median, 5.0);
        assert!(StepSpread::of(&[t0]).is_none());
    }
}
