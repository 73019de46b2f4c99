//! The device-side shrink step of validation (feature `candle`): from the eval head output `(B, 4 + nc, A)`,
//! keep per image only the anchors whose best class score is `> conf`, at most `top_k` of them, so that the
//! buffer copied to the host for NMS is small. The same candle ops run on every backend; on the CPU this is the
//! code path that is tested.
//!
//! Exactness: an anchor whose best score is `<= conf` has no class score `> conf`, so it yields no NMS candidate
//! (single- or multi-label) and dropping it changes nothing. The kept anchors are gathered in ascending anchor
//! order, which is the order NMS breaks score ties in, so NMS on the shrunk buffer returns exactly the detections
//! it returns on the full one whenever no image has more than `k` anchors above `conf`. An image with more (the
//! shrunk buffer holds its `k` best anchors) is counted as truncated ([`ValBatch::above_conf`] carries the count).
//!
//! Besides the predictions, the step returns per image the number of anchors above `conf` and whether the whole
//! head output was finite (`sum(y - y) == 0`), so a NaN in a dropped anchor is still reported, and the original
//! index of every kept anchor (to name it in errors). All of it is computed on the device and travels with the
//! small buffer.
//!
//! On a GPU, rows longer than candle's CUDA argsort takes (8192 columns: 8400 anchors at 640, 33,600 at 1280) are
//! ranked by `sluice_kernels::topk::topk_last`, in chunks, when `k` is at most half that; a larger `k` keeps the whole output.
//!
//! `k` is either fixed (`min(top_k, A)`, no device→host read before the copy) or, with
//! [`ShrinkParams::fit`], the largest per-image count in the batch rounded up to a multiple of 32: a smaller
//! copy, exact up to `top_k`, for the price of reading `B` integers first (on a GPU, a short sync).

use candle_core::{DType, Device, Tensor, WithDType};

use crate::error::{Error, Result};
use crate::nms::Layout;
use crate::stream::ValBatch;
use sluice_kernels::topk::{MAX_DEVICE_SORT, topk_last};

/// Settings of [`shrink`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShrinkParams {
    /// Anchors need a best class score `> conf` (compared in the tensor's float32, like NMS).
    pub conf: f32,
    /// Most anchors kept per image.
    pub top_k: usize,
    /// Size the output to the batch's largest count above `conf` (rounded up to 32) instead of `top_k`.
    pub fit: bool,
}

impl Default for ShrinkParams {
    /// Ultralytics' validation `conf` (0.001), `top_k` = `max_nms` (30000, so exact for any head size up to
    /// that), sized to the counts.
    fn default() -> Self {
        Self { conf: 0.001, top_k: 30_000, fit: true }
    }
}

/// The shrunk head output of one batch, still on the device.
#[derive(Debug, Clone)]
pub struct Shrunk {
    /// `(B, 4 + nc, k)` float32: the kept anchors of each image in ascending anchor order. Images with fewer than
    /// `k` anchors above `conf` are padded with their best remaining anchors (which yield no NMS candidate).
    pub preds: Tensor,
    /// `(B, k)` u32: the index in the full output of each kept anchor.
    pub anchors: Tensor,
    /// `(B,)` u32: anchors whose best class score is `> conf`.
    pub above_conf: Tensor,
    /// `(B,)` float32: `sum(y - y)` over the image's full output, 0 exactly when every value is finite.
    pub finite_check: Tensor,
}

/// Shrinks `y` `(B, 4 + nc, A)` (any float dtype; computed in float32) on its device; see the module docs.
pub fn shrink(y: &Tensor, p: &ShrinkParams) -> Result<Shrunk> {
    let (b, rows, a) = y.dims3().map_err(Error::Candle)?;
    if rows < 5 || a == 0 || p.top_k == 0 {
        return Err(Error::Invalid {
            what: "shrink input",
            reason: format!(
                "shape ({b}, {rows}, {a}) with top_k {} (need 4 + nc >= 5 rows, anchors, top_k >= 1)",
                p.top_k
            ),
        });
    }
    shrink_ops(y, p, b, rows, a).map_err(Error::Candle)
}

/// The tensor ops of [`shrink`] on a checked `(b, rows, a)` input.
fn shrink_ops(y: &Tensor, p: &ShrinkParams, b: usize, rows: usize, a: usize) -> candle_core::Result<Shrunk> {
    let y = y.to_dtype(DType::F32)?.contiguous()?;
    let best = y.narrow(1, 4, rows - 4)?.max(1)?; // (B, A)
    let above_conf = best.gt(p.conf)?.to_dtype(DType::U32)?.sum(1)?; // (B,)
    // `x - x` is 0 for every finite x and NaN for NaN or +-inf; a sum of zeros cannot overflow.
    #[allow(clippy::eq_op)]
    let finite_check = (&y - &y)?.sum((1, 2))?;
    let cap = p.top_k.min(a);
    let k = if p.fit {
        // Sizing to the counts needs them on the host.
        sluice_core::syncs::record_if(!y.device().is_cpu(), sluice_core::syncs::Site::ShrinkFit);
        let most = above_conf.max(0)?.to_scalar::<u32>()? as usize;
        most.div_ceil(32).saturating_mul(32).clamp(1, cap)
    } else {
        cap
    };
    // candle's CUDA argsort sorts at most 8192 columns (8400 anchors at 640 are more): longer rows are ranked by the
    // chunked `topk_last`, which keeps at most half that; beyond it the whole output is kept, which is exact,
    // only a larger copy.
    let device_sort = !sluice_kernels::ledger::host_paths(y.device()) && a > MAX_DEVICE_SORT;
    let k = if device_sort && 2 * k > MAX_DEVICE_SORT { a } else { k };
    if k == a {
        let anchors = Tensor::arange(0u32, a as u32, y.device())?.unsqueeze(0)?.broadcast_as((b, a))?.contiguous()?;
        return Ok(Shrunk { preds: y, anchors, above_conf, finite_check });
    }
    // The k best anchors of each image (descending best score), then back into ascending anchor order.
    let best = best.contiguous()?;
    let top = if device_sort {
        topk_last(&best, k)?.1
    } else {
        best.arg_sort_last_dim(false)?.narrow(1, 0, k)?.contiguous()?
    };
    let (anchors, _) = top.sort_last_dim(true)?;
    let index = anchors.unsqueeze(1)?.broadcast_as((b, rows, k))?.contiguous()?;
    let preds = y.gather(&index, 2)?;
    Ok(Shrunk { preds, anchors, above_conf, finite_check })
}

/// Calls `f` with the contiguous values of `t` on the host. On the CPU this reads the tensor's storage in place
/// (the caller copies into its pooled buffer, no allocation); other devices copy to the host first.
pub(crate) fn with_host_slice<T: WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> Result<R> {
    sluice_core::syncs::record_if(!t.device().is_cpu(), sluice_core::syncs::Site::ShrinkCopy);
    let host =
        if t.device().is_cpu() { t.contiguous() } else { t.to_device(&Device::Cpu).and_then(|h| h.contiguous()) };
    let host = host.map_err(Error::Candle)?;
    let (storage, layout) = host.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        return Err(Error::Invalid { what: "tensor", reason: "not on the host after the copy".into() });
    };
    let (start, end) = layout
        .contiguous_offsets()
        .ok_or_else(|| Error::Invalid { what: "tensor", reason: "not contiguous".into() })?;
    Ok(f(&cpu.as_slice::<T>().map_err(Error::Candle)?[start..end]))
}

impl Shrunk {
    /// Copies the shrunk batch into `dst` (predictions, anchor indices, counts, finiteness), replacing what it
    /// held there except `ids` and `targets`. This is the only device-to-host copy of the validation loop.
    pub fn copy_into(&self, dst: &mut ValBatch) -> Result<()> {
        if !self.preds.device().is_cpu() {
            return self.copy_packed(dst);
        }
        let (b, rows, k) = self.preds.dims3().map_err(Error::Candle)?;
        dst.preds.data.clear();
        with_host_slice(&self.preds, |v: &[f32]| dst.preds.data.extend_from_slice(v))?;
        (dst.preds.batch, dst.preds.num_classes, dst.preds.num_anchors) = (b, rows - 4, k);
        dst.preds.layout = Layout::ChannelsFirst;
        dst.anchor_index.clear();
        with_host_slice(&self.anchors, |v: &[u32]| dst.anchor_index.extend_from_slice(v))?;
        dst.above_conf.clear();
        with_host_slice(&self.above_conf, |v: &[u32]| dst.above_conf.extend_from_slice(v))?;
        dst.all_finite.clear();
        with_host_slice(&self.finite_check, |v: &[f32]| dst.all_finite.extend(v.iter().map(|&x| x == 0.0)))?;
        Ok(())
    }
}

/// The shape of a [`Shrunk::pack`]ed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedDims {
    /// Images.
    pub batch: usize,
    /// `4 + nc`.
    pub rows: usize,
    /// Anchors kept per image.
    pub kept: usize,
}

impl PackedDims {
    /// Values in the packed vector.
    pub fn len(&self) -> usize {
        self.batch * self.rows * self.kept + self.batch * self.kept + 2 * self.batch
    }

    /// Whether the packed vector is empty (no images).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shrunk {
    /// The four tensors packed into one flat float32 tensor on their device (predictions, then anchor indices,
    /// counts and the finiteness sums; indices and counts are below 2^24, so exact in float32): one copy to the
    /// host instead of four, which can also be made asynchronously (`sluice_transfer::Readback`).
    pub fn pack(&self) -> Result<(Tensor, PackedDims)> {
        let (batch, rows, kept) = self.preds.dims3().map_err(Error::Candle)?;
        let flat = |t: &Tensor| t.to_dtype(DType::F32).and_then(|t| t.flatten_all());
        let packed = (|| {
            Tensor::cat(
                &[flat(&self.preds)?, flat(&self.anchors)?, flat(&self.above_conf)?, flat(&self.finite_check)?],
                0,
            )
        })()
        .map_err(Error::Candle)?;
        Ok((packed, PackedDims { batch, rows, kept }))
    }

    /// [`Shrunk::copy_into`] off the CPU: [`Shrunk::pack`], then one blocking read.
    pub(crate) fn copy_packed(&self, dst: &mut ValBatch) -> Result<()> {
        let (packed, dims) = self.pack()?;
        with_host_slice(&packed, |v: &[f32]| unpack(v, dims, dst))?
    }
}

/// Fills `dst` (except `ids` and `targets`) from a packed shrunk batch read back to the host.
pub fn unpack(v: &[f32], d: PackedDims, dst: &mut ValBatch) -> Result<()> {
    if v.len() != d.len() || d.rows < 5 {
        return Err(Error::Invalid {
            what: "packed shrunk batch",
            reason: format!("{} values for {d:?} (want {})", v.len(), d.len()),
        });
    }
    let (np, na, b) = (d.batch * d.rows * d.kept, d.batch * d.kept, d.batch);
    dst.preds.data.clear();
    dst.preds.data.extend_from_slice(&v[..np]);
    dst.anchor_index.clear();
    dst.anchor_index.extend(v[np..np + na].iter().map(|&x| x as u32));
    dst.above_conf.clear();
    dst.above_conf.extend(v[np + na..np + na + b].iter().map(|&x| x as u32));
    dst.all_finite.clear();
    dst.all_finite.extend(v[np + na + b..].iter().map(|&x| x == 0.0));
    (dst.preds.batch, dst.preds.num_classes, dst.preds.num_anchors) = (d.batch, d.rows - 4, d.kept);
    dst.preds.layout = Layout::ChannelsFirst;
    dst.kept_rows = false;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_packed_copy_equals_the_per_tensor_copy() {
        // Two images, 3 classes, 40 anchors with a NaN in image 1: the one-read path used off the CPU.
        let mut data: Vec<f32> = (0..2 * 7 * 40).map(|i| ((i * 37) % 101) as f32 / 100.0).collect();
        data[7 * 40 + 5] = f32::NAN;
        let y = Tensor::from_vec(data, (2, 7, 40), &Device::Cpu).unwrap();
        let s = shrink(&y, &ShrinkParams { conf: 0.5, top_k: 16, fit: true }).unwrap();
        let (mut a, mut b) = (ValBatch::default(), ValBatch::default());
        s.copy_into(&mut a).unwrap();
        s.copy_packed(&mut b).unwrap();
        assert_eq!(a.preds.data.len(), b.preds.data.len());
        assert!(a.preds.data.iter().zip(&b.preds.data).all(|(x, y)| x == y || (x.is_nan() && y.is_nan())));
        assert_eq!((a.preds.batch, a.preds.num_classes, a.preds.num_anchors), (2, 3, b.preds.num_anchors));
        assert_eq!(a.anchor_index, b.anchor_index);
        assert_eq!(a.above_conf, b.above_conf);
        assert_eq!(a.all_finite, b.all_finite);
        assert_eq!(a.all_finite, vec![true, false]);
    }

    #[test]
    fn keeps_anchors_above_conf_in_anchor_order() {
        // One image, 1 class, 6 anchors; scores 0.5, 0.0005, 0.9, 0.001, 0.3, 0.0 -> anchors 0, 2, 4 are above.
        let scores = [0.5f32, 0.0005, 0.9, 0.001, 0.3, 0.0];
        let mut data: Vec<f32> = (0..4).flat_map(|r| (0..6).map(move |a| (r * 10 + a) as f32)).collect();
        data.extend_from_slice(&scores);
        let y = Tensor::from_vec(data, (1, 5, 6), &Device::Cpu).unwrap();
        let s = shrink(&y, &ShrinkParams { conf: 0.001, top_k: 2, fit: false }).unwrap();
        // top_k 2 keeps the two best (2 and 0), in anchor order.
        assert_eq!(s.anchors.to_vec2::<u32>().unwrap(), vec![vec![0, 2]]);
        assert_eq!(s.preds.to_vec3::<f32>().unwrap()[0][4], vec![0.5, 0.9]);
        assert_eq!(s.preds.to_vec3::<f32>().unwrap()[0][1], vec![10.0, 12.0]);
        assert_eq!(s.above_conf.to_vec1::<u32>().unwrap(), vec![3]);
        let mut v = ValBatch::default();
        s.copy_into(&mut v).unwrap();
        assert_eq!((v.preds.batch, v.preds.num_classes, v.preds.num_anchors), (1, 1, 2));
        assert_eq!((v.anchor_index, v.above_conf, v.all_finite), (vec![0, 2], vec![3], vec![true]));
        // Fit: 3 above conf -> k rounded up to 32, capped at A = 6 -> the whole output.
        let s = shrink(&y, &ShrinkParams::default()).unwrap();
        assert_eq!(s.preds.dims3().unwrap(), (1, 5, 6));
        assert!(shrink(&y, &ShrinkParams { top_k: 0, ..ShrinkParams::default() }).is_err());
    }

    #[test]
    fn non_finite_values_are_flagged_even_in_dropped_anchors() {
        let mut data = vec![1.0f32; 2 * 5 * 4];
        // Image 1, anchor 3, box row 2: NaN; its scores are below conf, so the anchor is dropped.
        for a in 0..4 {
            data[5 * 4 + 4 * 4 + a] = if a == 0 { 0.9 } else { 0.0 };
            data[4 * 4 + a] = 0.9;
        }
        data[5 * 4 + 2 * 4 + 3] = f32::NAN;
        let y = Tensor::from_vec(data, (2, 5, 4), &Device::Cpu).unwrap();
        let s = shrink(&y, &ShrinkParams { conf: 0.001, top_k: 1, fit: false }).unwrap();
        let mut v = ValBatch::default();
        s.copy_into(&mut v).unwrap();
        assert_eq!(v.all_finite, vec![true, false]);
        assert!(v.preds.data.iter().all(|x| x.is_finite()));
    }
}
