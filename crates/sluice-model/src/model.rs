//! The detection model (backbone, PAN neck, Detect head) of the YOLOv8 and YOLO11 families at any scale and class
//! count.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;

use crate::blocks::{C2psa, C3k2};
use crate::config::{Family, Scale, YoloConfig};
use crate::error::{ModelError, Result};
use crate::head::{self, Detect, RawHead};
use crate::layers::{Autocast, C2f, Conv, Mode, Sppf};
use crate::ops;
use crate::params::{Params, pack};
use crate::stats::{self, Segment, StatsPack, StatsSink};

/// One top-level layer `model.<i>` of the family's table (the Detect head, `model.22` / `model.23`, is kept apart).
#[derive(Debug, Clone)]
enum Layer {
    Conv(Conv),
    C2f(C2f),
    C3k2(C3k2),
    C2psa(C2psa),
    Sppf(Sppf),
    Upsample,
    /// Concat of the previous output and the output of layer `.0`.
    Concat(usize),
}

/// Outputs of the eval-mode forward.
#[derive(Debug, Clone)]
pub struct Detections {
    /// `(B, 4 + nc, A)`: rows 0–3 box centre x, y, width, height in input pixels; then class probabilities.
    pub y: Tensor,
    /// Raw head outputs (DFL logits `(B, 64, A)` and class logits `(B, nc, A)`).
    pub raw: RawHead,
    /// The Detect inputs P3, P4, P5 (outputs of `model.15`, `model.18`, `model.21` in YOLOv8).
    pub feats: [Tensor; 3],
}

/// A YOLO detection model of any family Sluice builds (YOLOv8, YOLO11, YOLO26; [`crate::Arch`]). Parameters live
/// in a [`VarMap`] under Ultralytics' state-dict names.
pub struct Yolo {
    cfg: YoloConfig,
    layers: Vec<Layer>,
    detect: Detect,
    varmap: VarMap,
    fused: bool,
    dtype: DType,
    device: Device,
    autocast: Autocast,
    /// The BatchNorm layers' reports of a training forward, and the buffers their running statistics live in.
    stats: StatsSink,
    stat_packs: Vec<StatsPack>,
    /// Parameters stored as parts of one buffer per pack ([`Self::with_params_packed`]).
    param_packs: Vec<PackedVars>,
    /// Every floating-point variable once, as stored: the running-statistics buffers, the parameter packs, then
    /// the other variables by name.
    segments: Vec<Segment>,
    pub(crate) num_batches_tracked: BTreeMap<String, i64>,
}

impl std::fmt::Debug for Yolo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Yolo")
            .field("cfg", &self.cfg)
            .field("fused", &self.fused)
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// Variables of one dtype stored back to back in one buffer ([`Yolo::try_clone_packed`]).
#[derive(Debug, Clone)]
pub struct PackedVars {
    /// The buffer, one-dimensional.
    pub buffer: Var,
    /// `(name, part)` in the buffer's order; each part is a variable over its range of the buffer.
    pub parts: Vec<(String, Var)>,
}

/// Key of the fixed DFL projection (0..15) in Ultralytics' YOLOv8 checkpoints (`model.23.…` in YOLO11's).
pub const DFL_KEY: &str = "model.22.dfl.conv.weight";

/// Key of the fixed DFL projection in a family's checkpoints.
pub fn dfl_key(family: Family) -> String {
    format!("model.{}.dfl.conv.weight", family.detect_index())
}

impl Yolo {
    /// A freshly initialised model (PyTorch default conv init, BN weight 1 / bias 0 / mean 0 / var 1,
    /// Ultralytics' head bias init), from the device's random generator.
    pub fn new(cfg: YoloConfig, dtype: DType, device: &Device) -> Result<Self> {
        Self::build(cfg, dtype, device, None)
    }

    /// The initial weights Ultralytics starts from with the same seed: PyTorch's generator after
    /// `torch.manual_seed(seed)`, drawn on the host in PyTorch's module construction order with `kaiming_uniform_`'s
    /// bounds, so the same seed gives the same model on any device and in Sluice and Ultralytics alike.
    pub fn new_seeded(cfg: YoloConfig, dtype: DType, device: &Device, seed: u64) -> Result<Self> {
        Self::build(cfg, dtype, device, Some(seed))
    }

    fn build(cfg: YoloConfig, dtype: DType, device: &Device, seed: Option<u64>) -> Result<Self> {
        let model = Self::build_on(VarMap::new(), cfg, dtype, device, seed)?;
        copy_one2one(&model.varmap)?;
        model.with_stats_packed()
    }

    /// The same model (the same variables) with the running statistics of the BatchNorm layers that run in one
    /// forward as parts of one buffer each ([`crate::stats`]): the layers of [`Self::forward_raw`], and YOLO26's
    /// one-to-one head, which runs in [`Self::forward_one2one`].
    fn with_stats_packed(self) -> Result<Self> {
        let vars = self.sorted_vars();
        let get = |name: String| -> Result<Var> {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.clone())
                .ok_or_else(|| ModelError::BadInput(format!("no variable `{name}`")))
        };
        let (one2one, main): (Vec<String>, Vec<String>) =
            bn_prefixes(&self.varmap).into_iter().partition(|p| p.contains(".one2one_"));
        let varmap = VarMap::new();
        let mut packs = Vec::new();
        {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let mut dst = varmap.data().lock().unwrap();
            for (name, v) in &vars {
                dst.insert(name.clone(), v.clone());
            }
            for group in [main, one2one].into_iter().filter(|g| !g.is_empty()) {
                let layers = group
                    .into_iter()
                    .map(|p| Ok((p.clone(), get(format!("{p}.running_mean"))?, get(format!("{p}.running_var"))?)))
                    .collect::<Result<Vec<_>>>()?;
                let (pack, parts) = StatsPack::new(&layers)?;
                for (key, mean, var) in parts {
                    dst.insert(format!("{key}.running_mean"), mean);
                    dst.insert(format!("{key}.running_var"), var);
                }
                packs.push(pack);
            }
        }
        let mut model = Self::build_on(varmap, self.cfg, self.dtype, &self.device, None)?;
        model.stat_packs = packs;
        model.segments = model.float_segments_now();
        model.num_batches_tracked = self.num_batches_tracked;
        Ok(model)
    }

    /// The same model (the same values) with each list of `packs` as consecutive parts of one new buffer, in the
    /// list's order: an optimizer whose parameter group is one such list updates the group with one op over the
    /// buffer, not one per variable, and the buffer takes the new values without a copy. Each name must be a
    /// floating-point variable that is not yet part of a buffer, in one list at most. Mixed precision, the
    /// running statistics' buffers and the step counters carry over.
    pub fn with_params_packed(self, packs: &[Vec<String>]) -> Result<Self> {
        if self.fused {
            return Err(ModelError::Fused("packing the parameters"));
        }
        let vars = self.sorted_vars();
        let in_buffer: std::collections::HashSet<String> = self
            .stat_packs
            .iter()
            .flat_map(|p| p.segment().names)
            .chain(self.param_packs.iter().flat_map(|p| p.parts.iter().map(|(n, _)| n.clone())))
            .collect();
        let mut taken = std::collections::HashSet::new();
        let varmap = VarMap::new();
        let mut param_packs = self.param_packs.clone();
        {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let mut dst = varmap.data().lock().unwrap();
            for (name, v) in &vars {
                dst.insert(name.clone(), v.clone());
            }
            for names in packs.iter().filter(|p| !p.is_empty()) {
                let members = names
                    .iter()
                    .map(|name| {
                        let v = vars
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .ok_or_else(|| ModelError::BadInput(format!("packing: no variable `{name}`")))?;
                        if !v.dtype().is_float() || in_buffer.contains(name) || !taken.insert(name.clone()) {
                            return Err(ModelError::BadInput(format!(
                                "packing: `{name}` is not a floating-point variable of its own"
                            )));
                        }
                        Ok(v)
                    })
                    .collect::<Result<Vec<_>>>()?;
                let (buffer, views) = pack(&members.iter().collect::<Vec<_>>())?;
                let mut parts = Vec::with_capacity(names.len());
                for (name, part) in names.iter().zip(views) {
                    dst.insert(name.clone(), part.clone());
                    parts.push((name.clone(), part));
                }
                param_packs.push(PackedVars { buffer, parts });
            }
        }
        let mut model = Self::build_on(varmap, self.cfg, self.dtype, &self.device, None)?;
        model.autocast.set(self.autocast.get())?;
        model.stat_packs = self.stat_packs;
        model.param_packs = param_packs;
        model.segments = model.float_segments_now();
        model.num_batches_tracked = self.num_batches_tracked;
        Ok(model)
    }

    /// The parameter buffers made by [`Self::with_params_packed`], in the order they were made.
    pub fn param_packs(&self) -> &[PackedVars] {
        &self.param_packs
    }

    /// The model over `varmap`: its variables are created where `varmap` lacks them and taken as they are where it
    /// has them.
    fn build_on(varmap: VarMap, cfg: YoloConfig, dtype: DType, device: &Device, seed: Option<u64>) -> Result<Self> {
        if cfg.nc == 0 {
            return Err(ModelError::BadInput("the class count must be at least 1".into()));
        }
        let autocast;
        let stats;
        let (layers, detect) = {
            let p = Params::new(&varmap, dtype, device, seed).pp("model");
            autocast = p.autocast().clone();
            stats = p.stats().clone();
            let layers = match cfg.family {
                Family::V8 => v8_layers(&p, &cfg)?,
                Family::V11 => c3k2_layers(&p, &cfg, false)?,
                Family::V26 => c3k2_layers(&p, &cfg, true)?,
            };
            (layers, Detect::new(&p.pp(cfg.family.detect_index()), &cfg)?)
        };
        let num_batches_tracked = bn_prefixes(&varmap).into_iter().map(|p| (p, 0)).collect();
        let mut model = Self {
            cfg,
            layers,
            detect,
            varmap,
            fused: false,
            dtype,
            device: device.clone(),
            autocast,
            stats,
            stat_packs: Vec::new(),
            param_packs: Vec::new(),
            segments: Vec::new(),
            num_batches_tracked,
        };
        model.segments = model.float_segments_now();
        Ok(model)
    }

    /// Mixed precision: `Some(BF16)` (or `F16`) runs every Conv block's convolution, forward and backward, in that
    /// dtype while the weights, BatchNorm, SiLU, the head's outputs and the loss stay in the model's f32 (the
    /// weights are cast per step, so they remain f32 master weights). `None` switches it off. Only an f32 model
    /// that is not fused takes it; copies ([`Self::try_clone`], [`Self::fuse`]) start with it off.
    pub fn set_autocast(&self, dtype: Option<DType>) -> Result<()> {
        if self.fused {
            return Err(ModelError::Fused("mixed precision"));
        }
        if dtype.is_some() && self.dtype != DType::F32 {
            return Err(ModelError::BadInput(format!(
                "mixed precision needs an f32 model, this one is {:?}",
                self.dtype
            )));
        }
        Ok(self.autocast.set(dtype)?)
    }

    /// The dtype the convolutions run in under mixed precision (`None`: the model's own).
    pub fn autocast(&self) -> Option<DType> {
        self.autocast.get()
    }

    /// The architecture.
    pub fn config(&self) -> YoloConfig {
        self.cfg
    }

    /// The parameter dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device the parameters live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether Conv+BN are folded (inference only).
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// All variables (including BN running statistics) by Ultralytics name.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// The variable with this Ultralytics name.
    pub fn var(&self, name: &str) -> Option<Var> {
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        self.varmap.data().lock().unwrap().get(name).cloned()
    }

    /// The parameters an optimiser updates (everything but BN running statistics), sorted by name.
    pub fn trainable_vars(&self) -> Vec<(String, Var)> {
        #[allow(clippy::unwrap_used)]
        let data = self.varmap.data().lock().unwrap();
        let mut v: Vec<_> = data
            .iter()
            .filter(|(k, _)| !k.ends_with(".running_mean") && !k.ends_with(".running_var"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    fn check_input(&self, x: &Tensor) -> Result<()> {
        let dims = x.dims();
        if dims.len() != 4
            || dims[1] != 3
            || !dims[2].is_multiple_of(32)
            || !dims[3].is_multiple_of(32)
            || dims[2] == 0
            || dims[3] == 0
        {
            return Err(ModelError::BadInput(format!(
                "expected an NCHW tensor with 3 channels and H, W multiples of 32, got shape {dims:?}"
            )));
        }
        if x.dtype() != self.dtype {
            return Err(ModelError::BadInput(format!("input dtype {:?}, model dtype {:?}", x.dtype(), self.dtype)));
        }
        Ok(())
    }

    /// An independent deep copy: the same architecture with every parameter, running statistic and
    /// `num_batches_tracked` counter copied into fresh variables (what Ultralytics' `deepcopy(model)` gives the EMA).
    pub fn try_clone(&self) -> Result<Self> {
        if self.fused {
            return Err(ModelError::Fused("copying the model"));
        }
        let copy = Self::new(self.cfg, self.dtype, &self.device)?;
        {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let src = self.varmap.data().lock().unwrap();
            #[allow(clippy::unwrap_used)]
            let dst = copy.varmap.data().lock().unwrap();
            for (k, v) in src.iter() {
                let Some(d) = dst.get(k) else {
                    return Err(ModelError::BadInput(format!("copying the model: no variable `{k}` in the copy")));
                };
                d.set(v.as_tensor())?;
            }
        }
        let mut copy = copy;
        copy.num_batches_tracked = self.num_batches_tracked.clone();
        Ok(copy)
    }

    /// [`Self::try_clone`] with the floating-point variables of each dtype as consecutive parts of one buffer
    /// (in the order of [`Self::float_segments`]), so that one op over the buffer reaches every variable: the EMA updates the whole model in
    /// a few kernels instead of a few per variable. Writes to a part (loading a checkpoint) land in its buffer.
    pub fn try_clone_packed(&self) -> Result<(Self, Vec<PackedVars>)> {
        if self.fused {
            return Err(ModelError::Fused("copying the model"));
        }
        let src = self.sorted_vars();
        let varmap = VarMap::new();
        let mut packs = Vec::new();
        {
            #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
            let mut dst = varmap.data().lock().unwrap();
            let mut dtypes: Vec<DType> = Vec::new();
            for seg in &self.segments {
                if !dtypes.contains(&seg.var.dtype()) {
                    dtypes.push(seg.var.dtype());
                }
            }
            for dtype in dtypes {
                // In the order of the model's segments, so that the model's values come in the buffer's order
                // from one copy per segment.
                let members: Vec<(&String, Var)> = self
                    .segments
                    .iter()
                    .filter(|seg| seg.var.dtype() == dtype)
                    .flat_map(|seg| seg.names.iter())
                    .map(|name| {
                        Ok((name, self.var(name).ok_or_else(|| ModelError::BadInput(format!("no variable `{name}`")))?))
                    })
                    .collect::<Result<_>>()?;
                let (buffer, views) = pack(&members.iter().map(|(_, v)| v).collect::<Vec<_>>())?;
                let mut parts = Vec::with_capacity(members.len());
                for ((name, _), part) in members.into_iter().zip(views) {
                    dst.insert(name.clone(), part.clone());
                    parts.push((name.clone(), part));
                }
                packs.push(PackedVars { buffer, parts });
            }
            for (name, v) in src.iter().filter(|(_, v)| !v.dtype().is_float()) {
                dst.insert(name.clone(), Var::from_tensor(&v.as_tensor().copy()?)?);
            }
        }
        let mut copy = Self::build_on(varmap, self.cfg, self.dtype, &self.device, None)?;
        let n = copy.sorted_vars().len();
        if n != src.len() {
            return Err(ModelError::BadInput(format!(
                "copying the model: {n} variables in the copy, {} in the model",
                src.len()
            )));
        }
        copy.num_batches_tracked = self.num_batches_tracked.clone();
        Ok((copy, packs))
    }

    /// Every floating-point variable once, in the order the model stores them ([`Segment`]): the buffers that
    /// hold the BatchNorm layers' running statistics, then each other variable by name. Concatenating the
    /// segments' variables lists every floating-point value of the model at the cost of one copy per segment.
    pub fn float_segments(&self) -> &[Segment] {
        &self.segments
    }

    fn float_segments_now(&self) -> Vec<Segment> {
        let mut out: Vec<Segment> = self.stat_packs.iter().map(StatsPack::segment).collect();
        out.extend(
            self.param_packs
                .iter()
                .map(|p| Segment { names: p.parts.iter().map(|(n, _)| n.clone()).collect(), var: p.buffer.clone() }),
        );
        let packed: std::collections::HashSet<&String> = out.iter().flat_map(|s| s.names.iter()).collect();
        let singles: Vec<Segment> = self
            .sorted_vars()
            .into_iter()
            .filter(|(k, v)| v.dtype().is_float() && !packed.contains(k))
            .map(|(k, v)| Segment { names: vec![k], var: v })
            .collect();
        out.extend(singles);
        out
    }

    /// `(name, variable)` of every variable, sorted by name.
    fn sorted_vars(&self) -> Vec<(String, Var)> {
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        let data = self.varmap.data().lock().unwrap();
        let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Outputs of every top-level layer `model.0` … `model.21`.
    pub fn forward_layers(&self, x: &Tensor, mode: Mode) -> Result<Vec<Tensor>> {
        self.tracked(mode, || self.layers_forward(x, mode))
    }

    /// `f`, a forward in `mode`; in [`Mode::Train`] the running statistics its BatchNorm layers report are
    /// committed when it ends (reports left by a forward that failed are dropped first).
    fn tracked<T>(&self, mode: Mode, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if mode == Mode::Eval {
            return f();
        }
        drop(self.stats.take());
        let out = f()?;
        stats::commit(&self.stat_packs, self.stats.take())?;
        Ok(out)
    }

    fn layers_forward(&self, x: &Tensor, mode: Mode) -> Result<Vec<Tensor>> {
        self.check_input(x)?;
        if self.fused && mode == Mode::Train {
            return Err(ModelError::Fused("a train-mode forward"));
        }
        let mut outs: Vec<Tensor> = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let prev = outs.last().unwrap_or(x);
            let y = match layer {
                Layer::Conv(m) => m.forward(prev, mode)?,
                Layer::C2f(m) => m.forward(prev, mode)?,
                Layer::C3k2(m) => m.forward(prev, mode)?,
                Layer::C2psa(m) => m.forward(prev, mode)?,
                Layer::Sppf(m) => m.forward(prev, mode)?,
                Layer::Upsample => ops::upsample_nearest2x(prev)?,
                Layer::Concat(j) => Tensor::cat(&[prev, &outs[*j]], 1)?,
            };
            outs.push(y);
        }
        Ok(outs)
    }

    /// Backbone, neck and head: raw head outputs and the P3–P5 features. In [`Mode::Train`] BatchNorm uses batch
    /// statistics and updates its running statistics.
    pub fn forward_raw(&self, x: &Tensor, mode: Mode) -> Result<(RawHead, [Tensor; 3])> {
        self.tracked(mode, || {
            let outs = self.layers_forward(x, mode)?;
            let [p3, p4, p5] = self.cfg.family.detect_from();
            let feats = [outs[p3].clone(), outs[p4].clone(), outs[p5].clone()];
            let raw = self.detect.forward(&feats, mode)?;
            Ok((raw, feats))
        })
    }

    /// The eval-mode forward: decoded output `(B, 4 + nc, A)`, raw logits and P3–P5 features.
    pub fn forward(&self, x: &Tensor) -> Result<Detections> {
        let (raw, feats) = self.forward_raw(x, Mode::Eval)?;
        let y = head::decode(&raw)?;
        Ok(Detections { y, raw, feats })
    }

    /// The end-to-end eval output of a model with a one-to-one head (YOLO26; Ultralytics' forward with
    /// `end2end = True`): `(B, min(max_det, A), 6)` rows `x1, y1, x2, y2` (input pixels), score, class, from the
    /// one-to-one branches by top-k, with no NMS. Other families have no such head: an error.
    pub fn forward_end2end(&self, x: &Tensor, max_det: usize) -> Result<Tensor> {
        let (_, feats) = self.forward_raw(x, Mode::Eval)?;
        let Some(raw) = self.detect.forward_one2one(&feats, Mode::Eval)? else {
            return Err(ModelError::BadInput(format!("{} has no end-to-end (one-to-one) head", self.cfg.name())));
        };
        Ok(head::end2end_topk(&raw, max_det)?)
    }

    /// [`Self::forward_end2end`] in the layout of the eval output, for validators built around it: `(B, 4 + nc, k)`
    /// with each row's box as `cx, cy, w, h` and its score in its class's row (the other classes 0), so a pass
    /// without suppression (`sluice_eval`'s `NmsMode::None`) gives exactly the end-to-end detections.
    pub fn forward_end2end_decoded(&self, x: &Tensor, max_det: usize) -> Result<Tensor> {
        let rows = self.forward_end2end(x, max_det)?; // (B, k, 6)
        let nc = self.cfg.nc;
        let xy1 = rows.narrow(2, 0, 2)?;
        let xy2 = rows.narrow(2, 2, 2)?;
        let c = ((&xy1 + &xy2)? * 0.5)?;
        let wh = (&xy2 - &xy1)?;
        let score = rows.narrow(2, 4, 1)?;
        let class = rows.narrow(2, 5, 1)?;
        let ids = Tensor::arange(0u32, nc as u32, rows.device())?.to_dtype(rows.dtype())?.reshape((1, 1, nc))?;
        let onehot = class.broadcast_eq(&ids)?.to_dtype(rows.dtype())?.broadcast_mul(&score)?;
        Ok(Tensor::cat(&[&c, &wh, &onehot], 2)?.permute((0, 2, 1))?.contiguous()?)
    }

    /// The one-to-one head's raw outputs (YOLO26) on the Detect inputs; `None` for other families. In
    /// [`Mode::Train`] the features are detached first, as Ultralytics trains this head.
    pub fn forward_one2one(&self, feats: &[Tensor; 3], mode: Mode) -> Result<Option<RawHead>> {
        self.tracked(mode, || Ok(self.detect.forward_one2one(feats, mode)?))
    }

    /// A copy with every Conv's BatchNorm folded into its convolution (Ultralytics `model.fuse()`); the head's
    /// final 1×1 convs are unchanged. The copy shares no mutable state and can only run eval forwards.
    pub fn fuse(&self) -> Result<Self> {
        self.fuse_to(self.dtype)
    }

    /// [`Yolo::fuse`], then every weight cast to `dtype` (Ultralytics' `model.fuse()` then `.half()`, its `half`
    /// inference): the folding runs in the model's own precision, so only the final weights are rounded. The copy
    /// takes inputs in `dtype` and returns its outputs in `dtype`.
    pub fn fuse_to(&self, dtype: DType) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(match l {
                    Layer::Conv(m) => Layer::Conv(m.fused(dtype)?),
                    Layer::C2f(m) => Layer::C2f(m.fused(dtype)?),
                    Layer::C3k2(m) => Layer::C3k2(m.fused(dtype)?),
                    Layer::C2psa(m) => Layer::C2psa(m.fused(dtype)?),
                    Layer::Sppf(m) => Layer::Sppf(m.fused(dtype)?),
                    Layer::Upsample => Layer::Upsample,
                    Layer::Concat(j) => Layer::Concat(*j),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            cfg: self.cfg,
            layers,
            detect: self.detect.fused(dtype)?,
            varmap: VarMap::new(),
            fused: true,
            dtype,
            device: self.device.clone(),
            autocast: Autocast::default(),
            stats: StatsSink::default(),
            stat_packs: Vec::new(),
            param_packs: Vec::new(),
            segments: Vec::new(),
            num_batches_tracked: BTreeMap::new(),
        })
    }

    fn convs(&self) -> Vec<(String, &Conv)> {
        let mut out = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.{i}");
            match l {
                Layer::Conv(m) => out.push((p, m)),
                Layer::C2f(m) => m.convs(&p, &mut out),
                Layer::C3k2(m) => m.convs(&p, &mut out),
                Layer::C2psa(m) => m.convs(&p, &mut out),
                Layer::Sppf(m) => m.convs(&p, &mut out),
                Layer::Upsample | Layer::Concat(_) => {}
            }
        }
        self.detect.convs(&format!("model.{}", self.cfg.family.detect_index()), &mut out);
        out
    }

    /// The weight and (after folding) bias of the Conv module with this Ultralytics name (e.g. `model.9.cv2`).
    pub fn conv_params(&self, module: &str) -> Option<(Tensor, Option<Tensor>)> {
        self.convs().into_iter().find(|(n, _)| n == module).map(|(_, c)| {
            let (w, b) = c.weight_and_bias();
            (w.clone(), b.cloned())
        })
    }

    pub(crate) fn layers_len(&self) -> usize {
        self.layers.len()
    }

    /// The top-level layers, borrowed.
    pub(crate) fn layer_views(&self) -> Vec<crate::graph::LayerView<'_>> {
        use crate::graph::LayerView;
        self.layers
            .iter()
            .map(|l| match l {
                Layer::Conv(m) => LayerView::Conv(m),
                Layer::C2f(m) => LayerView::C2f(m),
                Layer::C3k2(m) => LayerView::C3k2(m),
                Layer::C2psa(m) => LayerView::C2psa(m),
                Layer::Sppf(m) => LayerView::Sppf(m),
                Layer::Upsample => LayerView::Upsample,
                Layer::Concat(j) => LayerView::Concat(*j),
            })
            .collect()
    }

    /// The Detect head's (one-to-many) branches in the evaluation graph: `[boxes_0, classes_0, …]`.
    pub(crate) fn describe_head(
        &self,
        b: &mut crate::graph::Builder,
        prefix: &str,
        feats: [usize; 3],
    ) -> Result<Vec<usize>> {
        self.detect.describe(b, prefix, feats)
    }

    /// Number of DFL bins per side (16; 1 in YOLO26).
    pub fn reg_max(&self) -> usize {
        self.cfg.family.reg_max()
    }
}

/// `yolov8.yaml`'s layers 0–21.
fn v8_layers(p: &Params<'_>, cfg: &YoloConfig) -> candle_core::Result<Vec<Layer>> {
    let c = |x| cfg.ch(x);
    let d = |x| cfg.depth(x);
    Ok(vec![
        Layer::Conv(Conv::new(&p.pp(0), 3, c(64), 3, 2)?),
        Layer::Conv(Conv::new(&p.pp(1), c(64), c(128), 3, 2)?),
        Layer::C2f(C2f::new(&p.pp(2), c(128), c(128), d(3), true)?),
        Layer::Conv(Conv::new(&p.pp(3), c(128), c(256), 3, 2)?),
        Layer::C2f(C2f::new(&p.pp(4), c(256), c(256), d(6), true)?),
        Layer::Conv(Conv::new(&p.pp(5), c(256), c(512), 3, 2)?),
        Layer::C2f(C2f::new(&p.pp(6), c(512), c(512), d(6), true)?),
        Layer::Conv(Conv::new(&p.pp(7), c(512), c(1024), 3, 2)?),
        Layer::C2f(C2f::new(&p.pp(8), c(1024), c(1024), d(3), true)?),
        Layer::Sppf(Sppf::new(&p.pp(9), c(1024), c(1024), 5)?),
        Layer::Upsample,
        Layer::Concat(6),
        Layer::C2f(C2f::new(&p.pp(12), c(1024) + c(512), c(512), d(3), false)?),
        Layer::Upsample,
        Layer::Concat(4),
        Layer::C2f(C2f::new(&p.pp(15), c(512) + c(256), c(256), d(3), false)?),
        Layer::Conv(Conv::new(&p.pp(16), c(256), c(256), 3, 2)?),
        Layer::Concat(12),
        Layer::C2f(C2f::new(&p.pp(18), c(256) + c(512), c(512), d(3), false)?),
        Layer::Conv(Conv::new(&p.pp(19), c(512), c(512), 3, 2)?),
        Layer::Concat(9),
        Layer::C2f(C2f::new(&p.pp(21), c(512) + c(1024), c(1024), d(3), false)?),
    ])
}

/// `yolo11.yaml`'s and `yolo26.yaml`'s layers 0–22 (`v26` for the second). C3k2 rows give `(c2, c3k, e)`;
/// Ultralytics turns C3k on in every C3k2 at the scales m, l and x. YOLO26 differs in three rows: C3k in the
/// neck's C3k2, its residual SPPF, and one C3k2 with attention as layer 22.
fn c3k2_layers(p: &Params<'_>, cfg: &YoloConfig, v26: bool) -> candle_core::Result<Vec<Layer>> {
    let c = |x| cfg.ch(x);
    let d = |x| cfg.depth(x);
    let big = matches!(cfg.scale, Scale::M | Scale::L | Scale::X);
    let c3k2 = |i: usize, c1: usize, c2: usize, c3k: bool, e: f64| -> candle_core::Result<Layer> {
        Ok(Layer::C3k2(C3k2::new(&p.pp(i), c1, c(c2), d(2), c3k || big, e, false)?))
    };
    let sppf = if v26 { Sppf::new_residual } else { Sppf::new };
    // Built last, in PyTorch's construction order, which a seeded model draws its weights in.
    let last = || {
        if v26 {
            // `[-1, 1, C3k2, [1024, True, 0.5, True]]`: one repeat (not scaled), C3k off by the attention flag.
            Ok(Layer::C3k2(C3k2::new(&p.pp(22), c(512) + c(1024), c(1024), 1, true, 0.5, true)?))
        } else {
            c3k2(22, c(512) + c(1024), 1024, true, 0.5)
        }
    };
    Ok(vec![
        Layer::Conv(Conv::new(&p.pp(0), 3, c(64), 3, 2)?),
        Layer::Conv(Conv::new(&p.pp(1), c(64), c(128), 3, 2)?),
        c3k2(2, c(128), 256, false, 0.25)?,
        Layer::Conv(Conv::new(&p.pp(3), c(256), c(256), 3, 2)?),
        c3k2(4, c(256), 512, false, 0.25)?,
        Layer::Conv(Conv::new(&p.pp(5), c(512), c(512), 3, 2)?),
        c3k2(6, c(512), 512, true, 0.5)?,
        Layer::Conv(Conv::new(&p.pp(7), c(512), c(1024), 3, 2)?),
        c3k2(8, c(1024), 1024, true, 0.5)?,
        Layer::Sppf(sppf(&p.pp(9), c(1024), c(1024), 5)?),
        Layer::C2psa(C2psa::new(&p.pp(10), c(1024), c(1024), d(2))?),
        Layer::Upsample,
        Layer::Concat(6),
        c3k2(13, c(1024) + c(512), 512, v26, 0.5)?,
        Layer::Upsample,
        Layer::Concat(4),
        c3k2(16, c(512) + c(512), 256, v26, 0.5)?,
        Layer::Conv(Conv::new(&p.pp(17), c(256), c(256), 3, 2)?),
        Layer::Concat(13),
        c3k2(19, c(256) + c(512), 512, v26, 0.5)?,
        Layer::Conv(Conv::new(&p.pp(20), c(512), c(512), 3, 2)?),
        Layer::Concat(10),
        last()?,
    ])
}

/// `model.x.bn` prefixes of every BatchNorm in a var map.
/// Sets every one-to-one head variable (`*.one2one_cv2.*`, `*.one2one_cv3.*`) to its one-to-many twin's value, as
/// Ultralytics' `Detect` deep-copies `cv2` and `cv3` into them; nothing for a head without them.
fn copy_one2one(map: &VarMap) -> Result<()> {
    #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked while building.
    let data = map.data().lock().unwrap();
    for (name, var) in data.iter().filter(|(k, _)| k.contains(".one2one_")) {
        let twin = name.replacen("one2one_", "", 1);
        let source = data.get(&twin).ok_or_else(|| ModelError::BadInput(format!("{name}: no {twin} to copy")))?;
        var.set(source.as_tensor())?;
    }
    Ok(())
}

pub(crate) fn bn_prefixes(map: &VarMap) -> Vec<String> {
    #[allow(clippy::unwrap_used)]
    let data = map.data().lock().unwrap();
    let mut v: Vec<String> =
        data.keys().filter_map(|k| k.strip_suffix(".running_mean").map(|p| p.to_string())).collect();
    v.sort();
    v
}
