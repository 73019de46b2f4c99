//! The table the `sluice train` console prints after every epoch, from the trainer's [`EpochTelemetry`].

use std::fmt::Write as _;

use sluice_train::train::telemetry::{EpochTelemetry, SyncTelemetry};

/// The short table printed after each epoch: images/s, the step, the data wait, the bottleneck and its hint, the
/// stages' busy shares, then the lines that apply (step spread, cache, validation, device memory and pool, blocking
/// reads, loss scale, skips).
pub(crate) fn epoch_table(t: &EpochTelemetry) -> String {
    let e = &t.shares;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "  {:.1} img/s · step {:.0} ms · data wait {:.1}% · val {:.1} s · bottleneck: {} ({})",
        e.images_per_s,
        e.step_s * 1e3,
        e.data_wait_fraction * 100.0,
        t.val_s,
        e.bottleneck,
        e.hint
    );
    s.push_str(&e.busy_line());
    if let Some(st) = &t.step_interval_ms {
        let _ = write!(
            s,
            "\n  step interval median {:.1} ms (range {:.1}–{:.1}, {} steps)",
            st.median, st.min, st.max, st.steps
        );
    }
    if let Some(line) = t.cache.line() {
        let _ = write!(s, "\n{line}");
    }
    if let Some(v) = &t.val {
        let _ = write!(s, "\n{}", v.line());
    }
    let syncs = |t: &SyncTelemetry| t.by_site.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ");
    if let Some(m) = t.device_memory_peak_bytes {
        let _ = write!(s, "\n  device memory peak {:.2} GiB", m as f64 / (1u64 << 30) as f64);
    }
    if let Some(p) = &t.device_pool {
        let _ = write!(
            s,
            "\n  device pool grew in {} of {} steps (+{:.1} MiB)",
            p.growth_steps,
            p.steps,
            p.grown_bytes as f64 / (1u64 << 20) as f64
        );
    }
    if t.blocking_syncs.total > 0 {
        let b = &t.blocking_syncs;
        let _ = write!(s, "\n  blocking device reads: {:.1}/batch in training ({})", b.per_batch, syncs(b));
    }
    if let Some(v) = t.val.as_ref().filter(|v| v.blocking_syncs.total > 0) {
        let b = &v.blocking_syncs;
        let _ = write!(s, "\n  blocking device reads: {:.1}/batch in validation ({})", b.per_batch, syncs(b));
    }
    if let Some(l) = &t.loss_scale {
        let _ = write!(s, "\n  loss scale {} · {} steps skipped for float16 overflow", l.scale, l.overflow_steps);
    }
    if t.nonfinite_steps > 0 || t.skipped_samples > 0 {
        let _ = write!(s, "\n  skipped: {} non-finite steps, {} bad samples", t.nonfinite_steps, t.skipped_samples);
    }
    s
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::PipelineReport;
    use sluice_eval::StreamStats;
    use sluice_train::train::telemetry::{LoopTimes, ValTelemetry};

    use super::*;

    /// A loader report in which the consumer (the model step) bounds the epoch; the loader-side shares are
    /// `sluice_loader::telemetry`'s to test.
    fn report(bottleneck: &str) -> PipelineReport {
        PipelineReport { bottleneck: bottleneck.into(), ..PipelineReport::default() }
    }

    #[test]
    fn blocking_device_reads_are_reported_per_batch_only_when_there_are_any() {
        let t = LoopTimes { images: 80, batches: 10, wall_s: 10.0, data_wait_s: 0.2, transfer_s: 0.1, model_s: 9.5 };
        let mut e = EpochTelemetry::new(1, t, &report("consumer"), 1.0, 1.0);
        assert!(!epoch_table(&e).contains("blocking"));
        let before = sluice_core::syncs::snapshot();
        e.blocking_syncs = SyncTelemetry::since(&before, 10);
        assert_eq!(e.blocking_syncs.total, 0);
        e.blocking_syncs = SyncTelemetry {
            total: 15,
            per_batch: 1.5,
            by_site: [("loss_items", 10), ("nonfinite_check", 5)].into_iter().collect(),
        };
        let table = epoch_table(&e);
        assert!(
            table.contains("blocking device reads: 1.5/batch in training (loss_items 10, nonfinite_check 5)"),
            "{table}"
        );
        assert!(!table.contains("device memory"));
        e.device_memory_peak_bytes = Some(3 << 30);
        assert!(epoch_table(&e).contains("device memory peak 3.00 GiB"), "{}", epoch_table(&e));
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(json["blocking_syncs"]["by_site"]["loss_items"], 10);
        assert_eq!(json["device_memory_peak_bytes"], 3u64 << 30);
        assert!(!epoch_table(&e).contains("device pool"));
        let mut g = sluice_transfer::PoolGrowth::new();
        for r in [10u64 << 20, 12 << 20, 12 << 20, 12 << 20, 12 << 20] {
            g.observe(Some(r));
        }
        e.device_pool = Some(g.into());
        assert!(epoch_table(&e).contains("device pool grew in 1 of 4 steps (+2.0 MiB)"), "{}", epoch_table(&e));
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(json["device_pool"]["growths_per_step"], 0.25);
    }

    #[test]
    fn the_table_names_collate_and_the_validation_pass() {
        let t = LoopTimes { images: 80, batches: 10, wall_s: 10.0, data_wait_s: 0.2, transfer_s: 0.1, model_s: 9.5 };
        let mut e = EpochTelemetry::new(1, t, &report("consumer"), 1.0, 1.0);
        assert!(epoch_table(&e).contains("collate (in augment) transfer"), "{}", epoch_table(&e));
        assert!(!epoch_table(&e).contains("val:"));
        let stats = StreamStats {
            images: 40,
            workers: 2,
            worker_busy: Duration::from_millis(1500),
            submit_blocked: Duration::from_millis(50),
            finish_wait: Duration::from_millis(20),
            wall: Duration::from_secs(2),
            ..StreamStats::default()
        };
        e.val = Some(ValTelemetry::new(40, 2.0, 0.1, 1.7, &stats));
        let v = e.val.as_ref().map(|v| (v.images_per_s, v.post_process_busy_fraction, v.bound.clone()));
        assert_eq!(v, Some((20.0, 0.75, "inference".to_string())));
        let table = epoch_table(&e);
        let line = table.lines().last().unwrap_or_default();
        assert!(line.contains("val: 20.0 img/s") && line.contains("post-process 75%/2w"), "{table}");
        assert!(line.contains("queue wait 0.05 s, drain 0.02 s · bound: inference"), "{table}");
        let json = serde_json::to_value(&e).map_err(|e| e.to_string());
        assert_eq!(json.map(|j| j["collate"].clone()), Ok(serde_json::json!("in augment")));
    }
}
