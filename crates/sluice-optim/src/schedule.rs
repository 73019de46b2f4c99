//! The learning-rate schedule and the warmup of Ultralytics' trainer: the per-epoch factor `lf` (linear or
//! cosine one-cycle), the number of warmup iterations, and NumPy's `interp` and round-half-to-even as the trainer
//! evaluates them.

use serde::{Deserialize, Serialize};

/// The schedule of one run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Total epochs.
    pub epochs: usize,
    /// Final learning-rate fraction.
    pub lrf: f64,
    /// Cosine one-cycle instead of linear.
    pub cos_lr: bool,
    /// Warmup iterations: iterations `ni < nw` are warmup.
    pub nw: usize,
}

impl Schedule {
    /// The schedule for a run of `epochs` epochs of `batches_per_epoch` batches.
    pub fn new(epochs: usize, lrf: f64, cos_lr: bool, warmup_epochs: f64, batches_per_epoch: usize) -> Self {
        Self { epochs, lrf, cos_lr, nw: warmup_iterations(warmup_epochs, epochs, batches_per_epoch) }
    }

    /// The learning-rate factor of `epoch` (`self.lf` of the trainer): linear
    /// `max(1 − e/epochs, 0)·(1 − lrf) + lrf`, or `one_cycle(1, lrf, epochs)`:
    /// `max((1 − cos(e·π/epochs))/2, 0)·(lrf − 1) + 1`.
    pub fn lf(&self, epoch: usize) -> f64 {
        let x = epoch as f64;
        let n = self.epochs as f64;
        if self.cos_lr {
            ((1.0 - (x * std::f64::consts::PI / n).cos()) / 2.0).max(0.0) * (self.lrf - 1.0) + 1.0
        } else {
            (1.0 - x / n).max(0.0) * (1.0 - self.lrf) + self.lrf
        }
    }

    /// Whether iteration `ni` is a warmup iteration: Ultralytics 8.4.190's `nw and ni <= nw`, so that iteration
    /// `nw` lands the accumulation, learning rates and momentum exactly on their targets.
    pub fn in_warmup(&self, ni: usize) -> bool {
        self.nw > 0 && ni <= self.nw
    }

    /// `np.interp(ni, [0, nw], [start, end])`.
    pub fn warmup_interp(&self, ni: usize, start: f64, end: f64) -> f64 {
        interp(ni as f64, 0.0, self.nw as f64, start, end)
    }
}

/// Ultralytics 8.4's `_get_warmup_iterations`: `round(min(warmup_epochs, max(epochs − 1, 0)) · nb)` when that
/// epoch count is positive, else 0, so the last epoch always trains at the scheduled rate. (Ultralytics 8.0–8.3
/// used `max(round(warmup_epochs · nb), 100)`.)
pub fn warmup_iterations(warmup_epochs: f64, epochs: usize, batches_per_epoch: usize) -> usize {
    let w = warmup_epochs.min(epochs.saturating_sub(1) as f64);
    if w > 0.0 { (w * batches_per_epoch as f64).round_ties_even() as usize } else { 0 }
}

/// NumPy's `interp` for two points, in its operation order: the end values at the ends, else
/// `slope·(x − x0) + y0` with `slope = (y1 − y0)/(x1 − x0)`; outside the range, the nearest end value.
pub fn interp(x: f64, x0: f64, x1: f64, y0: f64, y1: f64) -> f64 {
    if x >= x1 {
        y1
    } else if x <= x0 {
        y0
    } else {
        let slope = (y1 - y0) / (x1 - x0);
        let y = slope * (x - x0) + y0;
        if y.is_nan() { slope * (x - x1) + y1 } else { y }
    }
}

/// The warmup's gradient-accumulation factor: `max(1, int(np.interp(ni, [0, nw], [1, acc0]).round()))`, where
/// `acc0` is the nominal (rounded and capped) accumulation of [`Resolved::accumulate`](super::Resolved), so the
/// ramp ends on it.
pub fn warmup_accumulate(schedule: &Schedule, ni: usize, nominal: usize) -> usize {
    let a = schedule.warmup_interp(ni, 1.0, nominal as f64).round_ties_even();
    (a as usize).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_and_cosine_factors() {
        let s = Schedule { epochs: 10, lrf: 0.01, cos_lr: false, nw: 0 };
        assert_eq!(s.lf(0), 1.0);
        assert!((s.lf(5) - (0.5 * 0.99 + 0.01)).abs() < 1e-15);
        assert_eq!(s.lf(10), 0.01);
        assert_eq!(s.lf(12), 0.01); // clamped like Ultralytics' max(…, 0)
        let c = Schedule { cos_lr: true, ..s };
        assert_eq!(c.lf(0), 1.0);
        assert!((c.lf(5) - (0.5 * (0.01 - 1.0) + 1.0)).abs() < 1e-15);
        assert!((c.lf(10) - 0.01).abs() < 1e-15);
        // Monotone in between.
        assert!((1..10).all(|e| c.lf(e) < c.lf(e - 1) && s.lf(e) < s.lf(e - 1)));
    }

    #[test]
    fn warmup_iterations_follow_ultralytics_8_4() {
        assert_eq!(warmup_iterations(3.0, 100, 50), 150);
        assert_eq!(warmup_iterations(3.0, 3, 8), 16); // capped at epochs − 1
        assert_eq!(warmup_iterations(3.0, 1, 8), 0); // a single epoch has no warmup
        assert_eq!(warmup_iterations(0.0, 10, 8), 0);
        assert_eq!(warmup_iterations(0.5, 10, 5), 2); // round(2.5) = 2, ties to even
        assert_eq!(warmup_iterations(1.5, 10, 5), 8); // round(7.5) = 8
    }

    #[test]
    fn interp_and_accumulate_match_numpy() {
        assert_eq!(interp(0.0, 0.0, 100.0, 0.1, 0.01), 0.1);
        assert_eq!(interp(100.0, 0.0, 100.0, 0.1, 0.01), 0.01);
        assert_eq!(interp(150.0, 0.0, 100.0, 0.1, 0.01), 0.01);
        assert_eq!(interp(25.0, 0.0, 100.0, 0.0, 0.01), 0.01 / 100.0 * 25.0);
        let s = Schedule { epochs: 10, lrf: 0.01, cos_lr: false, nw: 100 };
        // Nominal 4 (batch 16): 1 + 3·ni/100; 2.5 at ni = 50 rounds to 2 (NumPy rounds half to even).
        assert_eq!(warmup_accumulate(&s, 0, 4), 1);
        assert_eq!(warmup_accumulate(&s, 50, 4), 2);
        assert_eq!(warmup_accumulate(&s, 51, 4), 3);
        assert_eq!(warmup_accumulate(&s, 99, 4), 4);
        assert_eq!(warmup_accumulate(&s, 100, 4), 4);
        // Nominal 3 (batch 24: round(64 / 24)): the ramp ends on 3, not on 64 / 24 = 2.67.
        assert_eq!(warmup_accumulate(&s, 80, 3), 3);
        assert_eq!(warmup_accumulate(&s, 100, 3), 3);
        // Nominal 1 (batch 128): never below 1.
        assert_eq!(warmup_accumulate(&s, 99, 1), 1);
        // Iteration nw is the last warmup iteration; none without warmup.
        assert!(s.in_warmup(100) && !s.in_warmup(101));
        assert!(!Schedule { nw: 0, ..s }.in_warmup(0));
    }
}
