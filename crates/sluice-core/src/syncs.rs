//! Counting host-blocking device reads.
//!
//! Every place where the host waits for the device (a tensor read back with `to_vec`/`to_scalar`, a
//! `to_device(Cpu)`, an event or stream synchronize) calls [`record`] with its [`Site`] when the tensor lives on
//! an accelerator. On the CPU backend a "read" is a memcpy, nothing waits, and callers do not record it. The
//! trainer takes a [`snapshot`] before and after each epoch and each validation and reports the difference per
//! batch, which is how the design's "zero blocking syncs per batch" is checked on a device run rather than
//! assumed.
//!
//! The counters are process-wide relaxed atomics: cheap enough for the hot path, and a count read between two
//! snapshots on the same thread is exact.

use std::sync::atomic::{AtomicU64, Ordering};

/// Where a host-blocking read happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Site {
    /// The loss's task-aligned assigner reading scores and boxes back to the host.
    Assigner,
    /// Loss components read back for logging.
    LossItems,
    /// The optimizer's non-finite check on the loss / gradient norm.
    NonFiniteCheck,
    /// A transfer slot's previous copy not yet finished when the slot came round again.
    TransferSlot,
    /// Validation: sizing the shrunk buffer from the per-image counts.
    ShrinkFit,
    /// Validation: the shrunk predictions copied to the host.
    ShrinkCopy,
    /// Data-parallel training: device gradients copied to the host for the CPU engine's all-reduce.
    GradReduce,
    /// Any other explicit synchronize.
    Other,
}

impl Site {
    /// Every site, in report order.
    pub const ALL: [Site; 8] = [
        Site::Assigner,
        Site::LossItems,
        Site::NonFiniteCheck,
        Site::TransferSlot,
        Site::ShrinkFit,
        Site::ShrinkCopy,
        Site::GradReduce,
        Site::Other,
    ];

    /// A short name for reports and JSON keys.
    pub fn name(self) -> &'static str {
        match self {
            Site::Assigner => "assigner",
            Site::LossItems => "loss_items",
            Site::NonFiniteCheck => "nonfinite_check",
            Site::TransferSlot => "transfer_slot",
            Site::ShrinkFit => "shrink_fit",
            Site::ShrinkCopy => "shrink_copy",
            Site::GradReduce => "grad_reduce",
            Site::Other => "other",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

static COUNTS: [AtomicU64; Site::ALL.len()] = [const { AtomicU64::new(0) }; Site::ALL.len()];

/// Records one host-blocking read at `site`.
pub fn record(site: Site) {
    COUNTS[site.index()].fetch_add(1, Ordering::Relaxed);
}

/// Records a read at `site` only when `on_device` (the tensor is not in host memory).
pub fn record_if(on_device: bool, site: Site) {
    if on_device {
        record(site);
    }
}

/// The counts so far, per site.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([u64; Site::ALL.len()]);

impl Counts {
    /// The count at `site`.
    pub fn get(&self, site: Site) -> u64 {
        self.0[site.index()]
    }

    /// All sites together.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut d = [0u64; Site::ALL.len()];
        for (i, v) in d.iter_mut().enumerate() {
            *v = self.0[i].saturating_sub(earlier.0[i]);
        }
        Counts(d)
    }

    /// `(site name, count)` for every site with a non-zero count.
    pub fn nonzero(&self) -> Vec<(&'static str, u64)> {
        Site::ALL.iter().filter(|s| self.get(**s) > 0).map(|s| (s.name(), self.get(*s))).collect()
    }
}

/// The counts so far.
pub fn snapshot() -> Counts {
    let mut c = [0u64; Site::ALL.len()];
    for (i, v) in c.iter_mut().enumerate() {
        *v = COUNTS[i].load(Ordering::Relaxed);
    }
    Counts(c)
}

/// Host-blocking device reads over a span of batches .
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct SyncTelemetry {
    /// All sites together.
    pub total: u64,
    /// `total` per batch.
    pub per_batch: f64,
    /// Per site (only sites with a count).
    pub by_site: std::collections::BTreeMap<&'static str, u64>,
}

impl SyncTelemetry {
    /// The reads between `before` and now, over `batches` batches.
    pub fn since(before: &Counts, batches: u64) -> Self {
        let d = snapshot().since(before);
        Self {
            total: d.total(),
            per_batch: d.total() as f64 / batches.max(1) as f64,
            by_site: d.nonzero().into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_per_site_and_differences_are_exact() {
        let a = snapshot();
        record(Site::LossItems);
        record(Site::LossItems);
        record_if(false, Site::Assigner);
        record_if(true, Site::ShrinkCopy);
        let d = snapshot().since(&a);
        // No other test in this crate records, so the differences are exact.
        assert_eq!(d.get(Site::LossItems), 2);
        assert_eq!(d.get(Site::Assigner), 0);
        assert_eq!(d.get(Site::ShrinkCopy), 1);
        assert_eq!(d.total(), 3);
        assert!(d.nonzero().iter().any(|(n, _)| *n == "loss_items"));
        assert_eq!(Counts::default().total(), 0);
    }

    #[test]
    fn names_are_unique() {
        let mut n: Vec<_> = Site::ALL.iter().map(|s| s.name()).collect();
        n.sort_unstable();
        n.dedup();
        assert_eq!(n.len(), Site::ALL.len());
        for (i, s) in Site::ALL.iter().enumerate() {
            assert_eq!(s.index(), i);
        }
    }
}
