//! The model's evaluation graph as data, for writers of other formats (`sluice-export`'s ONNX writer): a list of
//! nodes in execution order over one NCHW input, each a small family-neutral operation (a convolution with its
//! BatchNorm folded, a channel slice, a concat, an add, a max-pool, an upsample, the detection decode). A new
//! model family describes itself with the same operations (adding one here when it needs a new kind), so every
//! writer follows without knowing the family.

use candle_core::Tensor;

use crate::config::{REG_MAX, STRIDES};
use crate::error::{ModelError, Result};
use crate::layers::{C2f, Conv, Sppf};
use crate::model::YoloV8;

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
struct Builder {
    nodes: Vec<Node>,
}

impl Builder {
    fn push(&mut self, name: impl Into<String>, op: Op, inputs: Vec<ValueId>) -> ValueId {
        self.nodes.push(Node { name: name.into(), op, inputs });
        self.nodes.len()
    }

    fn conv(&mut self, name: &str, c: &Conv, act: Activation, x: ValueId) -> Result<ValueId> {
        let (weight, bias) = c.folded()?;
        Ok(self.push(
            name,
            Op::Conv(ConvOp { weight, bias, stride: c.stride(), pad: c.pad(), groups: 1, act }),
            vec![x],
        ))
    }

    fn c2f(&mut self, name: &str, m: &C2f, x: ValueId) -> Result<ValueId> {
        let (cv1, cv2, c) = (m.cv1(), m.cv2(), m.hidden());
        let y = self.conv(&format!("{name}.cv1"), cv1, Activation::Silu, x)?;
        let mut ys = vec![
            self.push(format!("{name}.split0"), Op::Slice { start: 0, len: c }, vec![y]),
            self.push(format!("{name}.split1"), Op::Slice { start: c, len: c }, vec![y]),
        ];
        for (i, (b1, b2, add)) in m.bottlenecks().enumerate() {
            let last = ys[ys.len() - 1];
            let h = self.conv(&format!("{name}.m.{i}.cv1"), b1, Activation::Silu, last)?;
            let mut h = self.conv(&format!("{name}.m.{i}.cv2"), b2, Activation::Silu, h)?;
            if add {
                h = self.push(format!("{name}.m.{i}.add"), Op::Add, vec![last, h]);
            }
            ys.push(h);
        }
        let cat = self.push(format!("{name}.cat"), Op::Concat, ys);
        self.conv(&format!("{name}.cv2"), cv2, Activation::Silu, cat)
    }

    fn sppf(&mut self, name: &str, m: &Sppf, x: ValueId) -> Result<ValueId> {
        let x = self.conv(&format!("{name}.cv1"), m.cv1(), Activation::Silu, x)?;
        let k = m.kernel();
        let y1 = self.push(format!("{name}.m.0"), Op::MaxPool { kernel: k }, vec![x]);
        let y2 = self.push(format!("{name}.m.1"), Op::MaxPool { kernel: k }, vec![y1]);
        let y3 = self.push(format!("{name}.m.2"), Op::MaxPool { kernel: k }, vec![y2]);
        let cat = self.push(format!("{name}.cat"), Op::Concat, vec![x, y1, y2, y3]);
        self.conv(&format!("{name}.cv2"), m.cv2(), Activation::Silu, cat)
    }
}

impl YoloV8 {
    /// The evaluation graph with every BatchNorm folded into its convolution (the arithmetic of
    /// [`YoloV8::fuse`]), weights as float32 on the CPU.
    pub fn graph(&self) -> Result<Graph> {
        let unsupported = || {
            ModelError::BadInput(format!(
                "{}: its C3k2 / C2PSA blocks and depthwise head have no graph description, so it cannot be exported",
                self.config().name()
            ))
        };
        let views = self.layer_views().ok_or_else(unsupported)?;
        let branches = self.detect_branches().ok_or_else(unsupported)?;
        let mut b = Builder { nodes: Vec::new() };
        let mut outs: Vec<ValueId> = Vec::with_capacity(self.layers_len());
        for (i, layer) in views.into_iter().enumerate() {
            let name = format!("model.{i}");
            let prev = outs.last().copied().unwrap_or(0);
            let v = match layer {
                LayerView::Conv(c) => b.conv(&name, c, Activation::Silu, prev)?,
                LayerView::C2f(m) => b.c2f(&name, m, prev)?,
                LayerView::Sppf(m) => b.sppf(&name, m, prev)?,
                LayerView::Upsample => b.push(name, Op::Upsample { scale: 2 }, vec![prev]),
                LayerView::Concat(j) => {
                    let other = *outs.get(j).ok_or_else(|| ModelError::BadInput(format!("{name}: concat of {j}")))?;
                    b.push(name, Op::Concat, vec![prev, other])
                }
            };
            outs.push(v);
        }
        let feats = [outs[15], outs[18], outs[21]];
        let mut head_inputs = Vec::with_capacity(6);
        for (i, (boxes, classes)) in branches.into_iter().enumerate() {
            for (branch, (c0, c1, out_w, out_b)) in [("cv2", boxes), ("cv3", classes)] {
                let p = format!("model.22.{branch}.{i}");
                let h = b.conv(&format!("{p}.0"), c0, Activation::Silu, feats[i])?;
                let h = b.conv(&format!("{p}.1"), c1, Activation::Silu, h)?;
                let op = ConvOp {
                    weight: cpu_f32(out_w)?,
                    bias: cpu_f32(out_b)?,
                    stride: 1,
                    pad: 0,
                    groups: 1,
                    act: Activation::Identity,
                };
                head_inputs.push(b.push(format!("{p}.2"), Op::Conv(op), vec![h]));
            }
        }
        let decode = DetectDecode { reg_max: REG_MAX, nc: self.config().nc, strides: STRIDES.to_vec() };
        let output = b.push("model.22", Op::Detect(decode), head_inputs);
        Ok(Graph { nodes: b.nodes, in_channels: 3, stride: STRIDES[2], head: "Detect".into(), output })
    }
}

/// A borrowed view of one top-level layer (see [`YoloV8::layer_views`]).
pub(crate) enum LayerView<'a> {
    Conv(&'a Conv),
    C2f(&'a C2f),
    Sppf(&'a Sppf),
    Upsample,
    Concat(usize),
}

pub(crate) fn cpu_f32(t: &Tensor) -> Result<Tensor> {
    Ok(t.detach().to_dtype(candle_core::DType::F32)?.to_device(&candle_core::Device::Cpu)?)
}
