//! YOLOv8 building blocks: Conv (Conv2d + BatchNorm + SiLU), Bottleneck, C2f and SPPF, each in eval or train
//! mode, and Conv+BN folding.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use candle_core::{DType, Result, Tensor, Var};
use candle_nn::Init;
use sluice_kernels::norm;

use crate::ops;
use crate::params::Params;
use crate::stats::{Report, StatsSink};

/// BatchNorm's epsilon in Ultralytics' Conv.
pub const BN_EPS: f64 = 1e-3;
/// BatchNorm's running-stat momentum in Ultralytics' Conv.
pub const BN_MOMENTUM: f64 = 0.03;

/// Whether BatchNorm uses running statistics (eval) or batch statistics and updates the running ones (train).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Inference: running statistics, each Conv block one op (BatchNorm folded into the convolution's weight and
    /// bias, SiLU applied in the same pass on the CPU), with no backward: a gradient through an eval-mode forward is
    /// an error.
    Eval,
    /// Training: batch statistics (biased variance), running statistics updated with momentum 0.03 (unbiased).
    Train,
}

/// The mixed-precision switch of one model, shared by all its [`Conv`]s: when set to a half dtype, a training
/// forward keeps the activations in it from layer to layer. Each Conv casts its (f32 master) weight to it and
/// convolves (cuDNN / cuBLAS tensor cores on a GPU); BatchNorm reads and writes the half dtype with f32 batch
/// statistics and parameters; the head's final 1×1 convolutions return the model's dtype, so the head's outputs,
/// the loss and every gradient that reaches a weight stay f32. The casts are differentiable, so the backward pass
/// runs in the half dtype too. An eval-mode forward runs in the model's dtype.
#[derive(Debug, Clone, Default)]
pub(crate) struct Autocast(Arc<AtomicU8>);

impl Autocast {
    const OFF: u8 = 0;
    const BF16: u8 = 1;
    const F16: u8 = 2;

    /// The dtype convolutions run in, `None` for the model's own.
    pub(crate) fn get(&self) -> Option<DType> {
        match self.0.load(Ordering::Relaxed) {
            Self::BF16 => Some(DType::BF16),
            Self::F16 => Some(DType::F16),
            _ => None,
        }
    }

    /// Switches mixed precision on (`BF16` / `F16`) or off (`None`); other dtypes are refused.
    pub(crate) fn set(&self, dtype: Option<DType>) -> Result<()> {
        let v = match dtype {
            None => Self::OFF,
            Some(DType::BF16) => Self::BF16,
            Some(DType::F16) => Self::F16,
            Some(d) => candle_core::bail!("autocast runs convolutions in bf16 or f16, not {d:?}"),
        };
        self.0.store(v, Ordering::Relaxed);
        Ok(())
    }
}

/// `nn.BatchNorm2d(eps=1e-3, momentum=0.03)`.
#[derive(Debug, Clone)]
pub(crate) struct BatchNorm {
    weight: Var,
    bias: Var,
    running_mean: Var,
    running_var: Var,
    /// The layer's name prefix (`model.0.bn`) and the model's sink for the running-statistics update (behind
    /// one pointer: every Conv carries a BatchNorm).
    stats: Arc<(String, StatsSink)>,
}

impl BatchNorm {
    fn new(p: &Params<'_>, c: usize) -> Result<Self> {
        Ok(Self {
            weight: p.var("weight", c, Init::Const(1.0))?,
            bias: p.var("bias", c, Init::Const(0.0))?,
            running_mean: p.var("running_mean", c, Init::Const(0.0))?,
            running_var: p.var("running_var", c, Init::Const(1.0))?,
            stats: Arc::new((p.prefix().to_string(), p.stats().clone())),
        })
    }

    /// Reports the batch's statistics for the running-statistics update (momentum 0.03, unbiased variance; no
    /// gradient: `mean` and `var` are detached), which the model commits when the forward ends ([`crate::stats`]).
    fn report(&self, mean: Tensor, var: Tensor, n: f64) {
        let (key, sink) = &*self.stats;
        sink.report(Report {
            key: key.clone(),
            running_mean: self.running_mean.clone(),
            running_var: self.running_var.clone(),
            mean,
            var,
            unbiased_factor: n / (n - 1.0).max(1.0),
        });
    }

    /// `[γ, β, running mean, running variance]`.
    fn params(&self) -> [&Tensor; 4] {
        [&self.weight, &self.bias, &self.running_mean, &self.running_var].map(|v| v.as_tensor())
    }

    /// Per-channel `(scale, shift)` of the eval-mode affine map `x·scale + shift` (Ultralytics' operation order).
    fn eval_affine(&self) -> Result<(Tensor, Tensor)> {
        norm::batch_norm_eval_affine(self.params(), BN_EPS)
    }

    /// A conv weight (`o×c×k×k`) with this BatchNorm folded in: `(w·scale, shift)` per output channel.
    fn fold(&self, weight: &Tensor) -> Result<(Tensor, Tensor)> {
        norm::fold_batch_norm(weight, self.params(), BN_EPS)
    }

    /// `BatchNorm(x)` without activation (the `act=False` Convs of attention blocks): running statistics in eval
    /// mode; in train mode batch statistics through candle's ops (these Convs sit on the smallest maps), with the
    /// running statistics updated as in [`Self::forward_silu`].
    fn forward_plain(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let c = x.dim(1)?;
        match mode {
            Mode::Eval => {
                let (scale, shift) = self.eval_affine()?;
                x.broadcast_mul(&scale.reshape((1, c, 1, 1))?)?.broadcast_add(&shift.reshape((1, c, 1, 1))?)
            }
            Mode::Train => {
                // Half activations (mixed precision) are normalised in the parameters' dtype and cast back.
                let half = (x.dtype() != self.weight.dtype()).then_some(x.dtype());
                let x = &x.to_dtype(self.weight.dtype())?;
                let (b, _, h, w) = x.dims4()?;
                let n = (b * h * w) as f64;
                let mean = x.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
                let centred = x.broadcast_sub(&mean)?;
                let var = centred.sqr()?.mean_keepdim(3)?.mean_keepdim(2)?.mean_keepdim(0)?;
                let inv = (var.clone() + BN_EPS)?.sqrt()?.recip()?;
                let y = centred
                    .broadcast_mul(&inv)?
                    .broadcast_mul(&self.weight.as_tensor().reshape((1, c, 1, 1))?)?
                    .broadcast_add(&self.bias.as_tensor().reshape((1, c, 1, 1))?)?;
                self.report(mean.detach().flatten_all()?, var.detach().flatten_all()?, n);
                match half {
                    Some(h) => y.to_dtype(h),
                    None => Ok(y),
                }
            }
        }
    }

    /// `SiLU(BatchNorm(x))`, fused (`sluice_kernels::norm`): running statistics in eval mode; batch statistics
    /// in train mode, where the running statistics are updated too.
    fn forward_silu(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        match mode {
            Mode::Eval => {
                let (scale, shift) = self.eval_affine()?;
                norm::affine_silu(x, &scale, &shift)
            }
            Mode::Train => {
                let (b, _, h, w) = x.dims4()?;
                let n = (b * h * w) as f64;
                let (y, mean, var) =
                    norm::batch_norm_silu_train(x, self.weight.as_tensor(), self.bias.as_tensor(), BN_EPS)?;
                self.report(mean, var, n);
                Ok(y)
            }
        }
    }
}

/// Ultralytics `Conv`: Conv2d (no bias, padding k/2) + BatchNorm2d + SiLU; after folding, Conv2d with bias + SiLU.
/// Two variants share it: `act=False` (no SiLU, the projections of attention blocks) and the depthwise `DWConv`
/// (one filter per channel, `groups = channels`).
#[derive(Debug, Clone)]
pub(crate) struct Conv {
    weight: Tensor,
    bn: Option<BatchNorm>,
    fused_bias: Option<Tensor>,
    stride: usize,
    pad: usize,
    autocast: Autocast,
    act: bool,
    depthwise: bool,
}

impl Conv {
    pub(crate) fn new(p: &Params<'_>, c1: usize, c2: usize, k: usize, s: usize) -> Result<Self> {
        let weight = p.pp("conv").var("weight", (c2, c1, k, k), Params::conv_init(c1 * k * k))?;
        Ok(Self {
            weight: weight.as_tensor().clone(),
            bn: Some(BatchNorm::new(&p.pp("bn"), c2)?),
            fused_bias: None,
            stride: s,
            pad: k / 2,
            autocast: p.autocast().clone(),
            act: true,
            depthwise: false,
        })
    }

    /// `Conv(c1, c2, k, s, act=False)`: BatchNorm without SiLU.
    pub(crate) fn linear(p: &Params<'_>, c1: usize, c2: usize, k: usize, s: usize) -> Result<Self> {
        Ok(Self { act: false, ..Self::new(p, c1, c2, k, s)? })
    }

    /// `DWConv(c, c, k)` (`act` true) or `Conv(c, c, k, g=c, act=False)`: a k×k filter per channel, stride 1.
    pub(crate) fn depthwise(p: &Params<'_>, c: usize, k: usize, act: bool) -> Result<Self> {
        let weight = p.pp("conv").var("weight", (c, 1, k, k), Params::conv_init(k * k))?;
        Ok(Self {
            weight: weight.as_tensor().clone(),
            bn: Some(BatchNorm::new(&p.pp("bn"), c)?),
            fused_bias: None,
            stride: 1,
            pad: k / 2,
            autocast: p.autocast().clone(),
            act,
            depthwise: true,
        })
    }

    /// The half dtype of a mixed-precision training forward, `None` otherwise.
    fn half(&self, mode: Mode) -> Option<DType> {
        match (self.autocast.get(), mode, &self.bn) {
            (Some(half), Mode::Train, Some(_)) => Some(half),
            _ => None,
        }
    }

    /// The forward of the variants (`act=False`, depthwise), which run on candle's ops with their autograd.
    fn forward_variant(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let conv = |x: &Tensor, w: &Tensor| {
            if self.depthwise {
                ops::depthwise_conv2d(x, w, self.pad)
            } else {
                sluice_kernels::conv::conv2d(x, w, self.stride, self.pad)
            }
        };
        if let (Some(half), Some(bn)) = (self.half(mode), &self.bn) {
            let y = conv(&x.to_dtype(half)?, &self.weight.to_dtype(half)?)?;
            return if self.act { bn.forward_silu(&y, mode) } else { bn.forward_plain(&y, mode) };
        }
        let x = &x.to_dtype(self.weight.dtype())?;
        let y = match (&self.bn, &self.fused_bias, mode) {
            (Some(bn), _, Mode::Train) => {
                let y = conv(x, &self.weight)?;
                return if self.act { bn.forward_silu(&y, mode) } else { bn.forward_plain(&y, mode) };
            }
            (Some(bn), _, Mode::Eval) => {
                let (w, shift) = bn.fold(&self.weight)?;
                conv(x, &w)?.broadcast_add(&shift.reshape((1, shift.dim(0)?, 1, 1))?)?
            }
            (None, Some(b), _) => conv(x, &self.weight)?.broadcast_add(&b.reshape((1, b.dim(0)?, 1, 1))?)?,
            (None, None, _) => conv(x, &self.weight)?,
        };
        if self.act { y.silu() } else { Ok(y) }
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        if self.depthwise || !self.act {
            return self.forward_variant(x, mode);
        }
        // Mixed precision in training: the activations stay in the half dtype from layer to layer (the input cast
        // is a no-op after the first layer), the f32 master weight is cast for the convolution, and BatchNorm+SiLU
        // reads and writes the half dtype with f32 statistics and parameters (`sluice_kernels::norm`). The casts are
        // differentiable, so the weight's gradient comes back in f32.
        if let (Some(half), Some(bn)) = (self.half(mode), &self.bn) {
            let y =
                sluice_kernels::conv::conv2d(&x.to_dtype(half)?, &self.weight.to_dtype(half)?, self.stride, self.pad)?;
            return bn.forward_silu(&y, mode);
        }
        // The model's dtype (a half activation reaching an eval-mode forward under autocast is cast up first).
        let x = &x.to_dtype(self.weight.dtype())?;
        // Inference: one conv + bias + SiLU op (`sluice_kernels::conv::conv2d_bias_silu`), with the running
        // statistics folded into the weight and bias on the fly when the block is not fused yet.
        match (&self.bn, &self.fused_bias, mode) {
            (None, Some(b), _) => {
                return sluice_kernels::conv::conv2d_bias_silu(x, &self.weight, b, self.stride, self.pad);
            }
            (Some(bn), _, Mode::Eval) => {
                let (w, shift) = bn.fold(&self.weight)?;
                return sluice_kernels::conv::conv2d_bias_silu(x, &w, &shift, self.stride, self.pad);
            }
            _ => {}
        }
        let y = sluice_kernels::conv::conv2d(x, &self.weight, self.stride, self.pad)?;
        match (&self.bn, &self.fused_bias) {
            (Some(bn), _) => bn.forward_silu(&y, mode),
            (None, Some(b)) => norm::affine_silu(&y, &b.ones_like()?, b),
            (None, None) => y.silu(),
        }
    }

    /// The folded copy: `w' = w·γ/√(var+eps)`, `b' = β − mean·γ/√(var+eps)`.
    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        let Some(bn) = &self.bn else {
            let fused_bias = self.fused_bias.as_ref().map(|b| b.detach().to_dtype(dtype)).transpose()?;
            return Ok(Self { weight: self.weight.detach().to_dtype(dtype)?, fused_bias, ..self.clone() });
        };
        let (weight, shift) = bn.fold(&self.weight)?;
        let (weight, shift) = (weight.detach().to_dtype(dtype)?, shift.to_dtype(dtype)?);
        // The folded copy shares no state with the original (autocast included: it runs in its own dtype).
        Ok(Self {
            weight,
            bn: None,
            fused_bias: Some(shift.detach()),
            stride: self.stride,
            pad: self.pad,
            autocast: Autocast::default(),
            act: self.act,
            depthwise: self.depthwise,
        })
    }

    /// The (possibly folded) weight and bias.
    pub(crate) fn weight_and_bias(&self) -> (&Tensor, Option<&Tensor>) {
        (&self.weight, self.fused_bias.as_ref())
    }

    /// The weight and bias with BatchNorm folded in (the arithmetic of [`Conv::fused`]), float32 on the CPU.
    pub(crate) fn folded(&self) -> crate::error::Result<(Tensor, Tensor)> {
        let (w, b) = match (&self.bn, &self.fused_bias) {
            (Some(bn), _) => bn.fold(&self.weight)?,
            (None, Some(b)) => (self.weight.clone(), b.clone()),
            (None, None) => {
                (self.weight.clone(), Tensor::zeros(self.weight.dim(0)?, self.weight.dtype(), self.weight.device())?)
            }
        };
        Ok((crate::graph::cpu_f32(&w)?, crate::graph::cpu_f32(&b)?))
    }

    /// Whether SiLU follows (false for `act=False` Convs).
    pub(crate) fn has_act(&self) -> bool {
        self.act
    }

    /// Whether this is a depthwise convolution (`groups = channels`).
    pub(crate) fn is_depthwise(&self) -> bool {
        self.depthwise
    }

    /// The stride in H and W.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// The padding on every side.
    pub(crate) fn pad(&self) -> usize {
        self.pad
    }
}

/// Bottleneck: two 3×3 Convs (through `hidden` channels: `c` in C2f and C3k, `c/2` in C3k2) and a residual add
/// when `shortcut` (channels in = out).
#[derive(Debug, Clone)]
pub(crate) struct Bottleneck {
    cv1: Conv,
    cv2: Conv,
    add: bool,
}

impl Bottleneck {
    fn new(p: &Params<'_>, c: usize, shortcut: bool) -> Result<Self> {
        Self::with_hidden(p, c, c, shortcut)
    }

    pub(crate) fn with_hidden(p: &Params<'_>, c: usize, hidden: usize, shortcut: bool) -> Result<Self> {
        Ok(Self {
            cv1: Conv::new(&p.pp("cv1"), c, hidden, 3, 1)?,
            cv2: Conv::new(&p.pp("cv2"), hidden, c, 3, 1)?,
            add: shortcut,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.cv2.forward(&self.cv1.forward(x, mode)?, mode)?;
        if self.add { x + y } else { Ok(y) }
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self { cv1: self.cv1.fused(dtype)?, cv2: self.cv2.fused(dtype)?, add: self.add })
    }

    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        out.push((format!("{prefix}.cv1"), &self.cv1));
        out.push((format!("{prefix}.cv2"), &self.cv2));
    }

    /// The evaluation graph of the block on `x`.
    pub(crate) fn describe(&self, b: &mut crate::graph::Builder, name: &str, x: usize) -> crate::error::Result<usize> {
        b.bottleneck(name, &self.cv1, &self.cv2, self.add, x)
    }
}

/// C2f: cv1 (1×1, 2c) → split → n Bottlenecks chained on the second half → concat of all → cv2 (1×1).
#[derive(Debug, Clone)]
pub(crate) struct C2f {
    c: usize,
    cv1: Conv,
    cv2: Conv,
    m: Vec<Bottleneck>,
}

impl C2f {
    pub(crate) fn new(p: &Params<'_>, c1: usize, c2: usize, n: usize, shortcut: bool) -> Result<Self> {
        let c = c2 / 2;
        // In PyTorch's construction order (cv1, cv2, then m), which a seeded model draws its weights in.
        Ok(Self {
            c,
            cv1: Conv::new(&p.pp("cv1"), c1, 2 * c, 1, 1)?,
            cv2: Conv::new(&p.pp("cv2"), (2 + n) * c, c2, 1, 1)?,
            m: (0..n).map(|i| Bottleneck::new(&p.pp("m").pp(i), c, shortcut)).collect::<Result<Vec<_>>>()?,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.cv1.forward(x, mode)?;
        let mut ys = vec![y.narrow(1, 0, self.c)?, y.narrow(1, self.c, self.c)?];
        for b in &self.m {
            let last = ys.last().cloned().ok_or_else(|| candle_core::Error::Msg("C2f: empty".into()))?;
            ys.push(b.forward(&last, mode)?);
        }
        self.cv2.forward(&Tensor::cat(&ys, 1)?, mode)
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            c: self.c,
            cv1: self.cv1.fused(dtype)?,
            cv2: self.cv2.fused(dtype)?,
            m: self.m.iter().map(|b| b.fused(dtype)).collect::<Result<_>>()?,
        })
    }

    pub(crate) fn cv1(&self) -> &Conv {
        &self.cv1
    }

    pub(crate) fn cv2(&self) -> &Conv {
        &self.cv2
    }

    /// Channels of each half of `cv1`'s output.
    pub(crate) fn hidden(&self) -> usize {
        self.c
    }

    /// Each Bottleneck's two Convs and whether it adds its input.
    pub(crate) fn bottlenecks(&self) -> impl Iterator<Item = (&Conv, &Conv, bool)> {
        self.m.iter().map(|b| (&b.cv1, &b.cv2, b.add))
    }

    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        out.push((format!("{prefix}.cv1"), &self.cv1));
        out.push((format!("{prefix}.cv2"), &self.cv2));
        for (i, b) in self.m.iter().enumerate() {
            b.convs(&format!("{prefix}.m.{i}"), out);
        }
    }
}

/// SPPF: cv1 (1×1, c1/2, with SiLU) → three 5×5 stride-1 max-pools in a row → concat of the four → cv2 (1×1).
/// YOLO26's variant has no SiLU after cv1 and adds the input to the output.
#[derive(Debug, Clone)]
pub(crate) struct Sppf {
    cv1: Conv,
    cv2: Conv,
    k: usize,
    residual: bool,
}

impl Sppf {
    pub(crate) fn new(p: &Params<'_>, c1: usize, c2: usize, k: usize) -> Result<Self> {
        let c = c1 / 2;
        Ok(Self {
            cv1: Conv::new(&p.pp("cv1"), c1, c, 1, 1)?,
            cv2: Conv::new(&p.pp("cv2"), 4 * c, c2, 1, 1)?,
            k,
            residual: false,
        })
    }

    /// YOLO26's `SPPF(c1, c2, k, 3, shortcut=True)`: cv1 without SiLU, and the residual when `c1 == c2`.
    pub(crate) fn new_residual(p: &Params<'_>, c1: usize, c2: usize, k: usize) -> Result<Self> {
        let c = c1 / 2;
        Ok(Self {
            cv1: Conv::linear(&p.pp("cv1"), c1, c, 1, 1)?,
            cv2: Conv::new(&p.pp("cv2"), 4 * c, c2, 1, 1)?,
            k,
            residual: c1 == c2,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let h = self.cv1.forward(x, mode)?;
        let y1 = ops::max_pool2d_same(&h, self.k)?;
        let y2 = ops::max_pool2d_same(&y1, self.k)?;
        let y3 = ops::max_pool2d_same(&y2, self.k)?;
        let y = self.cv2.forward(&Tensor::cat(&[&h, &y1, &y2, &y3], 1)?, mode)?;
        if self.residual { y + x } else { Ok(y) }
    }

    /// Whether the input is added to the output (YOLO26's variant).
    pub(crate) fn has_residual(&self) -> bool {
        self.residual
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self { cv1: self.cv1.fused(dtype)?, cv2: self.cv2.fused(dtype)?, k: self.k, residual: self.residual })
    }

    pub(crate) fn cv1(&self) -> &Conv {
        &self.cv1
    }

    pub(crate) fn cv2(&self) -> &Conv {
        &self.cv2
    }

    /// The pooling window's side.
    pub(crate) fn kernel(&self) -> usize {
        self.k
    }

    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        out.push((format!("{prefix}.cv1"), &self.cv1));
        out.push((format!("{prefix}.cv2"), &self.cv2));
    }
}
