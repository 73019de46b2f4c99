//! Where a loader-fed loop's time went: images/s, the step, the fraction of the loop spent waiting for data, each
//! stage's busy share and the named bottleneck with a hint ([`EpochShares`]). The trainer adds its own figures
//! (validation, device memory, skipped steps) around these; `sluice bench loader` reports them alone.
//!
//! Stage busy % is busy time over the loop's wall time, summed over that stage's workers, so a stage with 4 busy
//! workers shows 400%: compare it with its worker count. `read` and `decode` come from the decoded-image source
//! (cache misses only), `augment` from the loader pipeline, `transfer` and `model` from the loop itself. There is no
//! separate collate step: the augment stage composes each sample straight into its pooled batch slot (pixels,
//! targets, ids), so collate's time is inside `augment`'s and the table says `collate (in augment)` instead of a
//! number.

use std::fmt::Write as _;

use serde::Serialize;
use sluice_core::PipelineReport;

/// Above this fraction of the loop's time spent waiting for batches, the run is data-bound.
pub const DATA_BOUND_WAIT: f64 = 0.10;

/// One stage's share of an epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageShare {
    /// `read`, `decode`, `augment`, `transfer`, `model`, `post-process`.
    pub stage: String,
    /// Worker threads (1 for the loop's own stages).
    pub workers: usize,
    /// Busy seconds, summed over workers.
    pub busy_s: f64,
    /// Busy seconds over wall seconds (can exceed 1 with several workers).
    pub busy_fraction: f64,
}

/// Where collate's time is accounted: the augment stage writes each sample straight into its batch slot.
pub const COLLATE: &str = "in augment";

/// Loop-side timings of an epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoopTimes {
    /// Images trained on.
    pub images: u64,
    /// Batches trained on.
    pub batches: u64,
    /// Wall seconds of the loop.
    pub wall_s: f64,
    /// Waiting for the loader.
    pub data_wait_s: f64,
    /// Host → device.
    pub transfer_s: f64,
    /// Forward + loss + backward + optimizer.
    pub model_s: f64,
}

/// The loader-side figures of one epoch (or one timed pass of a loader).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochShares {
    /// 1-based epoch.
    pub epoch: u32,
    /// Images processed.
    pub images: u64,
    /// Wall seconds of the loop (without validation).
    pub train_s: f64,
    /// Images per second.
    pub images_per_s: f64,
    /// Mean seconds per batch of the model step (forward + loss + backward + optimizer in training).
    pub step_s: f64,
    /// Seconds the loop waited for the next batch.
    pub data_wait_s: f64,
    /// `data_wait_s / train_s`.
    pub data_wait_fraction: f64,
    /// Per-stage shares.
    pub stages: Vec<StageShare>,
    /// Where collate's time is: [`COLLATE`] (no separate step, so no share of its own).
    pub collate: &'static str,
    /// The limiting stage.
    pub bottleneck: String,
    /// What to do about it.
    pub hint: String,
}

impl EpochShares {
    /// Combines the loader's pipeline report, the source's read/decode seconds of this epoch and the loop's times.
    pub fn new(epoch: u32, times: LoopTimes, loader: &PipelineReport, read_s: f64, decode_s: f64) -> Self {
        let wall = times.wall_s.max(1e-9);
        let share = |stage: &str, workers: usize, busy_s: f64| StageShare {
            stage: stage.to_string(),
            workers,
            busy_s,
            busy_fraction: busy_s / wall,
        };
        let workers_of = |name: &str| loader.stages.iter().find(|s| s.name == name).map_or(1, |s| s.workers);
        let busy_of = |name: &str| loader.stages.iter().find(|s| s.name == name).map_or(0.0, |s| s.busy_s);
        let stages = vec![
            share("read", workers_of("decode"), read_s),
            share("decode", workers_of("decode"), decode_s),
            share("augment", workers_of("augment"), busy_of("augment")),
            share("transfer", 1, times.transfer_s),
            share("model", 1, times.model_s),
        ];
        let data_wait_fraction = times.data_wait_s / wall;
        let (bottleneck, hint) = if data_wait_fraction > DATA_BOUND_WAIT {
            // The loader's slowest stage, split into read vs decode by where the decode stage spent its time.
            let stage = match loader.bottleneck.as_str() {
                "decode" if read_s > decode_s => "read",
                "consumer" | "" => "decode",
                s => s,
            };
            let hint = match stage {
                "read" => "read-bound: use --cache ram, pack the dataset (sluice pack) or faster storage",
                "decode" => "decode-bound: raise --workers or use --cache ram",
                _ => "augment-bound: raise --workers or lower mosaic/affine augmentation",
            };
            (stage.to_string(), hint.to_string())
        } else {
            ("model".to_string(), "compute-bound: the data pipeline keeps up; the model step is the limit".to_string())
        };
        Self {
            epoch,
            images: times.images,
            train_s: times.wall_s,
            images_per_s: times.images as f64 / wall,
            step_s: times.model_s / (times.batches.max(1) as f64),
            data_wait_s: times.data_wait_s,
            data_wait_fraction,
            stages,
            collate: COLLATE,
            bottleneck,
            hint,
        }
    }

    /// The `busy:` line of the epoch table: every stage's share, with its worker count when above one.
    pub fn busy_line(&self) -> String {
        let mut s = String::from("  busy:");
        for st in &self.stages {
            let _ = write!(s, " {} {:.0}%", st.stage, st.busy_fraction * 100.0);
            if st.workers > 1 {
                let _ = write!(s, "/{}w", st.workers);
            }
            if st.stage == "augment" {
                let _ = write!(s, " collate ({})", self.collate);
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::StageReport;

    fn report(bottleneck: &str) -> PipelineReport {
        let stage = |name: &'static str, busy_s: f64| StageReport {
            name,
            workers: 2,
            items: 10,
            bytes: 0,
            busy_s,
            wait_input_s: 0.0,
            wait_output_s: 0.0,
        };
        PipelineReport {
            stages: vec![stage("decode", 8.0), stage("augment", 1.0)],
            delivered: 10,
            wall_s: 10.0,
            consumer_wait_s: 5.0,
            consumer_wait_fraction: 0.5,
            bottleneck: bottleneck.into(),
        }
    }

    #[test]
    fn data_bound_epochs_name_the_loader_stage() {
        let t = LoopTimes { images: 80, batches: 10, wall_s: 10.0, data_wait_s: 5.0, transfer_s: 0.1, model_s: 4.0 };
        let e = EpochShares::new(1, t, &report("decode"), 1.0, 7.0);
        assert_eq!(e.bottleneck, "decode");
        assert!(e.hint.contains("--workers"));
        assert!((e.images_per_s - 8.0).abs() < 1e-9);
        assert!((e.step_s - 0.4).abs() < 1e-9);
        let e = EpochShares::new(1, t, &report("decode"), 7.0, 1.0);
        assert_eq!(e.bottleneck, "read");
    }

    #[test]
    fn compute_bound_epochs_name_the_model() {
        let t = LoopTimes { images: 80, batches: 10, wall_s: 10.0, data_wait_s: 0.2, transfer_s: 0.1, model_s: 9.5 };
        let e = EpochShares::new(1, t, &report("consumer"), 1.0, 1.0);
        assert_eq!(e.bottleneck, "model");
        assert!(e.stages.iter().any(|s| s.stage == "model" && (s.busy_fraction - 0.95).abs() < 1e-9));
        assert!(e.busy_line().contains("augment 10%/2w collate (in augment) transfer"), "{}", e.busy_line());
    }
}
