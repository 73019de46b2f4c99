//! Max-pool (stride 1, same padding) and nearest ×2 upsample with correct, accumulating gradients.
//!
//! candle 0.11's own ops cannot serve YOLOv8's SPPF and neck: `max_pool2d` has no padding and its backward fails
//! for kernel ≠ stride, and `upsample_nearest2d`'s backward overwrites instead of accumulating. The composed
//! workarounds ([`max_pool2d_same_composed`]: the maximum of `k` shifted views along W then H;
//! [`upsample_nearest2x_composed`]: reshape + broadcast) are right but sweep the data many times. Here:
//!
//! * [`max_pool2d_same`]: `MaxPool2d(k, stride=1, padding=k/2)` with −∞ padding, separable (row maxima, then
//!   column maxima of those). Its backward recomputes each window's argmax, the first maximum in raster order
//!   (PyTorch's rule, NaN wins), and adds the output gradient there, so overlapping windows accumulate.
//! * [`upsample_nearest2x`]: each input value copied to a 2×2 block; the backward sums each block.
//!
//! Custom ops on contiguous f32/f64 CPU storage, parallel over `(n, c)` planes with rayon. Elsewhere (a CUDA
//! device) the pool is [`max_pool2d_same_gather`] when its gradient is needed (candle ops, the fused op's tie rule,
//! a one-op backward; its window search one kernel on the opt-in device path `fused_pool`) and candle's native pool
//! otherwise; the upsample is the composed version. The composed pool
//! splits the gradient evenly between tied maxima (candle's `maximum` rule), so it matches the fused pool only where
//! each window's maximum is unique.

use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::norm::{Elem, contiguous, fused_supported, nchw, with_cpu_slice};

#[cfg(feature = "cuda")]
mod cuda;

/// The CUDA C source of the opt-in window search ([`set_fused_pool`]).
pub const CUDA_SOURCE: &str = include_str!("pool/kernels.cu");

/// Whether [`max_pool2d_same_gather`] finds its windows' maxima with one kernel (the opt-in device path
/// `fused_pool`) instead of composed candle ops; process-wide, as the convolutions' algorithm search is.
static FUSED_POOL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the one-kernel window search of [`max_pool2d_same_gather`] on or off for the process (the trainer's
/// `fused_pool` device path; the step-cost ledger's `--device-paths fused_pool`).
pub fn set_fused_pool(on: bool) {
    FUSED_POOL.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the one-kernel window search is on.
pub fn fused_pool() -> bool {
    FUSED_POOL.load(std::sync::atomic::Ordering::Relaxed)
}

const POOL_OP: &str = "max_pool2d_same";
const UP_OP: &str = "upsample_nearest2x";
/// Planes smaller than this many elements are grouped into one rayon task.
const MIN_TASK_ELEMS: usize = 16 * 1024;

fn min_planes(plane: usize) -> usize {
    MIN_TASK_ELEMS.div_ceil(plane.max(1)).max(1)
}

/// Whether `v` beats the current maximum `best` (strictly greater, or NaN over a number, as in PyTorch).
#[inline(always)]
fn beats<T: Elem>(v: T, best: T) -> bool {
    v > best || (v.nan() && !best.nan())
}

/// Row maxima of one `h × w` plane over the window `[j − p, j + p] ∩ [0, w)`, with the first argmax column.
fn row_max<T: Elem>(x: &[T], w: usize, p: usize, vals: &mut [T], cols: &mut [u32]) {
    for (row, (vrow, crow)) in x.chunks_exact(w).zip(vals.chunks_exact_mut(w).zip(cols.chunks_exact_mut(w))) {
        for j in 0..w {
            let lo = j.saturating_sub(p);
            let hi = (j + p).min(w - 1);
            let (mut best, mut arg) = (row[lo], lo);
            for (jj, &v) in row.iter().enumerate().take(hi + 1).skip(lo + 1) {
                if beats(v, best) {
                    best = v;
                    arg = jj;
                }
            }
            vrow[j] = best;
            crow[j] = arg as u32;
        }
    }
}

/// For output `(i, j)`: the first row in `[i − p, i + p] ∩ [0, h)` whose row maximum wins, and that maximum.
#[inline(always)]
fn col_arg<T: Elem>(vals: &[T], h: usize, w: usize, p: usize, i: usize, j: usize) -> (usize, T) {
    let lo = i.saturating_sub(p);
    let hi = (i + p).min(h - 1);
    let (mut best, mut arg) = (vals[lo * w + j], lo);
    for ii in lo + 1..=hi {
        let v = vals[ii * w + j];
        if beats(v, best) {
            best = v;
            arg = ii;
        }
    }
    (arg, best)
}

/// `MaxPool2d(k, stride = 1, padding = k / 2)` as a custom op.
#[derive(Debug)]
struct MaxPoolSame {
    k: usize,
}

impl MaxPoolSame {
    fn fwd<T: Elem>(&self, x: &[T], h: usize, w: usize) -> Vec<T> {
        let p = self.k / 2;
        let plane = h * w;
        let mut y = vec![T::zero(); x.len()];
        y.par_chunks_mut(plane).with_min_len(min_planes(plane)).zip(x.par_chunks(plane)).for_each_init(
            || (vec![T::zero(); plane], vec![0u32; plane]),
            |(vals, cols), (yp, xp)| {
                row_max(xp, w, p, vals, cols);
                for i in 0..h {
                    for j in 0..w {
                        yp[i * w + j] = col_arg(vals, h, w, p, i, j).1;
                    }
                }
            },
        );
        y
    }

    fn bwd_typed<T: Elem>(&self, x: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let p = self.k / 2;
        let plane = h * w;
        let grad = grad.contiguous()?;
        let mut dx = vec![T::zero(); x.elem_count()];
        with_cpu_slice::<T, _>(x, POOL_OP, "input", |xv| {
            with_cpu_slice::<T, _>(&grad, POOL_OP, "gradient", |gv| {
                dx.par_chunks_mut(plane)
                    .with_min_len(min_planes(plane))
                    .zip(xv.par_chunks(plane).zip(gv.par_chunks(plane)))
                    .for_each_init(
                        || (vec![T::zero(); plane], vec![0u32; plane]),
                        |(vals, cols), (dp, (xp, gp))| {
                            row_max(xp, w, p, vals, cols);
                            for i in 0..h {
                                for j in 0..w {
                                    let (r, _) = col_arg(vals, h, w, p, i, j);
                                    let c = cols[r * w + j] as usize;
                                    dp[r * w + c] += gp[i * w + j];
                                }
                            }
                        },
                    )
            })
        })??;
        Tensor::from_vec(dx, x.shape(), &Device::Cpu)
    }
}

impl CustomOp1 for MaxPoolSame {
    fn name(&self) -> &'static str {
        POOL_OP
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (_, _, h, w) = nchw(l.shape(), POOL_OP)?;
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(self.fwd::<f32>(contiguous(s, l, POOL_OP, "input")?, h, w)),
            CpuStorage::F64(_) => CpuStorage::F64(self.fwd::<f64>(contiguous(s, l, POOL_OP, "input")?, h, w)),
            _ => candle_core::bail!("{POOL_OP}: only f32 and f64 are supported"),
        };
        Ok((out, l.shape().clone()))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(match x.dtype() {
            DType::F32 => self.bwd_typed::<f32>(x, grad)?,
            DType::F64 => self.bwd_typed::<f64>(x, grad)?,
            d => candle_core::bail!("{POOL_OP}: unsupported dtype {d:?}"),
        }))
    }
}

/// `MaxPool2d(kernel_size = k, stride = 1, padding = k / 2)` as in PyTorch: −∞ padding (it never wins), output
/// the input's shape, `k` odd. Gradient: each output's gradient goes to its window's first maximum (raster order)
/// and accumulates. Fused on f32/f64 CPU storage; [`max_pool2d_same_composed`] elsewhere.
pub fn max_pool2d_same(x: &Tensor, k: usize) -> Result<Tensor> {
    if k.is_multiple_of(2) {
        candle_core::bail!("{POOL_OP}: kernel {k} must be odd");
    }
    let (_, _, h, w) = nchw(x.shape(), POOL_OP)?;
    if h == 0 || w == 0 || (!fused_supported(x) && !x.track_op()) {
        return max_pool2d_same_composed(x, k);
    }
    if !fused_supported(x) {
        return max_pool2d_same_gather(x, k);
    }
    x.contiguous()?.apply_op1(MaxPoolSame { k })
}

/// [`max_pool2d_same`] from candle's ops with a one-op backward, for devices without the fused op: each window's
/// first maximum in raster order (the fused op's rule, PyTorch's) is found without tracking, separably (the first
/// maximal column of each row window, then the first row holding the window's maximum), and the output is gathered
/// from the input at those positions. The backward is then `gather`'s, one scatter-add of the output gradient,
/// where the chain of `maximum`s in [`max_pool2d_same_composed`] runs about ten passes per `maximum` and a
/// zero-padded copy per shifted view. `k` odd, `x` NCHW with non-empty planes.
pub fn max_pool2d_same_gather(x: &Tensor, k: usize) -> Result<Tensor> {
    gather_with(x, k, fused_pool())
}

/// [`max_pool2d_same_gather`] with the window search in one op (`fused`) or composed.
fn gather_with(x: &Tensor, k: usize, fused: bool) -> Result<Tensor> {
    if k.is_multiple_of(2) {
        candle_core::bail!("{POOL_OP}: kernel {k} must be odd");
    }
    let (b, c, h, w) = x.dims4()?;
    if h == 0 || w == 0 {
        return max_pool2d_same_composed(x, k);
    }
    if k == 1 {
        return Ok(x.clone());
    }
    if fused && matches!(x.dtype(), DType::F32 | DType::F16 | DType::BF16) {
        let flat = x.detach().contiguous()?.apply_op1_no_bwd(&PoolArgmax { k })?;
        return x.reshape((b, c, h * w))?.gather(&flat, 2)?.reshape((b, c, h, w));
    }
    let p = k / 2;
    let padded = pad_neg_inf(&x.detach(), p)?; // (b, c, h + 2p, w + 2p)
    // Offsets and coordinates as f32 whatever `x`'s dtype: exact integers up to 2^24.
    let ramp = Tensor::arange(0f32, h.max(w).max(k) as f32, x.device())?;
    let at = |i: usize| ramp.narrow(0, i, 1)?.reshape(());
    let cols = (0..k).map(|dx| padded.narrow(3, dx, w)).collect::<Result<Vec<_>>>()?;
    let row_max = maximum_of(&cols)?; // (b, c, h + 2p, w)
    let row_arg = first_equal(&cols, &row_max, &at)?;
    let rows = (0..k).map(|dy| row_max.narrow(2, dy, h)).collect::<Result<Vec<_>>>()?;
    let dy = first_equal(&rows, &maximum_of(&rows)?, &at)?; // (b, c, h, w)
    // The winning row in padded coordinates, then its first maximal column.
    let prow = dy.broadcast_add(&ramp.narrow(0, 0, h)?.reshape((1, 1, h, 1))?)?;
    let dx = row_arg.gather(&prow.to_dtype(DType::U32)?, 2)?;
    let last = |n: usize| (n - 1) as f64;
    let iy = prow.affine(1.0, -(p as f64))?.clamp(0.0, last(h))?;
    let ix = dx.broadcast_add(&ramp.narrow(0, 0, w)?.reshape((1, 1, 1, w))?)?.affine(1.0, -(p as f64))?;
    let flat = (iy.affine(w as f64, 0.0)? + ix.clamp(0.0, last(w))?)?.to_dtype(DType::U32)?;
    x.reshape((b, c, h * w))?.gather(&flat.reshape((b, c, h * w))?, 2)?.reshape((b, c, h, w))
}

/// The window search of [`max_pool2d_same_gather`] as one op: `(B, C, H, W)` → `(B, C, H·W)` u32, the in-plane
/// index of each window's first maximum in raster order with −∞ outside the plane (an all −∞ window keeps its
/// top-left position, clamped into the plane), the index the composed search finds. One kernel on a CUDA device,
/// its twin elsewhere.
struct PoolArgmax {
    k: usize,
}

/// The window search over one `h × w` plane into `idx`.
fn plane_argmax(x: &[f32], h: usize, w: usize, k: usize, idx: &mut [u32]) {
    let p = k as isize / 2;
    let (hi, wi) = (h as isize, w as isize);
    let at = |y: isize, xx: isize| {
        if y >= 0 && y < hi && xx >= 0 && xx < wi { x[(y * wi + xx) as usize] } else { f32::NEG_INFINITY }
    };
    for (i, out) in idx.iter_mut().enumerate() {
        let (oy, ox) = ((i / w) as isize, (i % w) as isize);
        let (mut by, mut bx) = (oy - p, ox - p);
        let mut best = at(by, bx);
        for y in oy - p..=oy + p {
            for xx in ox - p..=ox + p {
                let v = at(y, xx);
                if v > best {
                    (best, by, bx) = (v, y, xx);
                }
            }
        }
        *out = (by.clamp(0, hi - 1) * wi + bx.clamp(0, wi - 1)) as u32;
    }
}

impl CustomOp1 for PoolArgmax {
    fn name(&self) -> &'static str {
        "max_pool2d_same_argmax"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, c, h, w) = nchw(l.shape(), POOL_OP)?;
        // f32 values hold every f16 / bf16 value exactly, so the comparisons are the half values' own.
        let x: Vec<f32> = match s {
            CpuStorage::F32(_) => contiguous::<f32>(s, l, POOL_OP, "input")?.to_vec(),
            CpuStorage::F16(_) => contiguous::<half::f16>(s, l, POOL_OP, "input")?.iter().map(|v| v.to_f32()).collect(),
            CpuStorage::BF16(_) => {
                contiguous::<half::bf16>(s, l, POOL_OP, "input")?.iter().map(|v| v.to_f32()).collect()
            }
            _ => candle_core::bail!("{POOL_OP}: the window search takes f32, f16 or bf16"),
        };
        let hw = h * w;
        let mut idx = vec![0u32; b * c * hw];
        idx.par_chunks_mut(hw.max(1))
            .zip(x.par_chunks(hw.max(1)))
            .for_each(|(out, plane)| plane_argmax(plane, h, w, self.k, out));
        Ok((CpuStorage::U32(idx), Shape::from((b, c, hw))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &candle_core::CudaStorage, l: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        let (b, c, h, w) = nchw(l.shape(), POOL_OP)?;
        Ok((cuda::argmax(s, l, (b * c, h, w), self.k)?, Shape::from((b, c, h * w))))
    }
}

/// The element-wise maximum of `ts` (at least one).
fn maximum_of(ts: &[Tensor]) -> Result<Tensor> {
    let mut m = ts[0].clone();
    for t in &ts[1..] {
        m = m.maximum(t)?;
    }
    Ok(m)
}

/// Per element, the index (as f32, from `at`) of the first of `ts` equal to `max`; the last index where none is
/// (a NaN).
fn first_equal(ts: &[Tensor], max: &Tensor, at: &dyn Fn(usize) -> Result<Tensor>) -> Result<Tensor> {
    let shape = max.shape();
    let mut arg = at(ts.len() - 1)?.broadcast_as(shape)?;
    for i in (0..ts.len() - 1).rev() {
        arg = ts[i].eq(max)?.where_cond(&at(i)?.broadcast_as(shape)?, &arg)?;
    }
    Ok(arg)
}

/// Pads dims 2 and 3 of an NCHW tensor by `p` on every side with −∞.
fn pad_neg_inf(x: &Tensor, p: usize) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    let side = Tensor::full(f32::NEG_INFINITY, (b, c, h, p), x.device())?.to_dtype(x.dtype())?;
    let x = Tensor::cat(&[&side, x, &side], 3)?;
    let top = Tensor::full(f32::NEG_INFINITY, (b, c, p, w + 2 * p), x.device())?.to_dtype(x.dtype())?;
    Tensor::cat(&[&top, &x, &top], 2)
}

/// The composed candle version of [`max_pool2d_same`]: without gradient tracking candle's native pool on the
/// −∞-padded input; with tracking the maximum over the `k` shifted views along W, then along H (ties split the
/// gradient evenly, candle's rule for `maximum`).
pub fn max_pool2d_same_composed(x: &Tensor, k: usize) -> Result<Tensor> {
    if k.is_multiple_of(2) {
        candle_core::bail!("{POOL_OP}: kernel {k} must be odd");
    }
    let p = k / 2;
    let (_, _, h, w) = x.dims4()?;
    let padded = pad_neg_inf(x, p)?;
    if !x.track_op() {
        return padded.max_pool2d_with_stride(k, 1);
    }
    let mut rows = padded.narrow(3, 0, w)?;
    for dx in 1..k {
        rows = rows.maximum(&padded.narrow(3, dx, w)?)?;
    }
    let mut out = rows.narrow(2, 0, h)?;
    for dy in 1..k {
        out = out.maximum(&rows.narrow(2, dy, h)?)?;
    }
    Ok(out)
}

/// Nearest ×2 upsample as a custom op.
#[derive(Debug)]
struct Upsample2x;

impl Upsample2x {
    fn fwd<T: Elem>(x: &[T], h: usize, w: usize) -> Vec<T> {
        let (plane, w2) = (h * w, 2 * w);
        let mut y = vec![T::zero(); 4 * x.len()];
        y.par_chunks_mut(4 * plane).with_min_len(min_planes(4 * plane)).zip(x.par_chunks(plane)).for_each(
            |(yp, xp)| {
                for (rows, xr) in yp.chunks_exact_mut(2 * w2).zip(xp.chunks_exact(w)) {
                    let (top, bottom) = rows.split_at_mut(w2);
                    for (pair, &v) in top.chunks_exact_mut(2).zip(xr) {
                        pair[0] = v;
                        pair[1] = v;
                    }
                    bottom.copy_from_slice(top);
                }
            },
        );
        y
    }

    fn bwd_typed<T: Elem>(x: &Tensor, grad: &Tensor) -> Result<Tensor> {
        let (_, _, h, w) = x.dims4()?;
        let (plane, w2) = (h * w, 2 * w);
        let grad = grad.contiguous()?;
        let mut dx = vec![T::zero(); x.elem_count()];
        with_cpu_slice::<T, _>(&grad, UP_OP, "gradient", |gv| {
            dx.par_chunks_mut(plane).with_min_len(min_planes(4 * plane)).zip(gv.par_chunks(4 * plane)).for_each(
                |(dp, gp)| {
                    for (dr, rows) in dp.chunks_exact_mut(w).zip(gp.chunks_exact(2 * w2)) {
                        let (top, bottom) = rows.split_at(w2);
                        for (j, d) in dr.iter_mut().enumerate() {
                            *d = (top[2 * j] + top[2 * j + 1]) + (bottom[2 * j] + bottom[2 * j + 1]);
                        }
                    }
                },
            )
        })?;
        Tensor::from_vec(dx, x.shape(), &Device::Cpu)
    }
}

impl CustomOp1 for Upsample2x {
    fn name(&self) -> &'static str {
        UP_OP
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (n, c, h, w) = nchw(l.shape(), UP_OP)?;
        let out = match s {
            CpuStorage::F32(_) => CpuStorage::F32(Self::fwd::<f32>(contiguous(s, l, UP_OP, "input")?, h, w)),
            CpuStorage::F64(_) => CpuStorage::F64(Self::fwd::<f64>(contiguous(s, l, UP_OP, "input")?, h, w)),
            _ => candle_core::bail!("{UP_OP}: only f32 and f64 are supported"),
        };
        Ok((out, Shape::from((n, c, 2 * h, 2 * w))))
    }

    fn bwd(&self, x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(match x.dtype() {
            DType::F32 => Self::bwd_typed::<f32>(x, grad)?,
            DType::F64 => Self::bwd_typed::<f64>(x, grad)?,
            d => candle_core::bail!("{UP_OP}: unsupported dtype {d:?}"),
        }))
    }
}

/// Nearest-neighbour upsampling by 2 in H and W (`nn.Upsample(scale_factor=2, mode="nearest")`); the gradient
/// sums each 2×2 block and accumulates with the input's other consumers. Fused on f32/f64 CPU storage;
/// [`upsample_nearest2x_composed`] elsewhere.
pub fn upsample_nearest2x(x: &Tensor) -> Result<Tensor> {
    let (_, _, h, w) = nchw(x.shape(), UP_OP)?;
    if !fused_supported(x) || h == 0 || w == 0 {
        return upsample_nearest2x_composed(x);
    }
    x.contiguous()?.apply_op1(Upsample2x)
}

/// The composed candle version of [`upsample_nearest2x`]: candle's native upsample without gradient tracking,
/// a reshape + broadcast (whose gradient accumulates) with it.
pub fn upsample_nearest2x_composed(x: &Tensor) -> Result<Tensor> {
    let (b, c, h, w) = x.dims4()?;
    if !x.track_op() {
        return x.upsample_nearest2d(2 * h, 2 * w);
    }
    x.reshape((b, c, h, 1, w, 1))?.broadcast_as((b, c, h, 2, w, 2))?.reshape((b, c, 2 * h, 2 * w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_rejects_even_kernels_and_non_nchw() {
        let x = Tensor::zeros((1, 1, 4, 4), DType::F32, &Device::Cpu).unwrap();
        assert!(max_pool2d_same(&x, 4).is_err());
        assert!(max_pool2d_same(&x.flatten_all().unwrap(), 5).is_err());
        assert!(upsample_nearest2x(&x.flatten_all().unwrap()).is_err());
    }

    /// The one-op window search (the opt-in `fused_pool`) against the composed one, through the same gather: on
    /// small integers (ties everywhere, so another pick moves a gradient), planes of −∞ and a −∞ border, odd sizes,
    /// k from 1 to 7, in f32 and the autocast dtypes: the same values and gradients.
    #[test]
    fn the_one_op_window_search_picks_the_composed_ones_positions() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 33) % n
        };
        for (b, c, h, w) in [(1, 1, 1, 1), (2, 3, 7, 5), (1, 2, 20, 20), (1, 1, 3, 9)] {
            let n = b * c * h * w;
            let mut v: Vec<f32> = (0..n).map(|_| next(4) as f32 - 2.0).collect();
            if n > 40 {
                // One whole plane of −∞ and a −∞ column in another.
                v[..h * w].fill(f32::NEG_INFINITY);
                for y in 0..h {
                    v[h * w + y * w] = f32::NEG_INFINITY;
                }
            }
            let wts: Vec<f32> = (0..n).map(|_| next(5) as f32).collect();
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let x0 = Tensor::from_vec(v.clone(), (b, c, h, w), &Device::Cpu).and_then(|t| t.to_dtype(dtype));
                let wt = Tensor::from_vec(wts.clone(), (b, c, h, w), &Device::Cpu).and_then(|t| t.to_dtype(dtype));
                let (x0, wt) = (x0.expect("x"), wt.expect("weights"));
                for k in [1, 3, 5, 7] {
                    let run = |fused: bool| {
                        let x = candle_core::Var::from_tensor(&x0).expect("var");
                        let y = gather_with(x.as_tensor(), k, fused).expect("pool");
                        let g = y.mul(&wt).and_then(|t| t.sum_all()).and_then(|t| t.backward()).expect("backward");
                        let dx = g.get(&x).expect("gradient").to_dtype(DType::F64).expect("f64");
                        let y = y.to_dtype(DType::F64).expect("f64");
                        (
                            y.flatten_all().and_then(|t| t.to_vec1::<f64>()),
                            dx.flatten_all().and_then(|t| t.to_vec1::<f64>()),
                        )
                    };
                    let ((y1, g1), (y0, g0)) = (run(true), run(false));
                    assert_eq!(y1.expect("y"), y0.expect("y"), "{b}x{c}x{h}x{w} k{k} {dtype:?}: values");
                    assert_eq!(g1.expect("g"), g0.expect("g"), "{b}x{c}x{h}x{w} k{k} {dtype:?}: gradients");
                }
            }
        }
    }

    #[test]
    fn pool_window_of_one_row() {
        // A 1×5 plane, k = 3: windows are clipped at the borders.
        let x = Tensor::new(&[1f32, 3.0, 2.0, 5.0, 4.0], &Device::Cpu).unwrap().reshape((1, 1, 1, 5)).unwrap();
        let y: Vec<f32> = max_pool2d_same(&x, 3).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(y, [3.0, 3.0, 5.0, 5.0, 5.0]);
    }
}
