//! The figures of one validation pass: images/s, the loader wait, the inference and post-process shares and what
//! bound the pass. The trainer prints them under each validated epoch's table; `sluice val` prints them too.

use serde::Serialize;
use sluice_core::syncs::SyncTelemetry;
use sluice_eval::StreamStats;
use sluice_loader::telemetry::DATA_BOUND_WAIT;

/// The figures of one validation pass.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ValTelemetry {
    /// Images validated.
    pub images: u64,
    /// Wall seconds of the pass.
    pub seconds: f64,
    /// Validation images per second (over the whole pass, final drain included).
    pub images_per_s: f64,
    /// Fraction of the pass the inference loop waited for the val loader.
    pub data_wait_fraction: f64,
    /// Busy share of the inference loop (transfer, eval forward, validation loss, shrink and copy to the host).
    pub inference_busy_fraction: f64,
    /// Share of the pass the GPU spent on inference, from CUDA events on its compute stream (`None` on the CPU;
    /// [`ValTelemetry::with_gpu`]).
    pub gpu_busy_fraction: Option<f64>,
    /// Whether the post-process ran NMS (false: an end-to-end head's top-k output, matched as it is).
    pub nms: bool,
    /// Post-process (NMS + matching) worker threads.
    pub post_process_workers: usize,
    /// Post-process busy seconds, summed over its workers.
    pub post_process_busy_s: f64,
    /// `post_process_busy_s` over the pass's wall seconds (can exceed 1 with several workers).
    pub post_process_busy_fraction: f64,
    /// Seconds inference waited for room in the post-process queue (blocked in `submit`).
    pub post_process_queue_wait_s: f64,
    /// Seconds after the last batch waiting for the workers to drain the queue.
    pub post_process_drain_s: f64,
    /// Images whose candidates the device-side shrink step cut at `top_k`.
    pub truncated_images: u64,
    /// What bounded the pass: `post-process`, `data` or `inference`.
    pub bound: String,
    /// Host-blocking device reads during the pass (all zero on the CPU, where nothing waits).
    pub blocking_syncs: SyncTelemetry,
}

impl ValTelemetry {
    /// From a pass's images, wall seconds, loader wait, inference busy seconds and post-process figures.
    /// The bound is the side the inference loop waited on most, if it waited on the post-process queue more
    /// than [`StreamStats::post_process_bound`]'s 5% or on the loader more than [`DATA_BOUND_WAIT`]; otherwise
    /// inference.
    pub fn new(images: u64, seconds: f64, data_wait_s: f64, inference_s: f64, stats: &StreamStats) -> Self {
        let wall = seconds.max(1e-9);
        let busy = stats.worker_busy.as_secs_f64();
        let post_wait = (stats.submit_blocked + stats.finish_wait).as_secs_f64();
        let data_wait_fraction = data_wait_s / wall;
        let post_bound = stats.post_process_bound();
        let data_bound = data_wait_fraction > DATA_BOUND_WAIT;
        let bound = match (post_bound, data_bound) {
            (true, true) if data_wait_s > post_wait => "data",
            (true, _) => "post-process",
            (false, true) => "data",
            (false, false) => "inference",
        };
        Self {
            images,
            seconds,
            images_per_s: images as f64 / wall,
            data_wait_fraction,
            inference_busy_fraction: inference_s / wall,
            gpu_busy_fraction: None,
            nms: true,
            post_process_workers: stats.workers,
            post_process_busy_s: busy,
            post_process_busy_fraction: busy / wall,
            post_process_queue_wait_s: stats.submit_blocked.as_secs_f64(),
            post_process_drain_s: stats.finish_wait.as_secs_f64(),
            truncated_images: stats.truncated_images,
            bound: bound.to_string(),
            blocking_syncs: SyncTelemetry::default(),
        }
    }

    /// These figures with the device seconds of inference (`ValResult::gpu_s`), as the GPU's busy share.
    pub fn with_gpu(self, gpu_s: Option<f64>) -> Self {
        Self { gpu_busy_fraction: gpu_s.map(|g| g / self.seconds.max(1e-9)), ..self }
    }

    /// One line for the console.
    pub fn line(&self) -> String {
        format!(
            "  val: {:.1} img/s · {:.1} s · data wait {:.0}% · inference {:.0}%{} · post-process{} {:.0}%/{}w, \
             queue wait {:.2} s, drain {:.2} s · bound: {}{}",
            self.images_per_s,
            self.seconds,
            self.data_wait_fraction * 100.0,
            self.inference_busy_fraction * 100.0,
            self.gpu_busy_fraction.map_or(String::new(), |g| format!(" (GPU busy {:.0}%)", g * 100.0)),
            if self.nms { "" } else { " (no NMS: end-to-end top-k)" },
            self.post_process_busy_fraction * 100.0,
            self.post_process_workers,
            self.post_process_queue_wait_s,
            self.post_process_drain_s,
            self.bound,
            if self.truncated_images > 0 {
                format!(" · {} images cut by top_k", self.truncated_images)
            } else {
                String::new()
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_validation_bound_is_the_longest_wait() {
        let stats = |blocked_ms, wall_s| StreamStats {
            workers: 2,
            submit_blocked: Duration::from_millis(blocked_ms),
            wall: Duration::from_secs(wall_s),
            ..StreamStats::default()
        };
        // Waited 0.5 s of 2 s on the post-process queue: post-process-bound.
        let v = ValTelemetry::new(10, 2.0, 0.0, 1.0, &stats(20, 2));
        assert_eq!(v.gpu_busy_fraction, None);
        assert!(!v.line().contains("GPU"));
        let g = v.with_gpu(Some(1.5));
        assert_eq!(g.gpu_busy_fraction, Some(0.75));
        assert!(g.line().contains("inference 50% (GPU busy 75%)"), "{}", g.line());
        assert_eq!(ValTelemetry::new(10, 2.0, 0.0, 1.0, &stats(500, 2)).bound, "post-process");
        // Waited 0.6 s on the loader, 0.02 s on post-processing: data-bound.
        assert_eq!(ValTelemetry::new(10, 2.0, 0.6, 1.0, &stats(20, 2)).bound, "data");
        // Both above their thresholds: the longer wait wins.
        assert_eq!(ValTelemetry::new(10, 2.0, 0.3, 1.0, &stats(500, 2)).bound, "post-process");
        assert_eq!(ValTelemetry::new(10, 2.0, 0.9, 1.0, &stats(500, 2)).bound, "data");
    }
}
