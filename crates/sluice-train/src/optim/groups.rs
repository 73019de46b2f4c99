//! The three parameter groups of Ultralytics' `build_optimizer`: conv/linear weights (decayed), BatchNorm weights
//! (not decayed) and every bias (not decayed), in the order of Ultralytics 8.4's `param_groups` and of the
//! `lr/pg0`, `lr/pg1`, `lr/pg2` columns of its `results.csv`.

use std::collections::HashSet;

use candle_core::Var;
use sluice_model::YoloV8;

use super::error::{OptimError, Result};

/// A parameter group, in `param_groups` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// `pg0`: conv/linear weights, with weight decay (Ultralytics' `g[0]`, `param_group="weight"`).
    Weight = 0,
    /// `pg1`: BatchNorm weights, no decay (`g[1]`, `param_group="bn"`).
    BnWeight = 1,
    /// `pg2`: all biases (conv and BatchNorm), no decay (`g[2]`, `param_group="bias"`); the group whose warmup
    /// starts from `warmup_bias_lr`.
    Bias = 2,
}

impl Group {
    /// All groups in `param_groups` order.
    pub const ALL: [Group; 3] = [Group::Weight, Group::BnWeight, Group::Bias];

    /// Index in `param_groups` (`pg<i>`).
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One trainable parameter and its group.
#[derive(Debug, Clone)]
pub struct Param {
    /// Ultralytics state-dict name.
    pub name: String,
    /// The variable the optimizer updates.
    pub var: Var,
    /// Its group.
    pub group: Group,
}

/// The model's trainable parameters, sorted by name, each with its group.
#[derive(Debug, Clone)]
pub struct ParamGroups {
    params: Vec<Param>,
}

impl ParamGroups {
    /// Classifies [`YoloV8::trainable_vars`] as Ultralytics does: a name containing `bias` → bias group; the
    /// weight of a normalisation layer (a variable with a `running_mean` sibling) → BN group; anything else →
    /// decayed weights. BatchNorm running statistics are not trainable and the DFL projection is a constant, so
    /// neither is ever touched by the optimizer.
    pub fn new(model: &YoloV8) -> Result<Self> {
        if model.is_fused() {
            return Err(OptimError::BadInput("a fused model cannot be trained".into()));
        }
        let bn_modules: HashSet<String> = {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let data = model.varmap().data().lock().unwrap();
            data.keys().filter_map(|k| k.strip_suffix(".running_mean").map(str::to_string)).collect()
        };
        let params: Vec<Param> = model
            .trainable_vars()
            .into_iter()
            .map(|(name, var)| {
                let module = name.rsplit_once('.').map_or("", |(m, _)| m);
                let group = if name.contains("bias") {
                    Group::Bias
                } else if bn_modules.contains(module) {
                    Group::BnWeight
                } else {
                    Group::Weight
                };
                Param { name, var, group }
            })
            .collect();
        if params.is_empty() {
            return Err(OptimError::BadInput("the model has no trainable parameters".into()));
        }
        Ok(Self { params })
    }

    /// Groups from an explicit parameter list (for tests of the update rules on small tensors).
    #[cfg(test)]
    pub(crate) fn from_params(params: Vec<Param>) -> Self {
        Self { params }
    }

    /// Every parameter, sorted by name.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Number of parameters (tensors) per group, in `param_groups` order.
    pub fn counts(&self) -> [usize; 3] {
        let mut c = [0; 3];
        for p in &self.params {
            c[p.group.index()] += 1;
        }
        c
    }

    /// Number of scalar parameters.
    pub fn numel(&self) -> usize {
        self.params.iter().map(|p| p.var.elem_count()).sum()
    }

    /// Ultralytics' log line, e.g. `57 weight(decay=0.0), 63 weight(decay=0.0005), 63 bias(decay=0.0)`. (For
    /// yolov8n Ultralytics logs 64 decayed weights: it also counts the frozen DFL projection, a constant here.)
    pub fn summary(&self, weight_decay: f64) -> String {
        let [w, bn, b] = self.counts();
        format!("{bn} weight(decay=0.0), {w} weight(decay={weight_decay}), {b} bias(decay=0.0)")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use candle_core::{DType, Device};
    use sluice_model::{Scale, YoloConfig};

    use super::*;

    #[test]
    fn yolov8n_groups_match_ultralytics_counts() {
        let model = YoloV8::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu).unwrap();
        let g = ParamGroups::new(&model).unwrap();
        // Ultralytics 8.4 logs "57 weight(decay=0.0), 64 weight(decay=0.0005), 63 bias(decay=0.0)" for yolov8n
        // with 80 classes; its 64 includes `model.22.dfl.conv.weight`, frozen (requires_grad=False) and never
        // updated, which is a constant here and not a parameter.
        assert_eq!(g.counts(), [63, 57, 63]);
        assert_eq!(g.summary(0.0005), "57 weight(decay=0.0), 63 weight(decay=0.0005), 63 bias(decay=0.0)");
        // Ultralytics' 3,157,200 parameters of yolov8n = the trainable ones + the 16 of the DFL projection.
        assert_eq!(g.numel() + 16, 3_157_200);
        for p in g.params() {
            match p.group {
                Group::Bias => assert!(p.name.ends_with(".bias"), "{}", p.name),
                Group::BnWeight => assert!(p.name.ends_with(".bn.weight"), "{}", p.name),
                Group::Weight => assert!(p.name.ends_with("conv.weight") || p.name.ends_with(".2.weight")),
            }
            assert!(!p.name.contains("running_"), "{}", p.name);
        }
    }

    #[test]
    fn yolo26_groups_count_as_ultralytics() {
        // Ultralytics 8.4.190's optimizer line for YOLO26 at depth 0.5 / width 0.125 with 6 classes
        // (`benches/ul_quick_family.py`): "114 weight(decay=0.0), 126 weight(decay=0.0005), 126 bias(decay=0.0)";
        // with reg_max 1 it has no DFL projection, so the counts are equal.
        let cfg = YoloConfig::new(Scale::custom(0.5, 0.125, 1024).unwrap(), 6).with_family(sluice_model::Family::V26);
        let model = YoloV8::new(cfg, DType::F32, &Device::Cpu).unwrap();
        let g = ParamGroups::new(&model).unwrap();
        assert_eq!(g.summary(0.0005), "114 weight(decay=0.0), 126 weight(decay=0.0005), 126 bias(decay=0.0)");
    }
}
