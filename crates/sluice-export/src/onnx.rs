//! The ONNX writer: a [`Graph`] of `sluice-model` becomes an ONNX `ModelProto` (the prost types of [`crate::pb`],
//! encoded by prost) in Ultralytics' layout: input `images` `(B, 3, H, W)`, output `output0` `(B, 4 + nc, anchors)`,
//! the anchors computed inside the graph from the feature maps' shapes so that one graph serves fixed and symbolic
//! input sizes.

use prost::Message;
use sluice_model::candle_core::{DType, Tensor};
use sluice_model::{Activation, AttentionOp, ConvOp, DetectDecode, Graph, Node, Op};

use crate::error::{ExportError, Result};
use crate::metadata::Metadata;
use crate::pb::attribute_proto::AttributeType;
use crate::pb::tensor_proto::DataType;
use crate::pb::tensor_shape_proto::{Dimension, dimension};
use crate::pb::type_proto;
use crate::pb::{
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, StringStringEntryProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};

/// The lowest and highest opsets the writer emits (every operator it uses has its current form from 13 on;
/// Ultralytics' exports are 17 and newer).
pub const OPSETS: std::ops::RangeInclusive<i64> = 17..=22;

/// How to write the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct OnnxOptions {
    /// Input height and width (multiples of the graph's stride); with `dynamic` they are only the metadata's
    /// `imgsz`.
    pub imgsz: (usize, usize),
    /// Batch size; with `dynamic` only the metadata's `batch`.
    pub batch: usize,
    /// Symbolic `batch`, `height` and `width` (and `anchors` on the output).
    pub dynamic: bool,
    /// float16 weights, input and output (and arithmetic), as Ultralytics' half exports on a GPU.
    pub half: bool,
    /// The ONNX opset, in [`OPSETS`].
    pub opset: i64,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        Self { imgsz: (640, 640), batch: 1, dynamic: false, half: false, opset: 17 }
    }
}

/// The IR version that goes with an opset (ONNX's versioning table; Ultralytics caps it at 10).
fn ir_version(opset: i64) -> i64 {
    match opset {
        ..=18 => 8,
        19 | 20 => 9,
        _ => 10,
    }
}

/// Writes `graph` as an ONNX model.
pub fn to_model_proto(graph: &Graph, opts: &OnnxOptions, meta: &Metadata) -> Result<ModelProto> {
    check_options(graph, opts)?;
    let dt = if opts.half { DataType::Float16 } else { DataType::Float };
    let mut w = Writer { g: GraphProto { name: "main_graph".into(), ..Default::default() }, dt };
    let mut names: Vec<String> = Vec::with_capacity(graph.nodes.len() + 1);
    names.push("images".into());
    let mut channels = vec![graph.in_channels];
    for (i, node) in graph.nodes.iter().enumerate() {
        let inputs: Vec<&str> = node
            .inputs
            .iter()
            .map(|&v| names.get(v).map(String::as_str))
            .collect::<Option<_>>()
            .ok_or_else(|| unsupported(&node.name, format!("an input from a later value ({:?})", node.inputs)))?;
        let out = if i + 1 == graph.output { "output0".to_string() } else { format!("/{}/output", node.name) };
        let c = w.op(node, &inputs, &out, &channels)?;
        names.push(out);
        channels.push(c);
    }
    if graph.output != graph.nodes.len() {
        return Err(unsupported("output", format!("the output is value {}, not the last node's", graph.output)));
    }
    let nc_out = channels[graph.output];
    let (b, (h, wd)) = (opts.batch as i64, opts.imgsz);
    let anchors: usize = match graph.nodes.last().map(|n| &n.op) {
        Some(Op::Detect(d)) => d.strides.iter().map(|s| (h / s) * (wd / s)).sum(),
        _ => return Err(unsupported("output", "the last node is not a detection decode".into())),
    };
    let dim = |fixed: i64, name: &str| if opts.dynamic { Dim::Param(name.into()) } else { Dim::Value(fixed) };
    w.g.input.push(value_info(
        "images",
        w.dt,
        &[dim(b, "batch"), Dim::Value(graph.in_channels as i64), dim(h as i64, "height"), dim(wd as i64, "width")],
    ));
    w.g.output.push(value_info(
        "output0",
        w.dt,
        &[dim(b, "batch"), Dim::Value(nc_out as i64), dim(anchors as i64, "anchors")],
    ));
    Ok(ModelProto {
        ir_version: ir_version(opts.opset),
        producer_name: "sluice".into(),
        producer_version: env!("CARGO_PKG_VERSION").into(),
        opset_import: vec![OperatorSetIdProto { domain: String::new(), version: opts.opset }],
        graph: Some(w.g),
        metadata_props: meta
            .props()
            .into_iter()
            .map(|(k, v)| StringStringEntryProto { key: k.into(), value: v })
            .collect(),
        ..Default::default()
    })
}

/// Writes `graph` as ONNX protobuf bytes.
pub fn to_onnx_bytes(graph: &Graph, opts: &OnnxOptions, meta: &Metadata) -> Result<Vec<u8>> {
    Ok(to_model_proto(graph, opts, meta)?.encode_to_vec())
}

fn check_options(graph: &Graph, opts: &OnnxOptions) -> Result<()> {
    let (h, w) = opts.imgsz;
    let s = graph.stride;
    if h == 0 || w == 0 || !h.is_multiple_of(s) || !w.is_multiple_of(s) {
        return Err(ExportError::Options(format!("imgsz {h}x{w}: both sides must be positive multiples of {s}")));
    }
    if opts.batch == 0 {
        return Err(ExportError::Options("batch must be at least 1".into()));
    }
    if !OPSETS.contains(&opts.opset) {
        return Err(ExportError::Options(format!(
            "opset {} is not supported: the writer emits opsets {} to {}",
            opts.opset,
            OPSETS.start(),
            OPSETS.end()
        )));
    }
    Ok(())
}

fn unsupported(node: &str, reason: String) -> ExportError {
    ExportError::Unsupported { node: node.into(), reason }
}

fn tensor_err(node: &str, source: sluice_model::candle_core::Error) -> ExportError {
    ExportError::Tensor { node: node.into(), source }
}

enum Dim {
    Value(i64),
    Param(String),
}

fn value_info(name: &str, dt: DataType, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Dim::Value(v) => dimension::Value::DimValue(*v),
                Dim::Param(p) => dimension::Value::DimParam(p.clone()),
            }),
            ..Default::default()
        })
        .collect();
    let t = type_proto::Tensor { elem_type: dt as i32, shape: Some(TensorShapeProto { dim }) };
    let ty = TypeProto { value: Some(type_proto::Value::TensorType(t)), ..Default::default() };
    ValueInfoProto { name: name.into(), r#type: Some(ty), ..Default::default() }
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: AttributeType::Int as i32, i, ..Default::default() }
}

fn ints_attr(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto { name: name.into(), r#type: AttributeType::Ints as i32, ints: v.to_vec(), ..Default::default() }
}

fn str_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: AttributeType::String as i32,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// Builds the graph proto: nodes and initializers, in the float type of the export (`dt`).
struct Writer {
    g: GraphProto,
    dt: DataType,
}

impl Writer {
    /// Writes `node` (its inputs' names `inputs`, its output's name `out`) and returns its output's channels;
    /// `channels` holds the channels of the values before it.
    fn op(&mut self, node: &Node, inputs: &[&str], out: &str, channels: &[usize]) -> Result<usize> {
        Ok(match &node.op {
            Op::Conv(conv) => {
                self.conv(&node.name, conv, inputs[0], out)?;
                conv.weight.dim(0).map_err(|e| tensor_err(&node.name, e))?
            }
            Op::Slice { start, len } => {
                let starts = self.ints(&format!("{}.starts", node.name), &[*start as i64]);
                let ends = self.ints(&format!("{}.ends", node.name), &[(*start + *len) as i64]);
                let axes = self.ints(&format!("{}.axes", node.name), &[1]);
                self.node("Slice", &node.name, &[inputs[0], &starts, &ends, &axes], out, vec![]);
                *len
            }
            Op::Concat => {
                self.node("Concat", &node.name, inputs, out, vec![int_attr("axis", 1)]);
                node.inputs.iter().map(|&v| channels[v]).sum()
            }
            Op::Add => {
                self.node("Add", &node.name, inputs, out, vec![]);
                channels[node.inputs[0]]
            }
            Op::MaxPool { kernel } => {
                let (k, p) = (*kernel as i64, (*kernel / 2) as i64);
                let attrs = vec![
                    ints_attr("kernel_shape", &[k, k]),
                    ints_attr("strides", &[1, 1]),
                    ints_attr("pads", &[p, p, p, p]),
                    ints_attr("dilations", &[1, 1]),
                    int_attr("ceil_mode", 0),
                ];
                self.node("MaxPool", &node.name, &[inputs[0]], out, attrs);
                channels[node.inputs[0]]
            }
            Op::Upsample { scale } => {
                let s = *scale as f32;
                let scales = self.floats32(&format!("{}.scales", node.name), &[1.0, 1.0, s, s]);
                let attrs = vec![
                    str_attr("mode", "nearest"),
                    str_attr("coordinate_transformation_mode", "asymmetric"),
                    str_attr("nearest_mode", "floor"),
                ];
                self.node("Resize", &node.name, &[inputs[0], "", &scales], out, attrs);
                channels[node.inputs[0]]
            }
            Op::Detect(d) => {
                self.detect(&node.name, d, inputs, out)?;
                4 + d.nc
            }
            Op::Attention(a) => {
                self.attention(&node.name, a, inputs[0], out, false);
                a.heads * a.head_dim
            }
            Op::AttentionValues(a) => {
                self.attention(&node.name, a, inputs[0], out, true);
                a.heads * a.head_dim
            }
            other => return Err(unsupported(&node.name, format!("no ONNX form for {other:?}"))),
        })
    }

    fn node(&mut self, op: &str, name: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) {
        let mut node_name = format!("/{name}/{op}");
        // Node names stay unique when one module emits several nodes of one type.
        if self.g.node.iter().any(|m| m.name == node_name) {
            node_name = format!("{node_name}_{}", self.g.node.len());
        }
        self.g.node.push(NodeProto {
            op_type: op.into(),
            name: node_name,
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: vec![output.into()],
            attribute,
            ..Default::default()
        });
    }

    /// An int64 initializer; returns its name.
    fn ints(&mut self, name: &str, v: &[i64]) -> String {
        self.g.initializer.push(TensorProto {
            name: name.into(),
            data_type: DataType::Int64 as i32,
            dims: vec![v.len() as i64],
            raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ..Default::default()
        });
        name.into()
    }

    /// A float32 initializer whatever the export's float type (Resize's `scales` is always float32).
    fn floats32(&mut self, name: &str, v: &[f32]) -> String {
        self.g.initializer.push(TensorProto {
            name: name.into(),
            data_type: DataType::Float as i32,
            dims: vec![v.len() as i64],
            raw_data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ..Default::default()
        });
        name.into()
    }

    /// A float initializer of the export's type with these dims.
    fn floats(&mut self, name: &str, dims: &[i64], v: &[f32]) -> String {
        let raw_data = if self.dt == DataType::Float16 {
            v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect()
        } else {
            v.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
        self.g.initializer.push(TensorProto {
            name: name.into(),
            data_type: self.dt as i32,
            dims: dims.to_vec(),
            raw_data,
            ..Default::default()
        });
        name.into()
    }

    fn tensor(&mut self, node: &str, name: &str, t: &Tensor) -> Result<String> {
        let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
        let v = t
            .to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .map_err(|e| tensor_err(node, e))?;
        Ok(self.floats(name, &dims, &v))
    }

    fn conv(&mut self, name: &str, c: &ConvOp, x: &str, out: &str) -> Result<()> {
        let (_, _, kh, kw) = c.weight.dims4().map_err(|e| tensor_err(name, e))?;
        let w = self.tensor(name, &format!("{name}.conv.weight"), &c.weight)?;
        let b = self.tensor(name, &format!("{name}.conv.bias"), &c.bias)?;
        let (s, p) = (c.stride as i64, c.pad as i64);
        let attrs = vec![
            ints_attr("dilations", &[1, 1]),
            int_attr("group", c.groups as i64),
            ints_attr("kernel_shape", &[kh as i64, kw as i64]),
            ints_attr("pads", &[p, p, p, p]),
            ints_attr("strides", &[s, s]),
        ];
        match c.act {
            Activation::Identity => self.node("Conv", name, &[x, &w, &b], out, attrs),
            Activation::Silu => {
                let y = format!("/{name}/conv/output");
                let sig = format!("/{name}/act/Sigmoid_output");
                self.node("Conv", name, &[x, &w, &b], &y, attrs);
                self.node("Sigmoid", &format!("{name}/act"), &[&y], &sig, vec![]);
                self.node("Mul", &format!("{name}/act"), &[&y, &sig], out, vec![]);
            }
        }
        Ok(())
    }

    /// Multi-head attention over a map's pixels (see [`Op::Attention`]) or, with `values_only`, its `v` part: the
    /// `qkv` map is reshaped to `(B, heads, 2·key_dim + head_dim, H·W)` and sliced; the result is reshaped back to
    /// `(B, heads·head_dim, H, W)` with H and W read from `qkv`'s runtime shape.
    fn attention(&mut self, name: &str, a: &AttentionOp, qkv: &str, out: &str, values_only: bool) {
        let o = |s: &str| format!("/{name}/{s}");
        let (nh, kd, hd) = (a.heads as i64, a.key_dim as i64, a.head_dim as i64);
        let split = self.ints(&format!("{name}.split_shape"), &[0, nh, 2 * kd + hd, -1]);
        self.node("Reshape", name, &[qkv, &split], &o("heads"), vec![]);
        let ax2 = self.ints(&format!("{name}.ax2"), &[2]);
        let bounds = [0, kd, 2 * kd, 2 * kd + hd];
        let names = ["q", "k", "v"];
        for (i, part) in names.iter().enumerate() {
            if values_only && *part != "v" {
                continue;
            }
            let lo = self.ints(&format!("{name}.{part}_lo"), &[bounds[i]]);
            let hi = self.ints(&format!("{name}.{part}_hi"), &[bounds[i + 1]]);
            self.node("Slice", name, &[&o("heads"), &lo, &hi, &ax2], &o(part), vec![]);
        }
        // The output shape (B, heads·head_dim, H, W): B copied (0), H and W from qkv's shape.
        self.node("Shape", name, &[qkv], &o("qkv_shape"), vec![]);
        let (s2, s4) = (self.ints(&format!("{name}.hw_lo"), &[2]), self.ints(&format!("{name}.hw_hi"), &[4]));
        self.node("Slice", name, &[&o("qkv_shape"), &s2, &s4], &o("hw"), vec![]);
        let bc = self.ints(&format!("{name}.bc"), &[0, nh * hd]);
        self.node("Concat", name, &[&bc, &o("hw")], &o("out_shape"), vec![int_attr("axis", 0)]);
        if values_only {
            self.node("Reshape", name, &[&o("v"), &o("out_shape")], out, vec![]);
            return;
        }
        let scale = self.scalar(&format!("{name}.scale"), (kd as f32).powf(-0.5));
        self.node("Mul", name, &[&o("q"), &scale], &o("q_scaled"), vec![]);
        self.node("Transpose", name, &[&o("q_scaled")], &o("q_t"), vec![ints_attr("perm", &[0, 1, 3, 2])]);
        self.node("MatMul", name, &[&o("q_t"), &o("k")], &o("logits"), vec![]);
        self.node("Softmax", name, &[&o("logits")], &o("attn"), vec![int_attr("axis", -1)]);
        self.node("Transpose", name, &[&o("attn")], &o("attn_t"), vec![ints_attr("perm", &[0, 1, 3, 2])]);
        self.node("MatMul", name, &[&o("v"), &o("attn_t")], &o("mixed"), vec![]);
        self.node("Reshape", name, &[&o("mixed"), &o("out_shape")], out, vec![]);
    }

    /// A scalar constant of the export's float type, as an initializer.
    fn scalar(&mut self, name: &str, v: f32) -> String {
        self.floats(name, &[], &[v])
    }

    /// The anchor centres `(1, 2, H·W)` of a feature map, in grid units, from its runtime shape.
    fn anchors(&mut self, p: &str, feat: &str) -> String {
        let o = |s: &str| format!("/{p}/{s}");
        self.node("Shape", p, &[feat], &o("shape"), vec![]);
        let (i2, i3) = (self.int_scalar(&format!("{p}.dim_h"), 2), self.int_scalar(&format!("{p}.dim_w"), 3));
        self.node("Gather", p, &[&o("shape"), &i2], &o("h"), vec![int_attr("axis", 0)]);
        self.node("Gather", p, &[&o("shape"), &i3], &o("w"), vec![int_attr("axis", 0)]);
        let (zero, one) = (self.int_scalar(&format!("{p}.zero"), 0), self.int_scalar(&format!("{p}.one"), 1));
        let half = self.scalar(&format!("{p}.half"), 0.5);
        let ax0 = self.ints(&format!("{p}.axis0"), &[0]);
        let ax1 = self.ints(&format!("{p}.axis1"), &[1]);
        let flat = self.ints(&format!("{p}.flat"), &[1, 1, -1]);
        for (side, along) in [("w", &ax0), ("h", &ax1)] {
            self.node("Range", p, &[&zero, &o(side), &one], &o(&format!("range_{side}")), vec![]);
            let cast = vec![int_attr("to", self.dt as i64)];
            self.node("Cast", p, &[&o(&format!("range_{side}"))], &o(&format!("cast_{side}")), cast);
            self.node("Add", p, &[&o(&format!("cast_{side}")), &half], &o(&format!("centre_{side}")), vec![]);
            // x varies along W: a row (1, W); y along H: a column (H, 1).
            self.node("Unsqueeze", p, &[&o(&format!("centre_{side}")), along], &o(&format!("u_{side}")), vec![]);
        }
        self.node("Unsqueeze", p, &[&o("h"), &ax0], &o("h1"), vec![]);
        self.node("Unsqueeze", p, &[&o("w"), &ax0], &o("w1"), vec![]);
        self.node("Concat", p, &[&o("h1"), &o("w1")], &o("hw"), vec![int_attr("axis", 0)]);
        for side in ["w", "h"] {
            self.node("Expand", p, &[&o(&format!("u_{side}")), &o("hw")], &o(&format!("grid_{side}")), vec![]);
            self.node("Reshape", p, &[&o(&format!("grid_{side}")), &flat], &o(&format!("flat_{side}")), vec![]);
        }
        self.node("Concat", p, &[&o("flat_w"), &o("flat_h")], &o("anchors"), vec![int_attr("axis", 1)]);
        o("anchors")
    }

    fn int_scalar(&mut self, name: &str, v: i64) -> String {
        self.g.initializer.push(TensorProto {
            name: name.into(),
            data_type: DataType::Int64 as i32,
            raw_data: v.to_le_bytes().to_vec(),
            ..Default::default()
        });
        name.into()
    }

    /// The detection decode (see [`DetectDecode`]), level by level, concatenated along the anchors.
    fn detect(&mut self, name: &str, d: &DetectDecode, inputs: &[&str], out: &str) -> Result<()> {
        if inputs.len() != 2 * d.strides.len() {
            return Err(unsupported(name, format!("{} inputs for {} levels", inputs.len(), d.strides.len())));
        }
        let r = d.reg_max as i64;
        let proj: Vec<f32> = (0..d.reg_max).map(|i| i as f32).collect();
        let proj = self.floats(&format!("{name}.dfl.proj"), &[1, 1, r, 1], &proj);
        let dfl_shape = self.ints(&format!("{name}.dfl_shape"), &[0, 4, r, -1]);
        let cls_shape = self.ints(&format!("{name}.cls_shape"), &[0, d.nc as i64, -1]);
        let dist_shape = self.ints(&format!("{name}.dist_shape"), &[0, 4, -1]);
        let axis2 = self.ints(&format!("{name}.axis2"), &[2]);
        let (s0, s2, s4) = (
            self.ints(&format!("{name}.s0"), &[0]),
            self.ints(&format!("{name}.s2"), &[2]),
            self.ints(&format!("{name}.s4"), &[4]),
        );
        let ax1 = self.ints(&format!("{name}.ax1"), &[1]);
        let half = self.scalar(&format!("{name}.half"), 0.5);
        let mut levels = Vec::with_capacity(d.strides.len());
        for (i, &stride) in d.strides.iter().enumerate() {
            let p = format!("{name}/level{i}");
            let o = |s: &str| format!("/{p}/{s}");
            let (boxes, classes) = (inputs[2 * i], inputs[2 * i + 1]);
            if d.reg_max == 1 {
                // One bin per side (YOLO26): the branch gives the four distances.
                self.node("Reshape", &p, &[boxes, &dist_shape], &o("dist"), vec![]);
            } else {
                // DFL: softmax over the bins of each side, then the expectation of the bin index.
                self.node("Reshape", &p, &[boxes, &dfl_shape], &o("bins"), vec![]);
                self.node("Softmax", &p, &[&o("bins")], &o("softmax"), vec![int_attr("axis", 2)]);
                self.node("Mul", &p, &[&o("softmax"), &proj], &o("weighted"), vec![]);
                self.node("ReduceSum", &p, &[&o("weighted"), &axis2], &o("dist"), vec![int_attr("keepdims", 0)]);
            }
            let anchors = self.anchors(&format!("{p}/anchors"), boxes);
            self.node("Slice", &p, &[&o("dist"), &s0, &s2, &ax1], &o("lt"), vec![]);
            self.node("Slice", &p, &[&o("dist"), &s2, &s4, &ax1], &o("rb"), vec![]);
            self.node("Sub", &p, &[&anchors, &o("lt")], &o("x1y1"), vec![]);
            self.node("Add", &p, &[&anchors, &o("rb")], &o("x2y2"), vec![]);
            self.node("Add", &p, &[&o("x1y1"), &o("x2y2")], &o("sum"), vec![]);
            self.node("Mul", &p, &[&o("sum"), &half], &o("centre"), vec![]);
            self.node("Sub", &p, &[&o("x2y2"), &o("x1y1")], &o("wh"), vec![]);
            self.node("Concat", &p, &[&o("centre"), &o("wh")], &o("grid_box"), vec![int_attr("axis", 1)]);
            let s = self.scalar(&format!("{name}.stride{i}"), stride as f32);
            self.node("Mul", &p, &[&o("grid_box"), &s], &o("box"), vec![]);
            self.node("Reshape", &p, &[classes, &cls_shape], &o("logits"), vec![]);
            self.node("Sigmoid", &p, &[&o("logits")], &o("scores"), vec![]);
            self.node("Concat", &p, &[&o("box"), &o("scores")], &o("y"), vec![int_attr("axis", 1)]);
            levels.push(o("y"));
        }
        let refs: Vec<&str> = levels.iter().map(String::as_str).collect();
        self.node("Concat", name, &refs, out, vec![int_attr("axis", 2)]);
        Ok(())
    }
}
