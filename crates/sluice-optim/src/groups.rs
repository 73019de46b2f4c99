//! The parameter groups of Ultralytics' `build_optimizer`: conv/linear weights (decayed), BatchNorm weights (not
//! decayed) and every bias (not decayed), in the order of Ultralytics 8.4's `param_groups` and of the `lr/pg0`,
//! `lr/pg1`, `lr/pg2` columns of its `results.csv`. For MuSGD a fourth kind, the matrices and conv filters Muon
//! orthogonalises, and each kind split in two: the head's classification branches (`cv3`, `one2one_cv3`) at three
//! times the learning rate, then the rest, so eight groups in Ultralytics' order (`lr/pg0` … `lr/pg7`).

use std::collections::HashSet;

use candle_core::Var;
use sluice_model::Yolo;

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
    /// MuSGD only: every parameter of rank 2 or 4 (conv filters), decayed, updated by Muon and SGD (`g[3]`,
    /// `param_group="muon"`).
    Muon = 3,
}

impl Group {
    /// The groups of SGD and Adam, in `param_groups` order.
    pub const ALL: [Group; 3] = [Group::Weight, Group::BnWeight, Group::Bias];

    /// Index in `param_groups` (`pg<i>`) without MuSGD's split.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Ultralytics' `param_group` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Weight => "weight",
            Self::BnWeight => "bn",
            Self::Bias => "bias",
            Self::Muon => "muon",
        }
    }
}

/// MuSGD's learning-rate factor of the boosted groups (`lr * 3` in `build_optimizer`).
pub const BOOST: f64 = 3.0;

/// One trainable parameter and its group.
#[derive(Debug, Clone)]
pub struct Param {
    /// Ultralytics state-dict name.
    pub name: String,
    /// The variable the optimizer updates.
    pub var: Var,
    /// Its group.
    pub group: Group,
    /// MuSGD: a parameter of the head's classification branches, trained at [`BOOST`] times the learning rate.
    pub boosted: bool,
}

/// The model's trainable parameters, sorted by name, each with its group.
#[derive(Debug, Clone)]
pub struct ParamGroups {
    params: Vec<Param>,
    /// MuSGD's eight groups rather than three.
    muon: bool,
}

impl ParamGroups {
    /// Classifies [`Yolo::trainable_vars`] as Ultralytics does: a name containing `bias` → bias group; the
    /// weight of a normalisation layer (a variable with a `running_mean` sibling) → BN group; anything else →
    /// decayed weights. BatchNorm running statistics are not trainable and the DFL projection is a constant, so
    /// neither is ever touched by the optimizer.
    pub fn new(model: &Yolo) -> Result<Self> {
        Self::build(model, false)
    }

    /// MuSGD's groups: as [`ParamGroups::new`], except that every parameter of rank 2 or 4 goes to
    /// [`Group::Muon`] first, and the parameters of the head's `cv3` and `one2one_cv3` are marked boosted.
    pub fn new_muon(model: &Yolo) -> Result<Self> {
        Self::build(model, true)
    }

    fn build(model: &Yolo, muon: bool) -> Result<Self> {
        if model.is_fused() {
            return Err(OptimError::BadInput("a fused model cannot be trained".into()));
        }
        let bn_modules: HashSet<String> = {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let data = model.varmap().data().lock().unwrap();
            data.keys().filter_map(|k| k.strip_suffix(".running_mean").map(str::to_string)).collect()
        };
        let head = format!("model.{}.", model.config().family.detect_index());
        let boosted_prefixes = [format!("{head}cv3."), format!("{head}one2one_cv3.")];
        let params: Vec<Param> = model
            .trainable_vars()
            .into_iter()
            .map(|(name, var)| {
                let module = name.rsplit_once('.').map_or("", |(m, _)| m);
                let group = if muon && matches!(var.rank(), 2 | 4) {
                    Group::Muon
                } else if name.contains("bias") {
                    Group::Bias
                } else if bn_modules.contains(module) {
                    Group::BnWeight
                } else {
                    Group::Weight
                };
                let boosted = muon && boosted_prefixes.iter().any(|p| name.starts_with(p.as_str()));
                Param { name, var, group, boosted }
            })
            .collect();
        if params.is_empty() {
            return Err(OptimError::BadInput("the model has no trainable parameters".into()));
        }
        Ok(Self { params, muon })
    }

    /// Groups from an explicit parameter list (for tests of the update rules on small tensors).
    #[cfg(test)]
    pub(crate) fn from_params(params: Vec<Param>, muon: bool) -> Self {
        Self { params, muon }
    }

    /// Whether these are MuSGD's eight groups.
    pub fn is_muon(&self) -> bool {
        self.muon
    }

    /// Number of `param_groups`: 3, or 8 for MuSGD.
    pub fn len(&self) -> usize {
        if self.muon { 8 } else { 3 }
    }

    /// Never empty (there are always three or eight groups, some possibly without parameters).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The kind and boost of `param_groups[i]`.
    pub fn group_at(&self, i: usize) -> (Group, bool) {
        if self.muon {
            let kind = [Group::Weight, Group::BnWeight, Group::Bias, Group::Muon][(i / 2).min(3)];
            (kind, i.is_multiple_of(2))
        } else {
            (Group::ALL[i.min(2)], false)
        }
    }

    /// The `param_groups` index of a parameter: its kind's, or for MuSGD its kind's pair, boosted first.
    pub fn index_of(&self, p: &Param) -> usize {
        if self.muon { 2 * p.group.index() + usize::from(!p.boosted) } else { p.group.index() }
    }

    /// Every parameter, sorted by name.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// Number of parameters (tensors) of the decayed weights (for MuSGD the Muon group, as Ultralytics counts
    /// them), the BatchNorm weights and the biases.
    pub fn counts(&self) -> [usize; 3] {
        let mut c = [0; 3];
        for p in &self.params {
            c[p.group.index() % 3] += 1;
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
        let model = Yolo::new(YoloConfig::new(Scale::N, 80), DType::F32, &Device::Cpu).unwrap();
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
                Group::Muon => unreachable!(),
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
        let model = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
        let g = ParamGroups::new(&model).unwrap();
        assert_eq!(g.summary(0.0005), "114 weight(decay=0.0), 126 weight(decay=0.0005), 126 bias(decay=0.0)");
    }

    #[test]
    fn musgd_splits_eight_groups_as_ultralytics() {
        let cfg = YoloConfig::new(Scale::custom(0.5, 0.125, 1024).unwrap(), 6).with_family(sluice_model::Family::V26);
        let model = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
        let g = ParamGroups::new_muon(&model).unwrap();
        assert!(g.is_muon());
        assert_eq!(g.len(), 8);
        // Ultralytics' line for MuSGD counts the Muon group where the decayed weights were.
        assert_eq!(g.summary(0.0005), "114 weight(decay=0.0), 126 weight(decay=0.0005), 126 bias(decay=0.0)");
        let mut per = [0usize; 8];
        for p in g.params() {
            per[g.index_of(p)] += 1;
            assert_eq!(g.group_at(g.index_of(p)), (p.group, p.boosted));
            if p.group == Group::Muon {
                assert_eq!(p.var.rank(), 4, "{}", p.name);
            }
            let head = p.name.starts_with("model.23.cv3.") || p.name.starts_with("model.23.one2one_cv3.");
            assert_eq!(p.boosted, head, "{}", p.name);
        }
        // No rank-1 decayed weight in a YOLO; the boosted pairs hold the head's class branches (2 heads × 3 levels
        // × (DWConv, Conv, DWConv, Conv, Conv2d): 30 filters, 24 BatchNorms, 24 + 6 biases).
        assert_eq!(per, [0, 0, 24, 90, 30, 96, 30, 96]);
    }
}
