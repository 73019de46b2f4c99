//! Optimiser settings with Ultralytics' names and defaults, and their resolution for one run: the optimizer
//! `auto` picks, the gradient-accumulation factor to the nominal batch and the weight decay scaled to it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::error::{OptimError, Result};

/// Which optimizer to use (Ultralytics' `optimizer` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum OptimizerKind {
    /// Ultralytics' choice from the run length (see [`resolve`]).
    #[default]
    Auto,
    /// `torch.optim.SGD(momentum, nesterov=True)`.
    Sgd,
    /// `torch.optim.Adam(betas=(momentum, 0.999), eps=1e-8)`, weight decay added to the gradient.
    Adam,
    /// `torch.optim.AdamW(betas=(momentum, 0.999), eps=1e-8)`, decoupled weight decay.
    AdamW,
    /// Ultralytics' `MuSGD`: Muon's orthogonalised update plus SGD on conv weights, SGD on the rest.
    MuSgd,
}

impl OptimizerKind {
    /// Ultralytics' spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Sgd => "SGD",
            Self::Adam => "Adam",
            Self::AdamW => "AdamW",
            Self::MuSgd => "MuSGD",
        }
    }
}

impl fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OptimizerKind {
    type Err = OptimError;

    /// Case-insensitive, like Ultralytics. Its other optimizers (Adamax, NAdam, RAdam, RMSProp) are refused with
    /// a clear message.
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "sgd" => Ok(Self::Sgd),
            "adam" => Ok(Self::Adam),
            "adamw" => Ok(Self::AdamW),
            "musgd" => Ok(Self::MuSgd),
            "adamax" | "nadam" | "radam" | "rmsprop" => Err(OptimError::BadSettings(format!(
                "optimizer `{s}` is an Ultralytics optimizer sluice does not implement (use SGD, Adam, AdamW, MuSGD \
                 or auto)"
            ))),
            _ => Err(OptimError::BadSettings(format!(
                "unknown optimizer `{s}` (expected SGD, Adam, AdamW, MuSGD or auto)"
            ))),
        }
    }
}

impl TryFrom<String> for OptimizerKind {
    type Error = OptimError;

    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<OptimizerKind> for String {
    fn from(k: OptimizerKind) -> Self {
        k.name().to_string()
    }
}

/// The optimisation hyper-parameters, with Ultralytics' names and defaults (`default.yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OptimSettings {
    /// `optimizer`: SGD, Adam, AdamW, MuSGD or auto.
    pub optimizer: OptimizerKind,
    /// `lr0`: initial learning rate (ignored by `auto`).
    pub lr0: f64,
    /// `lrf`: final learning rate as a fraction of `lr0`.
    pub lrf: f64,
    /// `momentum`: SGD momentum, or Adam's β1 (ignored by `auto`).
    pub momentum: f64,
    /// `weight_decay` at the nominal batch size (scaled to the real one, see [`Resolved::weight_decay`]).
    pub weight_decay: f64,
    /// `warmup_epochs` (fractional values allowed).
    pub warmup_epochs: f64,
    /// `warmup_momentum`: SGD momentum at the first warmup iteration.
    pub warmup_momentum: f64,
    /// `warmup_bias_lr`: the bias group's learning rate at the first warmup iteration.
    pub warmup_bias_lr: f64,
    /// `nbs`: nominal batch size (gradients are accumulated up to it).
    pub nbs: usize,
    /// `cos_lr`: cosine one-cycle schedule instead of the linear one.
    pub cos_lr: bool,
}

impl Default for OptimSettings {
    fn default() -> Self {
        Self {
            optimizer: OptimizerKind::Auto,
            lr0: 0.01,
            lrf: 0.01,
            momentum: 0.937,
            weight_decay: 5e-4,
            warmup_epochs: 3.0,
            warmup_momentum: 0.8,
            warmup_bias_lr: 0.1,
            nbs: 64,
            cos_lr: false,
        }
    }
}

impl OptimSettings {
    /// Checks every value; the message names the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(OptimError::BadSettings(what));
        let finite_nonneg = [
            ("lr0", self.lr0),
            ("lrf", self.lrf),
            ("weight_decay", self.weight_decay),
            ("warmup_epochs", self.warmup_epochs),
            ("warmup_bias_lr", self.warmup_bias_lr),
        ];
        for (name, v) in finite_nonneg {
            if !v.is_finite() || v < 0.0 {
                return bad(format!("{name} must be a finite number ≥ 0, got {v}"));
            }
        }
        for (name, v) in [("momentum", self.momentum), ("warmup_momentum", self.warmup_momentum)] {
            if !v.is_finite() || !(0.0..1.0).contains(&v) {
                return bad(format!("{name} must be in [0, 1), got {v}"));
            }
        }
        if self.nbs == 0 {
            return bad("nbs must be at least 1".into());
        }
        Ok(())
    }
}

/// The size of one training run, as the optimiser needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunShape {
    /// Images per batch.
    pub batch: usize,
    /// Total epochs of the run.
    pub epochs: usize,
    /// Batches per epoch (`len(train_loader)`).
    pub batches_per_epoch: usize,
    /// Images in the training split (`len(train_loader.dataset)`, for `auto`'s iteration estimate).
    pub train_images: usize,
}

impl RunShape {
    fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.epochs == 0 || self.batches_per_epoch == 0 {
            return Err(OptimError::BadSettings(format!(
                "batch, epochs and batches per epoch must be at least 1, got {} / {} / {}",
                self.batch, self.epochs, self.batches_per_epoch
            )));
        }
        Ok(())
    }
}

/// The optimizer actually used: never `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rule {
    /// SGD with Nesterov momentum.
    Sgd,
    /// Adam (L2 penalty in the gradient).
    Adam,
    /// AdamW (decoupled weight decay).
    AdamW,
    /// Ultralytics' MuSGD: on conv weights, Muon's Newton–Schulz-orthogonalised momentum (lr × 0.2) plus SGD with
    /// Nesterov momentum and weight decay (lr × 1.0); on the other parameters SGD alone. The classification
    /// branches of the head train at three times the learning rate.
    MuSgd,
}

impl Rule {
    /// Ultralytics' (and torch's) class name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sgd => "SGD",
            Self::Adam => "Adam",
            Self::AdamW => "AdamW",
            Self::MuSgd => "MuSGD",
        }
    }

    /// Whether the update has SGD's momentum (warmed up from `warmup_momentum`), rather than Adam's β1.
    pub fn has_sgd_momentum(self) -> bool {
        matches!(self, Self::Sgd | Self::MuSgd)
    }
}

/// The settings resolved for one run, as Ultralytics' `_build_train_pipeline` and `build_optimizer` derive them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    /// The optimizer.
    pub rule: Rule,
    /// Initial learning rate of every group (`initial_lr`).
    pub lr0: f64,
    /// SGD momentum / Adam β1.
    pub momentum: f64,
    /// The bias group's warmup start (0 when `auto` chose, as Ultralytics forces it).
    pub warmup_bias_lr: f64,
    /// `weight_decay · batch · accumulate / nbs`, applied to the decay group.
    pub weight_decay: f64,
    /// Batches per optimizer step after warmup: `min(max(round(nbs / batch), 1), batches_per_epoch · epochs)`.
    pub accumulate: usize,
    /// `ceil(train_images / max(batch, nbs)) · epochs`: `auto`'s run-length estimate.
    pub iterations: usize,
}

/// Python's `round(x, 6)` (the decimal value nearest to the binary one, ties to even).
fn round6(x: f64) -> f64 {
    format!("{x:.6}").parse().unwrap_or(x)
}

/// Resolves the settings for a model with `nc` classes and a run of this shape.
///
/// `auto` follows Ultralytics 8.4.190: more than 10 000 estimated iterations → MuSGD with lr 0.01 and momentum 0.9
/// (8.0–8.3 picked SGD there), otherwise AdamW with `lr = round(0.002 · 5 / (4 + nc), 6)` and momentum 0.9; in both
/// cases `warmup_bias_lr` becomes 0.
pub fn resolve(settings: &OptimSettings, nc: usize, shape: &RunShape) -> Result<Resolved> {
    settings.validate()?;
    shape.validate()?;
    let accumulate = ((settings.nbs as f64 / shape.batch as f64).round_ties_even() as usize).max(1);
    let weight_decay = settings.weight_decay * shape.batch as f64 * accumulate as f64 / settings.nbs as f64;
    // Ultralytics then caps the accumulation at the run's batch count (after scaling the decay with the uncapped
    // value), so a run shorter than one window still steps.
    let accumulate = accumulate.min(shape.batches_per_epoch * shape.epochs);
    let iterations = shape.train_images.div_ceil(shape.batch.max(settings.nbs)) * shape.epochs;
    let (rule, lr0, momentum, warmup_bias_lr) = match settings.optimizer {
        OptimizerKind::Auto => {
            let lr_fit = round6(0.002 * 5.0 / (4.0 + nc as f64));
            if iterations > 10_000 { (Rule::MuSgd, 0.01, 0.9, 0.0) } else { (Rule::AdamW, lr_fit, 0.9, 0.0) }
        }
        OptimizerKind::Sgd => (Rule::Sgd, settings.lr0, settings.momentum, settings.warmup_bias_lr),
        OptimizerKind::Adam => (Rule::Adam, settings.lr0, settings.momentum, settings.warmup_bias_lr),
        OptimizerKind::AdamW => (Rule::AdamW, settings.lr0, settings.momentum, settings.warmup_bias_lr),
        OptimizerKind::MuSgd => (Rule::MuSgd, settings.lr0, settings.momentum, settings.warmup_bias_lr),
    };
    Ok(Resolved { rule, lr0, momentum, warmup_bias_lr, weight_decay, accumulate, iterations })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn shape(batch: usize, epochs: usize, images: usize) -> RunShape {
        RunShape { batch, epochs, batches_per_epoch: images.div_ceil(batch), train_images: images }
    }

    #[test]
    fn defaults_are_ultralytics_and_round_trip_through_serde() {
        let s = OptimSettings::default();
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(json["optimizer"], "auto");
        assert_eq!(json["lr0"], 0.01);
        assert_eq!(json["momentum"], 0.937);
        assert_eq!(json["weight_decay"], 0.0005);
        assert_eq!(json["warmup_bias_lr"], 0.1);
        assert_eq!(json["nbs"], 64);
        assert_eq!(serde_json::from_value::<OptimSettings>(json).unwrap(), s);
        // Missing fields take the defaults; names are case-insensitive.
        let partial: OptimSettings = serde_json::from_str(r#"{"optimizer": "sgd", "lr0": 0.02}"#).unwrap();
        assert_eq!(partial.optimizer, OptimizerKind::Sgd);
        assert_eq!(partial.lr0, 0.02);
        assert_eq!(partial.lrf, 0.01);
        let err = serde_json::from_str::<OptimSettings>(r#"{"optimizer": "RMSProp"}"#).unwrap_err().to_string();
        assert!(err.contains("does not implement"), "{err}");
    }

    #[test]
    fn auto_picks_like_ultralytics() {
        // coco128-sized run: 128 images, batch 16, 3 epochs → 2·3 = 6 iterations → AdamW, lr fit for 80 classes.
        let r = resolve(&OptimSettings::default(), 80, &shape(16, 3, 128)).unwrap();
        assert_eq!(r.rule, Rule::AdamW);
        assert_eq!(r.lr0, 0.000119); // round(0.01 / 84, 6)
        assert_eq!(r.momentum, 0.9);
        assert_eq!(r.warmup_bias_lr, 0.0);
        assert_eq!(r.iterations, 6);
        assert_eq!(r.accumulate, 4);
        assert_eq!(r.weight_decay, 0.0005);
        // 5 classes: round(0.01 / 9, 6) = 0.001111.
        assert_eq!(resolve(&OptimSettings::default(), 5, &shape(16, 45, 400)).unwrap().lr0, 0.001111);
        // COCO-sized: 118 287 images, 100 epochs → 1849 · 100 iterations → MuSGD 0.01 / 0.9.
        let r = resolve(&OptimSettings::default(), 80, &shape(16, 100, 118_287)).unwrap();
        assert_eq!((r.rule, r.lr0, r.momentum, r.warmup_bias_lr), (Rule::MuSgd, 0.01, 0.9, 0.0));
        // An explicit MuSGD keeps lr0, momentum and warmup_bias_lr.
        let s = OptimSettings { optimizer: "musgd".parse().unwrap(), ..Default::default() };
        let r = resolve(&s, 80, &shape(16, 3, 128)).unwrap();
        assert_eq!((r.rule, r.lr0, r.momentum, r.warmup_bias_lr), (Rule::MuSgd, 0.01, 0.937, 0.1));
        // An explicit optimizer keeps lr0, momentum and warmup_bias_lr.
        let s = OptimSettings { optimizer: OptimizerKind::Sgd, ..Default::default() };
        let r = resolve(&s, 80, &shape(16, 3, 128)).unwrap();
        assert_eq!((r.rule, r.lr0, r.momentum, r.warmup_bias_lr), (Rule::Sgd, 0.01, 0.937, 0.1));
    }

    #[test]
    fn accumulation_and_decay_scaling() {
        let s = OptimSettings::default();
        // batch 24: round(2.667) = 3 → decay · 72 / 64.
        let r = resolve(&s, 1, &shape(24, 1, 100)).unwrap();
        assert_eq!(r.accumulate, 3);
        assert_eq!(r.weight_decay, 5e-4 * 24.0 * 3.0 / 64.0);
        // batch 128: round(0.5) is 0 in Python (ties to even) → max(…, 1) = 1 → decay · 2.
        let r = resolve(&s, 1, &shape(128, 1, 100)).unwrap();
        assert_eq!(r.accumulate, 1);
        assert_eq!(r.weight_decay, 1e-3);
        // batch 48: round(1.333) = 1 → decay · 0.75.
        assert_eq!(resolve(&s, 1, &shape(48, 1, 100)).unwrap().weight_decay, 5e-4 * 48.0 / 64.0);
        // Two batches in the whole run: the accumulation is capped at 2, the decay keeps the uncapped 4.
        let r = resolve(&s, 1, &shape(16, 1, 32)).unwrap();
        assert_eq!((r.accumulate, r.weight_decay), (2, 5e-4));
    }

    #[test]
    fn bad_settings_are_named() {
        let s = OptimSettings { momentum: 1.0, ..Default::default() };
        assert!(resolve(&s, 1, &shape(8, 1, 8)).unwrap_err().to_string().contains("momentum"));
        let s = OptimSettings { lr0: f64::NAN, ..Default::default() };
        assert!(resolve(&s, 1, &shape(8, 1, 8)).unwrap_err().to_string().contains("lr0"));
        let zero = RunShape { batch: 0, epochs: 1, batches_per_epoch: 1, train_images: 8 };
        let e = resolve(&OptimSettings::default(), 1, &zero).unwrap_err().to_string();
        assert!(e.contains("batch"), "{e}");
    }
}
