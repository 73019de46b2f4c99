//! Where an epoch's time went: images/s, the model step, the fraction of the step loop spent waiting for data,
//! each stage's busy share, and the named bottleneck with a hint. Printed as a short table after every epoch and
//! appended to `telemetry.jsonl`.
//!
//! Stage busy % is busy time over the epoch's wall time, summed over that stage's workers, so a stage with 4 busy
//! workers shows 400%: compare it with its worker count. `read` and `decode` come from the decoded-image source
//! (cache misses only), `augment` (which composes straight into the batch slot, i.e. includes collate) from the
//! loader pipeline, `transfer`, `model` and `post-process` from the training loop itself.

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

/// The figures of one epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EpochTelemetry {
    /// 1-based epoch.
    pub epoch: u32,
    /// Training images processed.
    pub images: u64,
    /// Wall seconds of the training loop (without validation).
    pub train_s: f64,
    /// Training images per second.
    pub images_per_s: f64,
    /// Mean seconds per batch of forward + loss + backward + optimizer.
    pub step_s: f64,
    /// Seconds the loop waited for the next batch.
    pub data_wait_s: f64,
    /// `data_wait_s / train_s`.
    pub data_wait_fraction: f64,
    /// Validation wall seconds (0 when not validated).
    pub val_s: f64,
    /// Steps skipped for a non-finite loss or gradient.
    pub nonfinite_steps: u64,
    /// Samples the loader skipped for bad input (this epoch).
    pub skipped_samples: u64,
    /// Per-stage shares.
    pub stages: Vec<StageShare>,
    /// The limiting stage.
    pub bottleneck: String,
    /// What to do about it.
    pub hint: String,
}

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

impl EpochTelemetry {
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
            val_s: 0.0,
            nonfinite_steps: 0,
            skipped_samples: 0,
            stages,
            bottleneck,
            hint,
        }
    }

    /// The short table printed after the epoch.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  {:.1} img/s · step {:.0} ms · data wait {:.1}% · val {:.1} s · bottleneck: {} ({})",
            self.images_per_s,
            self.step_s * 1e3,
            self.data_wait_fraction * 100.0,
            self.val_s,
            self.bottleneck,
            self.hint
        );
        let _ = write!(s, "  busy:");
        for st in &self.stages {
            let _ = write!(s, " {} {:.0}%", st.stage, st.busy_fraction * 100.0);
            if st.workers > 1 {
                let _ = write!(s, "/{}w", st.workers);
            }
        }
        if self.nonfinite_steps > 0 || self.skipped_samples > 0 {
            let _ = write!(
                s,
                "\n  skipped: {} non-finite steps, {} bad samples",
                self.nonfinite_steps, self.skipped_samples
            );
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
        let e = EpochTelemetry::new(1, t, &report("decode"), 1.0, 7.0);
        assert_eq!(e.bottleneck, "decode");
        assert!(e.hint.contains("--workers"));
        assert!((e.images_per_s - 8.0).abs() < 1e-9);
        assert!((e.step_s - 0.4).abs() < 1e-9);
        let e = EpochTelemetry::new(1, t, &report("decode"), 7.0, 1.0);
        assert_eq!(e.bottleneck, "read");
        assert!(e.table().contains("bottleneck: read"));
    }

    #[test]
    fn compute_bound_epochs_name_the_model() {
        let t = LoopTimes { images: 80, batches: 10, wall_s: 10.0, data_wait_s: 0.2, transfer_s: 0.1, model_s: 9.5 };
        let e = EpochTelemetry::new(1, t, &report("consumer"), 1.0, 1.0);
        assert_eq!(e.bottleneck, "model");
        assert!(e.stages.iter().any(|s| s.stage == "model" && (s.busy_fraction - 0.95).abs() < 1e-9));
    }
}
