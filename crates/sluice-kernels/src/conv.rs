//! Conv2d forward, input gradient and weight gradient as candle custom ops (im2col/col2im + gemm).
//!
//! [`conv2d`] is a drop-in for `x.conv2d(w, pad, stride, 1, 1)` (groups 1, dilation 1, square kernel). On
//! contiguous CPU f32/f64 tensors it runs as a [`CustomOp2`] whose backward pass is two more custom ops without a
//! backward of their own (f16/bf16 tensors run the f32 kernels between conversions, as cuDNN's half path accumulates
//! in f32):
//!
//! - forward: per tile of output rows, im2col into a `(c·k·k) × (rows·wo)` column matrix, one gemm `w · col`
//!   into those columns of every output channel and the epilogue (bias first, SiLU after), all while the tile is
//!   in cache; small maps stack several images into one gemm instead. Stacked, a stride-1 "same" conv with a
//!   kernel of `k > 1` rows on a map of at least 16 rows is row-shifted: its column matrix holds only the kernel's
//!   `k` columns per channel (`c·k` rows, each image with `p` halo rows above and below), and it runs as `k` gemms,
//!   the one of kernel row `ky` reading the matrix `ky` input rows further on and accumulating onto the others
//!   (for 3×3, a third of the im2col's writes). A 1×1 stride-1 unpadded conv is a plain gemm on the input image
//!   (no im2col);
//! - input gradient: `dcol = wᵀ · dy`, then col2im (for 1×1, `dx = wᵀ · dy` directly); no `conv_transpose2d`.
//!   A stride-1 "same" conv's input gradient is the forward of a "same" conv of `dy` with the kernel rotated by
//!   180° and its channel axes swapped, so it runs as one (im2col of `dy`, a gemm reducing over `o·k·k`): no
//!   column matrix `k²` times the size of `dx` to write and add back. The 3×3 stride-2 conv's input gradient is
//!   polyphase: each of the four parities of input position is a stride-1 conv of `dy` with a 1×1, 1×2, 2×1 or
//!   2×2 sub-kernel, one gemm each on shifted copies of a band of `dy`, interleaved into `dx` (no col2im);
//! - weight gradient: `dw = Σ dy · colᵀ` over the groups of the batch (row-shifted where the forward is, one gemm
//!   per kernel row), or over the forward's tiles where the forward is tiled (each tile's column matrix reduced
//!   while it is in cache).
//!
//! [`conv2d_bias`] adds a per-channel bias inside the same op (a [`CustomOp3`]): the tiled forward adds it to each
//! row segment the gemm has just written (still in L1), the stacked one starts the output rows as the bias for the
//! gemm to accumulate onto, and the bias gradient is a parallel per-channel sum; composed with
//! `broadcast_add`, candle would spend a full strided pass forward and a slow strided reduction backward.
//!
//! On a CUDA device with the `cudnn` feature, f32/bf16/f16 tensors take the same three ops, each through cuDNN
//! with its algorithm chosen once per shape (`cudnn`): stock candle would run the input gradient through its own
//! `conv_transpose2d` kernel. Any other device or dtype falls back to candle's stock conv2d, so the function is
//! always correct.
//!
//! # Batching and workspace
//! Images are stacked into one gemm until it has about 2048 columns (so the 10×10 and 20×20 maps of the deep layers
//! still give the gemm a wide right-hand side), but no group's column matrix exceeds 2 M elements and the batch is
//! split into at least as many groups as threads. Where a map alone has enough columns (one image per group), the
//! forward and the weight gradient are tiled instead: each image is cut into tiles of whole output rows whose
//! column matrix is about 256 K elements (at least 256 columns, and at least as many tiles in the batch as
//! threads); smaller and larger tiles (or a higher floor of columns) are slower on the 640/batch-1 fused forward.
//! The column matrix (and, for stacked images, the gathered output gradient) lives in a per-thread workspace that
//! only ever grows: after the first step no layer allocates one ([`peak_workspace_bytes`] reports the high-water
//! mark over all threads).
//!
//! # Threads
//! All parallelism uses rayon's *global* pool, the pool candle's own matmuls (gemm) and CPU ops already use, so
//! there is one set of compute threads (`RAYON_NUM_THREADS` sets its size); the data loader runs on its own std
//! threads and is not scheduled by this pool. The tiled forward runs all tiles of the batch in one parallel loop,
//! each tile's im2col, gemm (`Parallelism::None`) and epilogue on one thread: one fork-join per convolution (the
//! tiled weight gradient likewise, one partial sum per rayon split). A whole-image plan would fork three times per
//! convolution (for the im2col, inside the gemm and for the epilogue), and its column matrix would leave the cache
//! before the gemm read it. Elsewhere, when the batch has at least two groups, groups run in parallel
//! (`par_chunks_mut` over images), each doing its own im2col, gemm (`Parallelism::None`) and col2im, which also
//! parallelises the memory-bound im2col/col2im; the weight gradient folds one partial sum per rayon split and adds
//! them. With a single group (batch 1, or one thread) the groups run in order and each gemm uses
//! `Parallelism::Rayon(n)` over the same pool.

#[cfg(feature = "cudnn")]
pub mod cudnn;
mod kernels;
pub mod search;
mod workspace;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};

pub(crate) use kernels::Geom;

/// Bytes held now by the conv im2col workspaces of all threads.
pub fn workspace_bytes() -> usize {
    workspace::current_bytes()
}

/// The most bytes the conv im2col workspaces of all threads have held at once since the process started.
pub fn peak_workspace_bytes() -> usize {
    workspace::peak_bytes()
}

/// 2-D convolution of `x` (`n×c×h×w`) with `w` (`o×c×k×k`), zero padding `pad` on every side, the same `stride`
/// both ways; groups 1, dilation 1. Equal to `x.conv2d(w, pad, stride, 1, 1)` and differentiable in both inputs.
pub fn conv2d(x: &Tensor, w: &Tensor, stride: usize, pad: usize) -> Result<Tensor> {
    let geom = geometry(x, w, stride, pad)?;
    if !(x.dtype() == w.dtype() && runs_custom(x)) {
        return x.conv2d(w, pad, stride, 1, 1);
    }
    x.contiguous()?.apply_op2(&w.contiguous()?, Conv2dOp { geom })
}

/// [`conv2d`] plus a per-channel bias `b` (`o`): equal to `conv2d(x, w, stride, pad) + b` broadcast over the
/// batch and the pixels, and differentiable in all three inputs. On contiguous CPU f32/f64 tensors the bias is
/// added inside the same op, on the gemm's result while it is in cache; elsewhere the result is composed from
/// [`conv2d`] and `broadcast_add`.
pub fn conv2d_bias(x: &Tensor, w: &Tensor, b: &Tensor, stride: usize, pad: usize) -> Result<Tensor> {
    bias_conv(x, w, b, stride, pad, false)
}

/// `SiLU(conv2d_bias(x, w, b, stride, pad))` for inference: a folded Conv block (BatchNorm inside `w` and `b`) in
/// one op. On contiguous CPU f32/f64 tensors the bias is added and the SiLU applied to each tile's (or stacked
/// group's) output while it is still in cache, so the activation is written once instead of being written, read
/// back and written again by a separate SiLU pass. It has no backward: [`Tensor::backward`] through it is an error
/// (train with [`conv2d_bias`] or [`conv2d`] and a separate activation). Elsewhere it is composed from
/// [`conv2d_bias`] and `silu`.
pub fn conv2d_bias_silu(x: &Tensor, w: &Tensor, b: &Tensor, stride: usize, pad: usize) -> Result<Tensor> {
    bias_conv(x, w, b, stride, pad, true)
}

/// [`conv2d_bias`], or [`conv2d_bias_silu`] with `silu`: the custom op on the CPU, composed elsewhere.
fn bias_conv(x: &Tensor, w: &Tensor, b: &Tensor, stride: usize, pad: usize, silu: bool) -> Result<Tensor> {
    let geom = geometry(x, w, stride, pad)?;
    if b.dims() != [geom.o] {
        bail!("conv2d: bias has shape {:?}, expected ({},)", b.dims(), geom.o);
    }
    let same = x.dtype() == w.dtype() && x.dtype() == b.dtype();
    if !(same && crate::ledger::host_paths(x.device()) && matches!(x.dtype(), DType::F32 | DType::F64)) {
        let y = conv2d(x, w, stride, pad)?.broadcast_add(&b.reshape((1, geom.o, 1, 1))?)?;
        return if silu { y.silu() } else { Ok(y) };
    }
    x.contiguous()?.apply_op3(&w.contiguous()?, &b.contiguous()?, Conv2dBiasOp { geom, silu })
}

/// Whether the custom ops run for tensors like `x`: every float dtype on the CPU (f16 and bf16 through the f32
/// kernels), or cuDNN's dtypes on CUDA (`cudnn`).
fn runs_custom(x: &Tensor) -> bool {
    let cpu = x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64 | DType::F16 | DType::BF16);
    #[cfg(feature = "cudnn")]
    let cpu = cpu || (x.device().is_cuda() && cudnn::supports(x.dtype()));
    cpu
}

/// The checked geometry of `conv2d(x, w, stride, pad)`, or an error naming what does not fit.
fn geometry(x: &Tensor, w: &Tensor, stride: usize, pad: usize) -> Result<Geom> {
    let Ok((xn, xc, xh, xw)) = x.dims4() else { bail!("conv2d: input must be n×c×h×w, got {:?}", x.shape()) };
    let Ok((o, wc, kh, kw)) = w.dims4() else { bail!("conv2d: weight must be o×c×k×k, got {:?}", w.shape()) };
    if xc != wc {
        bail!("conv2d: input has {xc} channels but the weight expects {wc}");
    }
    if kh != kw {
        bail!("conv2d: only square kernels are supported, got {kh}×{kw}");
    }
    match Geom::new((xn, xc, xh, xw), (o, wc, kh, kw), stride, pad) {
        Some(g) => Ok(g),
        None => {
            bail!("conv2d: kernel {kh}×{kw} with stride {stride} and padding {pad} does not fit input {:?}", x.shape())
        }
    }
}

/// The forward op; its backward applies [`BackwardInput`] and [`BackwardWeight`].
#[derive(Debug, Clone, Copy)]
struct Conv2dOp {
    geom: Geom,
}

/// The forward op with a bias; its backward applies [`BackwardInput`], [`BackwardWeight`] and [`BiasGrad`]. With
/// `silu` ([`conv2d_bias_silu`]) the output is `SiLU` of the sum, applied in place right after each gemm, and there
/// is no backward.
#[derive(Debug, Clone, Copy)]
struct Conv2dBiasOp {
    geom: Geom,
    silu: bool,
}

/// `db` from `dy`; no backward of its own.
#[derive(Debug, Clone, Copy)]
struct BiasGrad {
    geom: Geom,
}

/// `dx` from `(dy, w)`; no backward of its own.
#[derive(Debug, Clone, Copy)]
struct BackwardInput {
    geom: Geom,
}

/// `dw` from `(x, dy)`; no backward of its own.
#[derive(Debug, Clone, Copy)]
struct BackwardWeight {
    geom: Geom,
}

/// The contiguous elements of a storage, or an error naming the op.
fn slice<'a, T>(data: &'a [T], l: &Layout, op: &str) -> Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("{op}: input is not contiguous"),
    }
}

/// Runs the `f32` or `f64` kernel on two storages of the same dtype. Two f16 or bf16 storages take the f32 kernel
/// between conversions: the CPU twin of cuDNN's half-precision convolution, which also accumulates in f32.
fn run2(
    op: &str,
    (s1, l1): (&CpuStorage, &Layout),
    (s2, l2): (&CpuStorage, &Layout),
    f32k: impl FnOnce(&[f32], &[f32]) -> Vec<f32>,
    f64k: impl FnOnce(&[f64], &[f64]) -> Vec<f64>,
) -> Result<CpuStorage> {
    let widen = |v: &[half::f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let widen_bf = |v: &[half::bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    match (s1, s2) {
        (CpuStorage::F32(a), CpuStorage::F32(b)) => Ok(CpuStorage::F32(f32k(slice(a, l1, op)?, slice(b, l2, op)?))),
        (CpuStorage::F64(a), CpuStorage::F64(b)) => Ok(CpuStorage::F64(f64k(slice(a, l1, op)?, slice(b, l2, op)?))),
        (CpuStorage::F16(a), CpuStorage::F16(b)) => {
            let y = f32k(&widen(slice(a, l1, op)?), &widen(slice(b, l2, op)?));
            Ok(CpuStorage::F16(y.into_iter().map(half::f16::from_f32).collect()))
        }
        (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
            let y = f32k(&widen_bf(slice(a, l1, op)?), &widen_bf(slice(b, l2, op)?));
            Ok(CpuStorage::BF16(y.into_iter().map(half::bf16::from_f32).collect()))
        }
        _ => bail!("{op}: expected two tensors of one float dtype, got {:?} and {:?}", s1.dtype(), s2.dtype()),
    }
}

/// Checks that a storage has the element count the geometry expects.
fn check_len(l: &Layout, want: usize, what: &str) -> Result<()> {
    if l.shape().elem_count() != want {
        bail!("conv2d: {what} has {} elements, expected {want}", l.shape().elem_count());
    }
    Ok(())
}

impl Geom {
    fn x_shape(&self) -> Shape {
        Shape::from((self.n, self.c, self.h, self.w))
    }
    fn w_shape(&self) -> Shape {
        Shape::from((self.o, self.c, self.k, self.k))
    }
    fn y_shape(&self) -> Shape {
        Shape::from((self.n, self.o, self.ho, self.wo))
    }
}

impl CustomOp2 for Conv2dOp {
    fn name(&self) -> &'static str {
        "sluice-conv2d"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        check_len(l1, g.x_shape().elem_count(), "input")?;
        check_len(l2, g.w_shape().elem_count(), "weight")?;
        let out = run2(
            self.name(),
            (s1, l1),
            (s2, l2),
            |x, w| kernels::forward(x, w, None, g, None),
            |x, w| kernels::forward(x, w, None, g, None),
        )?;
        Ok((out, g.y_shape()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cudnn::run(cudnn::Pass::Forward, (s1, l1), (s2, l2), &self.geom)?, self.geom.y_shape()))
    }

    fn bwd(&self, x: &Tensor, w: &Tensor, _y: &Tensor, dy: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = dy.contiguous()?;
        // Only the gradients autograd will use: the network's input (the image batch) is neither a variable nor
        // the result of a tracked op, so the first conv's input gradient (a full col2im pass) is skipped.
        let dx = x.track_op().then(|| dy.apply_op2_no_bwd(w, &BackwardInput { geom: self.geom })).transpose()?;
        let dw = w.track_op().then(|| x.apply_op2_no_bwd(&dy, &BackwardWeight { geom: self.geom })).transpose()?;
        Ok((dx, dw))
    }
}

impl CustomOp3 for Conv2dBiasOp {
    fn name(&self) -> &'static str {
        if self.silu { "sluice-conv2d-bias-silu" } else { "sluice-conv2d-bias" }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let op = self.name();
        check_len(l1, g.x_shape().elem_count(), "input")?;
        check_len(l2, g.w_shape().elem_count(), "weight")?;
        check_len(l3, g.o, "bias")?;
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(x), CpuStorage::F32(w), CpuStorage::F32(b)) => {
                let silu: kernels::Epilogue<'_, f32> = &crate::norm::silu_in_place::<f32>;
                let (x, w, b) = (slice(x, l1, op)?, slice(w, l2, op)?, slice(b, l3, op)?);
                CpuStorage::F32(kernels::forward(x, w, Some(b), g, self.silu.then_some(silu)))
            }
            (CpuStorage::F64(x), CpuStorage::F64(w), CpuStorage::F64(b)) => {
                let silu: kernels::Epilogue<'_, f64> = &crate::norm::silu_in_place::<f64>;
                let (x, w, b) = (slice(x, l1, op)?, slice(w, l2, op)?, slice(b, l3, op)?);
                CpuStorage::F64(kernels::forward(x, w, Some(b), g, self.silu.then_some(silu)))
            }
            _ => bail!("{op}: expected three f32 or three f64 tensors, got {:?}", s1.dtype()),
        };
        Ok((out, g.y_shape()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _y: &Tensor,
        dy: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if self.silu {
            bail!("conv2d_bias_silu is for inference and has no backward (train with conv2d_bias and silu)");
        }
        let dy = dy.contiguous()?;
        let geom = self.geom;
        let dx = x.track_op().then(|| dy.apply_op2_no_bwd(w, &BackwardInput { geom })).transpose()?;
        let dw = w.track_op().then(|| x.apply_op2_no_bwd(&dy, &BackwardWeight { geom })).transpose()?;
        let db = b.track_op().then(|| dy.apply_op1_no_bwd(&BiasGrad { geom })).transpose()?;
        Ok((dx, dw, db))
    }
}

impl CustomOp1 for BiasGrad {
    fn name(&self) -> &'static str {
        "sluice-conv2d-bias-grad"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        let op = self.name();
        check_len(l, g.y_shape().elem_count(), "output gradient")?;
        let (n, o, howo) = (g.n, g.o, g.ho * g.wo);
        let out = match s {
            CpuStorage::F32(d) => CpuStorage::F32(kernels::bias_grad(slice(d, l, op)?, n, o, howo)),
            CpuStorage::F64(d) => CpuStorage::F64(kernels::bias_grad(slice(d, l, op)?, n, o, howo)),
            _ => bail!("{op}: expected f32 or f64, got {:?}", s.dtype()),
        };
        Ok((out, Shape::from(o)))
    }
}

impl CustomOp2 for BackwardInput {
    fn name(&self) -> &'static str {
        "sluice-conv2d-backward-input"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        check_len(l1, g.y_shape().elem_count(), "output gradient")?;
        check_len(l2, g.w_shape().elem_count(), "weight")?;
        let out = run2(
            self.name(),
            (s1, l1),
            (s2, l2),
            |dy, w| kernels::backward_input(dy, w, g),
            |dy, w| kernels::backward_input(dy, w, g),
        )?;
        Ok((out, g.x_shape()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cudnn::run(cudnn::Pass::BackwardData, (s1, l1), (s2, l2), &self.geom)?, self.geom.x_shape()))
    }
}

impl CustomOp2 for BackwardWeight {
    fn name(&self) -> &'static str {
        "sluice-conv2d-backward-weight"
    }

    fn cpu_fwd(&self, s1: &CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> Result<(CpuStorage, Shape)> {
        let g = &self.geom;
        check_len(l1, g.x_shape().elem_count(), "input")?;
        check_len(l2, g.y_shape().elem_count(), "output gradient")?;
        let out = run2(
            self.name(),
            (s1, l1),
            (s2, l2),
            |x, dy| kernels::backward_weight(x, dy, g),
            |x, dy| kernels::backward_weight(x, dy, g),
        )?;
        Ok((out, g.w_shape()))
    }

    #[cfg(feature = "cudnn")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((cudnn::run(cudnn::Pass::BackwardFilter, (s1, l1), (s2, l2), &self.geom)?, self.geom.w_shape()))
    }
}
