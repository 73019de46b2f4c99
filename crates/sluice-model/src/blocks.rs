//! YOLO11's and YOLO26's blocks: C3k2 (C2f whose inner blocks are narrow Bottlenecks, C3k, or a Bottleneck and a
//! PSABlock), C3k, and C2PSA with its PSABlocks and multi-head Attention, each in eval or train mode and foldable like the YOLOv8 blocks of [`crate::layers`].

use candle_core::{DType, Result, Tensor};

use crate::graph::{AttentionOp, Builder, Op, ValueId};
use crate::layers::{Bottleneck, Conv, Mode};
use crate::params::Params;

/// C3k: `cv3(cat(m(cv1(x)), cv2(x)))` with two Bottlenecks (3×3, full width) in `m`.
#[derive(Debug, Clone)]
pub(crate) struct C3k {
    cv1: Conv,
    cv2: Conv,
    cv3: Conv,
    m: Vec<Bottleneck>,
}

impl C3k {
    fn new(p: &Params<'_>, c1: usize, c2: usize, n: usize, shortcut: bool) -> Result<Self> {
        let c = c2 / 2;
        let (cv1, cv2, cv3) = (
            Conv::new(&p.pp("cv1"), c1, c, 1, 1)?,
            Conv::new(&p.pp("cv2"), c1, c, 1, 1)?,
            Conv::new(&p.pp("cv3"), 2 * c, c2, 1, 1)?,
        );
        // PyTorch's C3k first builds C3's own blocks (1x1 then 3x3 Bottlenecks), then replaces them: their draws
        // come before those of the blocks kept.
        p.skip_draws(n * 10 * c * c);
        let m = (0..n).map(|i| Bottleneck::with_hidden(&p.pp("m").pp(i), c, c, shortcut)).collect::<Result<_>>()?;
        Ok(Self { cv1, cv2, cv3, m })
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let mut y = self.cv1.forward(x, mode)?;
        for b in &self.m {
            y = b.forward(&y, mode)?;
        }
        self.cv3.forward(&Tensor::cat(&[&y, &self.cv2.forward(x, mode)?], 1)?, mode)
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            cv1: self.cv1.fused(dtype)?,
            cv2: self.cv2.fused(dtype)?,
            cv3: self.cv3.fused(dtype)?,
            m: self.m.iter().map(|b| b.fused(dtype)).collect::<Result<_>>()?,
        })
    }

    fn describe(&self, b: &mut Builder, name: &str, x: ValueId) -> crate::error::Result<ValueId> {
        let mut y = b.conv(&format!("{name}.cv1"), &self.cv1, x)?;
        for (i, m) in self.m.iter().enumerate() {
            y = m.describe(b, &format!("{name}.m.{i}"), y)?;
        }
        let z = b.conv(&format!("{name}.cv2"), &self.cv2, x)?;
        let cat = b.push(format!("{name}.cat"), Op::Concat, vec![y, z]);
        b.conv(&format!("{name}.cv3"), &self.cv3, cat)
    }

    fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        for (n, c) in [("cv1", &self.cv1), ("cv2", &self.cv2), ("cv3", &self.cv3)] {
            out.push((format!("{prefix}.{n}"), c));
        }
        for (i, b) in self.m.iter().enumerate() {
            b.convs(&format!("{prefix}.m.{i}"), out);
        }
    }
}

/// An inner block of C3k2.
#[derive(Debug, Clone)]
enum Inner {
    /// `Bottleneck(c, c, shortcut, e=0.5)`.
    Bottleneck(Bottleneck),
    /// `C3k(c, c, 2, shortcut)`.
    C3k(C3k),
    /// `Sequential(Bottleneck(c, c, shortcut, e=0.5), PSABlock(c, 0.5, max(c / 64, 1)))` (YOLO26's `attn`).
    Attn(Bottleneck, Box<PsaBlock>),
}

/// C3k2: cv1 (1×1, 2c) → split → n inner blocks chained on the second half → concat of all → cv2 (1×1), with
/// `c = c2·e`.
#[derive(Debug, Clone)]
pub(crate) struct C3k2 {
    c: usize,
    cv1: Conv,
    cv2: Conv,
    m: Vec<Inner>,
}

impl C3k2 {
    /// `C3k2(c1, c2, n, c3k, e, attn)` with Ultralytics' default `shortcut=True`.
    pub(crate) fn new(p: &Params<'_>, c1: usize, c2: usize, n: usize, c3k: bool, e: f64, attn: bool) -> Result<Self> {
        let c = (c2 as f64 * e) as usize;
        let cv1 = Conv::new(&p.pp("cv1"), c1, 2 * c, 1, 1)?;
        let cv2 = Conv::new(&p.pp("cv2"), (2 + n) * c, c2, 1, 1)?;
        // PyTorch's C3k2 first builds C2f's own blocks (3x3 Bottlenecks at full width), then replaces them: their
        // draws come before those of the blocks kept.
        p.skip_draws(n * 18 * c * c);
        let m = (0..n)
            .map(|i| {
                let q = p.pp("m").pp(i);
                Ok(if attn {
                    Inner::Attn(
                        Bottleneck::with_hidden(&q.pp(0), c, c / 2, true)?,
                        Box::new(PsaBlock::new(&q.pp(1), c, (c / 64).max(1))?),
                    )
                } else if c3k {
                    Inner::C3k(C3k::new(&q, c, c, 2, true)?)
                } else {
                    Inner::Bottleneck(Bottleneck::with_hidden(&q, c, c / 2, true)?)
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { c, cv1, cv2, m })
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.cv1.forward(x, mode)?;
        let mut ys = vec![y.narrow(1, 0, self.c)?, y.narrow(1, self.c, self.c)?];
        for b in &self.m {
            let last = ys.last().cloned().ok_or_else(|| candle_core::Error::Msg("C3k2: empty".into()))?;
            ys.push(match b {
                Inner::Bottleneck(b) => b.forward(&last, mode)?,
                Inner::C3k(b) => b.forward(&last, mode)?,
                Inner::Attn(b, a) => a.forward(&b.forward(&last, mode)?, mode)?,
            });
        }
        self.cv2.forward(&Tensor::cat(&ys, 1)?, mode)
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            c: self.c,
            cv1: self.cv1.fused(dtype)?,
            cv2: self.cv2.fused(dtype)?,
            m: self
                .m
                .iter()
                .map(|b| {
                    Ok(match b {
                        Inner::Bottleneck(b) => Inner::Bottleneck(b.fused(dtype)?),
                        Inner::C3k(b) => Inner::C3k(b.fused(dtype)?),
                        Inner::Attn(b, a) => Inner::Attn(b.fused(dtype)?, Box::new(a.fused(dtype)?)),
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    /// The evaluation graph of the block on `x`.
    pub(crate) fn describe(&self, b: &mut Builder, name: &str, x: ValueId) -> crate::error::Result<ValueId> {
        let y = b.conv(&format!("{name}.cv1"), &self.cv1, x)?;
        let c = self.c;
        let mut ys = vec![
            b.push(format!("{name}.split0"), Op::Slice { start: 0, len: c }, vec![y]),
            b.push(format!("{name}.split1"), Op::Slice { start: c, len: c }, vec![y]),
        ];
        for (i, m) in self.m.iter().enumerate() {
            let last = ys[ys.len() - 1];
            let q = format!("{name}.m.{i}");
            ys.push(match m {
                Inner::Bottleneck(m) => m.describe(b, &q, last)?,
                Inner::C3k(m) => m.describe(b, &q, last)?,
                Inner::Attn(m, a) => {
                    let h = m.describe(b, &format!("{q}.0"), last)?;
                    a.describe(b, &format!("{q}.1"), h)?
                }
            });
        }
        let cat = b.push(format!("{name}.cat"), Op::Concat, ys);
        b.conv(&format!("{name}.cv2"), &self.cv2, cat)
    }

    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        out.push((format!("{prefix}.cv1"), &self.cv1));
        out.push((format!("{prefix}.cv2"), &self.cv2));
        for (i, b) in self.m.iter().enumerate() {
            let q = format!("{prefix}.m.{i}");
            match b {
                Inner::Bottleneck(b) => b.convs(&q, out),
                Inner::C3k(b) => b.convs(&q, out),
                Inner::Attn(b, a) => {
                    b.convs(&format!("{q}.0"), out);
                    a.convs(&format!("{q}.1"), out);
                }
            }
        }
    }
}

/// Multi-head self-attention over the pixels of a map: `qkv` (1×1, no SiLU) → per head `softmax(qᵀk·d⁻¹ᐟ²)` applied
/// to `v`, plus a depthwise 3×3 positional encoding of `v` (`pe`), then `proj` (1×1, no SiLU).
#[derive(Debug, Clone)]
struct Attention {
    heads: usize,
    key_dim: usize,
    head_dim: usize,
    qkv: Conv,
    proj: Conv,
    pe: Conv,
}

impl Attention {
    fn new(p: &Params<'_>, dim: usize, heads: usize, attn_ratio: f64) -> Result<Self> {
        let head_dim = dim / heads;
        let key_dim = (head_dim as f64 * attn_ratio) as usize;
        let h = dim + 2 * key_dim * heads;
        Ok(Self {
            heads,
            key_dim,
            head_dim,
            qkv: Conv::linear(&p.pp("qkv"), dim, h, 1, 1)?,
            proj: Conv::linear(&p.pp("proj"), dim, dim, 1, 1)?,
            pe: Conv::depthwise(&p.pp("pe"), dim, 3, false)?,
        })
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let (b, c, h, w) = x.dims4()?;
        let n = h * w;
        let (nh, kd, hd) = (self.heads, self.key_dim, self.head_dim);
        let qkv = self.qkv.forward(x, mode)?.reshape((b, nh, 2 * kd + hd, n))?;
        let q = qkv.narrow(2, 0, kd)?;
        let k = qkv.narrow(2, kd, kd)?.contiguous()?;
        let v = qkv.narrow(2, 2 * kd, hd)?.contiguous()?;
        let scale = (kd as f64).powf(-0.5);
        let attn = (q * scale)?.transpose(2, 3)?.contiguous()?.matmul(&k)?; // (B, nh, N, N)
        let attn = crate::ops::softmax(&attn, 3)?;
        let y = v.matmul(&attn.transpose(2, 3)?.contiguous()?)?.reshape((b, c, h, w))?;
        let y = (y + self.pe.forward(&v.reshape((b, c, h, w))?, mode)?)?;
        self.proj.forward(&y, mode)
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            qkv: self.qkv.fused(dtype)?,
            proj: self.proj.fused(dtype)?,
            pe: self.pe.fused(dtype)?,
            ..self.clone()
        })
    }

    fn describe(&self, b: &mut Builder, name: &str, x: ValueId) -> crate::error::Result<ValueId> {
        let shape = AttentionOp { heads: self.heads, key_dim: self.key_dim, head_dim: self.head_dim };
        let qkv = b.conv(&format!("{name}.qkv"), &self.qkv, x)?;
        let attn = b.push(format!("{name}.attn"), Op::Attention(shape), vec![qkv]);
        let v = b.push(format!("{name}.v"), Op::AttentionValues(shape), vec![qkv]);
        let pe = b.conv(&format!("{name}.pe"), &self.pe, v)?;
        let y = b.push(format!("{name}.add"), Op::Add, vec![attn, pe]);
        b.conv(&format!("{name}.proj"), &self.proj, y)
    }

    fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        for (n, c) in [("qkv", &self.qkv), ("proj", &self.proj), ("pe", &self.pe)] {
            out.push((format!("{prefix}.{n}"), c));
        }
    }
}

/// PSABlock: `x + attn(x)`, then `x + ffn(x)` with `ffn` = Conv 1×1 (2c, SiLU) → Conv 1×1 (c, no SiLU).
#[derive(Debug, Clone)]
struct PsaBlock {
    attn: Attention,
    ffn0: Conv,
    ffn1: Conv,
}

impl PsaBlock {
    fn new(p: &Params<'_>, c: usize, heads: usize) -> Result<Self> {
        Ok(Self {
            attn: Attention::new(&p.pp("attn"), c, heads, 0.5)?,
            ffn0: Conv::new(&p.pp("ffn").pp(0), c, 2 * c, 1, 1)?,
            ffn1: Conv::linear(&p.pp("ffn").pp(1), 2 * c, c, 1, 1)?,
        })
    }

    fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let x = (x + self.attn.forward(x, mode)?)?;
        let f = self.ffn1.forward(&self.ffn0.forward(&x, mode)?, mode)?;
        x + f
    }

    fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self { attn: self.attn.fused(dtype)?, ffn0: self.ffn0.fused(dtype)?, ffn1: self.ffn1.fused(dtype)? })
    }

    fn describe(&self, b: &mut Builder, name: &str, x: ValueId) -> crate::error::Result<ValueId> {
        let a = self.attn.describe(b, &format!("{name}.attn"), x)?;
        let x = b.push(format!("{name}.add0"), Op::Add, vec![x, a]);
        let f = b.conv(&format!("{name}.ffn.0"), &self.ffn0, x)?;
        let f = b.conv(&format!("{name}.ffn.1"), &self.ffn1, f)?;
        Ok(b.push(format!("{name}.add1"), Op::Add, vec![x, f]))
    }

    fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        self.attn.convs(&format!("{prefix}.attn"), out);
        out.push((format!("{prefix}.ffn.0"), &self.ffn0));
        out.push((format!("{prefix}.ffn.1"), &self.ffn1));
    }
}

/// C2PSA: cv1 (1×1, 2c) → split (a, b) → n PSABlocks on b (`max(c / 64, 1)` heads) → cv2(cat(a, b)), `c = c1 / 2`.
#[derive(Debug, Clone)]
pub(crate) struct C2psa {
    c: usize,
    cv1: Conv,
    cv2: Conv,
    m: Vec<PsaBlock>,
}

impl C2psa {
    pub(crate) fn new(p: &Params<'_>, c1: usize, c2: usize, n: usize) -> Result<Self> {
        let c = c1 / 2;
        let heads = (c / 64).max(1);
        Ok(Self {
            c,
            cv1: Conv::new(&p.pp("cv1"), c1, 2 * c, 1, 1)?,
            cv2: Conv::new(&p.pp("cv2"), 2 * c, c2, 1, 1)?,
            m: (0..n).map(|i| PsaBlock::new(&p.pp("m").pp(i), c, heads)).collect::<Result<_>>()?,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor, mode: Mode) -> Result<Tensor> {
        let y = self.cv1.forward(x, mode)?;
        let a = y.narrow(1, 0, self.c)?;
        let mut b = y.narrow(1, self.c, self.c)?;
        for m in &self.m {
            b = m.forward(&b, mode)?;
        }
        self.cv2.forward(&Tensor::cat(&[&a, &b], 1)?, mode)
    }

    pub(crate) fn fused(&self, dtype: DType) -> Result<Self> {
        Ok(Self {
            c: self.c,
            cv1: self.cv1.fused(dtype)?,
            cv2: self.cv2.fused(dtype)?,
            m: self.m.iter().map(|b| b.fused(dtype)).collect::<Result<_>>()?,
        })
    }

    /// The evaluation graph of the block on `x`.
    pub(crate) fn describe(&self, b: &mut Builder, name: &str, x: ValueId) -> crate::error::Result<ValueId> {
        let y = b.conv(&format!("{name}.cv1"), &self.cv1, x)?;
        let a = b.push(format!("{name}.split0"), Op::Slice { start: 0, len: self.c }, vec![y]);
        let mut h = b.push(format!("{name}.split1"), Op::Slice { start: self.c, len: self.c }, vec![y]);
        for (i, m) in self.m.iter().enumerate() {
            h = m.describe(b, &format!("{name}.m.{i}"), h)?;
        }
        let cat = b.push(format!("{name}.cat"), Op::Concat, vec![a, h]);
        b.conv(&format!("{name}.cv2"), &self.cv2, cat)
    }

    pub(crate) fn convs<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a Conv)>) {
        out.push((format!("{prefix}.cv1"), &self.cv1));
        out.push((format!("{prefix}.cv2"), &self.cv2));
        for (i, m) in self.m.iter().enumerate() {
            m.convs(&format!("{prefix}.m.{i}"), out);
        }
    }
}
