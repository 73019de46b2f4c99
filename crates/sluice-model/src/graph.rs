//! The model's evaluation graph as data, for writers of other formats (`sluice-export`'s ONNX writer): a list of
//! nodes in execution order over one NCHW input, each a small family-neutral operation (a convolution with its
//! BatchNorm folded, a channel slice, a concat, an add, a max-pool, an upsample, the detection decode). A new
//! model family describes itself with the same operations (adding one here when it needs a new kind), so every
//! writer follows without knowing the family.

use candle_core::Tensor;

use crate::config::STRIDES;
use crate::error::{ModelError, Result};
use crate::layers::{C2f, Conv, Sppf};
use crate::model::Yolo;

/// The index of a value: 0 is the graph's input, `i + 1` the output of node `i`.
pub type ValueId = usize;

/// The activation after a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// None (the head's last 1×1 convolutions).
    Identity,
    /// `x · sigmoid(x)`.
    Silu,
}

/// A 2-D convolution with bias (BatchNorm already folded in), square kernel, symmetric padding.
#[derive(Debug, Clone)]
pub struct ConvOp {
    /// `(out, in / groups, k, k)`, float32 on the CPU.
    pub weight: Tensor,
    /// `(out,)`, float32 on the CPU.
    pub bias: Tensor,
    /// Stride in H and W.
    pub stride: usize,
    /// Padding on every side.
    pub pad: usize,
    /// Channel groups.
    pub groups: usize,
    /// The activation applied to the result.
    pub act: Activation,
}

/// The decode of a detection head: per level `i`, a box-distribution map `(B, 4·reg_max, H_i, W_i)` and a class
/// logit map `(B, nc, H_i, W_i)` become `(B, 4 + nc, H_i·W_i)` rows: box centre x, y, width, height in input pixels
/// (distribution focal loss expectation over `reg_max` bins, anchors at cell centres, times the level's stride),
/// then the sigmoid class scores; the levels are concatenated along the anchors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetectDecode {
    /// Bins per box side.
    pub reg_max: usize,
    /// Number of classes.
    pub nc: usize,
    /// Stride of each level, in input pixels.
    pub strides: Vec<usize>,
}

/// One operation of the graph.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Op {
    /// A convolution of its one input.
    Conv(ConvOp),
    /// Channels `start .. start + len` of its one input.
    Slice {
        /// First channel.
        start: usize,
        /// Number of channels.
        len: usize,
    },
    /// Concatenation of its inputs along the channels.
    Concat,
    /// Element-wise sum of its two inputs.
    Add,
    /// Max-pooling with a `kernel × kernel` window, stride 1 and `kernel / 2` padding (the padding never wins).
    MaxPool {
        /// Window side (odd).
        kernel: usize,
    },
    /// Nearest-neighbour upsampling by an integer factor in H and W.
    Upsample {
        /// The factor.
        scale: usize,
    },
    /// The detection decode; inputs are `[boxes_0, classes_0, boxes_1, classes_1, …]`.
    Detect(DetectDecode),
    /// Multi-head self-attention over the pixels of a map (YOLO11's `Attention` without its positional encoding and
    /// projection): the one input `qkv` `(B, heads·(2·key_dim + head_dim), H, W)` is viewed as
    /// `(B, heads, 2·key_dim + head_dim, H·W)` and split into `q`, `k` (`key_dim` rows each) and `v` (`head_dim`
    /// rows); per head `v · softmax(qᵀk / √key_dim)ᵀ`, viewed back as `(B, heads·head_dim, H, W)`.
    Attention(AttentionOp),
    /// The `v` part of an attention's `qkv` input (see [`Op::Attention`]), viewed as `(B, heads·head_dim, H, W)`.
    AttentionValues(AttentionOp),
}

/// The shape of a multi-head attention (see [`Op::Attention`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionOp {
    /// Heads.
    pub heads: usize,
    /// Rows of `q` and of `k` per head.
    pub key_dim: usize,
    /// Rows of `v` per head.
    pub head_dim: usize,
}

/// A node: an operation, its inputs, and the name of the module it comes from (`model.2.m.0.cv1`).
#[derive(Debug, Clone)]
pub struct Node {
    /// Module name, Ultralytics' where there is one.
    pub name: String,
    /// What it computes.
    pub op: Op,
    /// The values it reads.
    pub inputs: Vec<ValueId>,
}

/// The evaluation graph of a model: input `(B, 3, H, W)` in `[0, 1]`, H and W multiples of [`Graph::stride`];
/// the output is the last node's value.
#[derive(Debug, Clone)]
pub struct Graph {
    /// The nodes in execution order.
    pub nodes: Vec<Node>,
    /// Input channels.
    pub in_channels: usize,
    /// The largest stride: input sides must be its multiples.
    pub stride: usize,
    /// The head's class type, as Ultralytics names it (`Detect`).
    pub head: String,
    /// The output value.
    pub output: ValueId,
}

/// Appends nodes, keeping their output ids.
pub(crate) struct Builder {
    nodes: Vec<Node>,
}

impl Builder {
    pub(crate) fn push(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>) -> ValueId {
        self.nodes.push(Node { name: name.into(), op, inputs });
        self.nodes.len()
    }

    /// A Conv block (BatchNorm folded; SiLU unless the block has none; one group per channel when depthwise).
    pub(crate) fn conv(&mut self, name: &str, c: &Conv, x: ValueId) -> Result<ValueId> {
        let (weight, bias) = c.folded()?;
        let groups = if c.is_depthwise() { weight.dim(0)? } else { 1 };
        let act = if c.has_act() { Activation::Silu } else { Activation::Identity };
        Ok(self.push(name, Op::Conv(ConvOp { weight, bias, stride: c.stride(), pad: c.pad(), groups, act }), vec![x]))
    }

    /// A plain convolution with bias and no activation (the head's last 1×1 convolutions).
    pub(crate) fn conv_bias(&mut self, name: &str, w: &Tensor, b: &Tensor, x: ValueId) -> Result<ValueId> {
        let op =
            ConvOp { weight: cpu_f32(w)?, bias: cpu_f32(b)?, stride: 1, pad: 0, groups: 1, act: Activation::Identity };
        Ok(self.push(name, Op::Conv(op), vec![x]))
    }

    /// A Bottleneck: two Convs and the residual add when it has one.
    pub(crate) fn bottleneck(&mut self, name: &str, cv1: &Conv, cv2: &Conv, add: bool, x: ValueId) -> Result<ValueId> {
        let h = self.conv(&format!("{name}.cv1"), cv1, x)?;
        let h = self.conv(&format!("{name}.cv2"), cv2, h)?;
        Ok(if add { self.push(format!("{name}.add"), Op::Add, vec![x, h]) } else { h })
    }

    fn c2f(&mut self, name: &str, m: &C2f, x: ValueId) -> Result<ValueId> {
        let (cv1, cv2, c) = (m.cv1(), m.cv2(), m.hidden());
        let y = self.conv(&format!("{name}.cv1"), cv1, x)?;
        let mut ys = vec![
            self.push(format!("{name}.split0"), Op::Slice { start: 0, len: c }, vec![y]),
            self.push(format!("{name}.split1"), Op::Slice { start: c, len: c }, vec![y]),
        ];
        for (i, (b1, b2, add)) in m.bottlenecks().enumerate() {
            let last = ys[ys.len() - 1];
            let h = self.bottleneck(&format!("{name}.m.{i}"), b1, b2, add, last)?;
            ys.push(h);
        }
        let cat = self.push(format!("{name}.cat"), Op::Concat, ys);
        self.conv(&format!("{name}.cv2"), cv2, cat)
    }

    fn sppf(&mut self, name: &str, m: &Sppf, input: ValueId) -> Result<ValueId> {
        let x = self.conv(&format!("{name}.cv1"), m.cv1(), input)?;
        let k = m.kernel();
        let y1 = self.push(format!("{name}.m.0"), Op::MaxPool { kernel: k }, vec![x]);
        let y2 = self.push(format!("{name}.m.1"), Op::MaxPool { kernel: k }, vec![y1]);
        let y3 = self.push(format!("{name}.m.2"), Op::MaxPool { kernel: k }, vec![y2]);
        let cat = self.push(format!("{name}.cat"), Op::Concat, vec![x, y1, y2, y3]);
        let y = self.conv(&format!("{name}.cv2"), m.cv2(), cat)?;
        Ok(if m.has_residual() { self.push(format!("{name}.add"), Op::Add, vec![input, y]) } else { y })
    }
}

impl Yolo {
    /// The evaluation graph with every BatchNorm folded into its convolution (the arithmetic of
    /// [`Yolo::fuse`]), weights as float32 on the CPU. An end-to-end model (YOLO26) is described by its
    /// one-to-many head, its default eval output.
    pub fn graph(&self) -> Result<Graph> {
        let mut b = Builder { nodes: Vec::new() };
        let mut outs: Vec<ValueId> = Vec::with_capacity(self.layers_len());
        for (i, layer) in self.layer_views().into_iter().enumerate() {
            let name = format!("model.{i}");
            let prev = outs.last().copied().unwrap_or(0);
            let v = match layer {
                LayerView::Conv(c) => b.conv(&name, c, prev)?,
                LayerView::C2f(m) => b.c2f(&name, m, prev)?,
                LayerView::C3k2(m) => m.describe(&mut b, &name, prev)?,
                LayerView::C2psa(m) => m.describe(&mut b, &name, prev)?,
                LayerView::Sppf(m) => b.sppf(&name, m, prev)?,
                LayerView::Upsample => b.push(name, Op::Upsample { scale: 2 }, vec![prev]),
                LayerView::Concat(j) => {
                    let other = *outs.get(j).ok_or_else(|| ModelError::BadInput(format!("{name}: concat of {j}")))?;
                    b.push(name, Op::Concat, vec![prev, other])
                }
            };
            outs.push(v);
        }
        let family = self.config().family;
        let feats = family.detect_from().map(|i| outs[i]);
        let prefix = format!("model.{}", family.detect_index());
        let head_inputs = self.describe_head(&mut b, &prefix, feats)?;
        let decode = DetectDecode { reg_max: family.reg_max(), nc: self.config().nc, strides: STRIDES.to_vec() };
        let output = b.push(prefix, Op::Detect(decode), head_inputs);
        Ok(Graph { nodes: b.nodes, in_channels: 3, stride: STRIDES[2], head: "Detect".into(), output })
    }
}

/// A borrowed view of one top-level layer (see [`Yolo::layer_views`]).
pub(crate) enum LayerView<'a> {
    Conv(&'a Conv),
    C2f(&'a C2f),
    C3k2(&'a crate::blocks::C3k2),
    C2psa(&'a crate::blocks::C2psa),
    Sppf(&'a Sppf),
    Upsample,
    Concat(usize),
}

pub(crate) fn cpu_f32(t: &Tensor) -> Result<Tensor> {
    Ok(t.detach().to_dtype(candle_core::DType::F32)?.to_device(&candle_core::Device::Cpu)?)
}
