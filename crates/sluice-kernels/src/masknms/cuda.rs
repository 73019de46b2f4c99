//! The CUDA launches of batched mask NMS: the kernels of `kernels.cu`, compiled by NVRTC once per device, chained on
//! the input's stream with no host read. The steps and their host twins are `sluice_eval::masknms`'s.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Result, Storage, Tensor};

use super::{CUDA_SOURCE, Kept, Params, WORD, words};
use crate::nvrtc::PerDevice;

struct Kernels {
    keys: CudaFunction,
    fill: CudaFunction,
    compact: CudaFunction,
    take_full: CudaFunction,
    bitonic: CudaFunction,
    count: CudaFunction,
    boxes: CudaFunction,
    overlap: CudaFunction,
    keep: CudaFunction,
    gather: CudaFunction,
}

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("batched NMS (CUDA) {what}: {e:?}"))
}

fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
    static KERNELS: PerDevice<Kernels> = PerDevice::new();
    KERNELS.get(dev, "CUDA NMS", CUDA_SOURCE, |f| {
        Ok(Kernels {
            keys: f.get("masknms_candidate_keys")?,
            fill: f.get("masknms_fill")?,
            compact: f.get("masknms_compact")?,
            take_full: f.get("masknms_take_full")?,
            bitonic: f.get("masknms_bitonic_step")?,
            count: f.get("masknms_count")?,
            boxes: f.get("masknms_boxes")?,
            overlap: f.get("masknms_overlap")?,
            keep: f.get("masknms_keep")?,
            gather: f.get("masknms_gather")?,
        })
    })
}

/// One thread per element, 256 per block.
fn flat(total: usize) -> Result<LaunchConfig> {
    let blocks = u32::try_from(total.div_ceil(256).max(1)).map_err(drv("grid too large"))?;
    Ok(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
}

fn i32_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(drv("a size overflows i32"))
}

fn i64_of(v: usize) -> Result<i64> {
    i64::try_from(v).map_err(drv("a size overflows i64"))
}

fn wrap<T: candle_core::cuda_backend::CudaDType>(s: CudaSlice<T>, dev: &CudaDevice, shape: &[usize]) -> Tensor {
    let storage = CudaStorage::wrap_cuda_slice(s, dev.clone());
    Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
}

/// The kernels' chain on the `B` images of `y` (f32, shaped as `p` says; the caller checks the shape, `max_det >= 1`
/// and that `na · nc` fits 32 bits).
pub fn run(y: &Tensor, p: &Params) -> Result<Kept> {
    let (nc, na) = (p.nc, p.na);
    let b = y.dim(0)?;
    let y = y.contiguous()?;
    let (ys, ly) = y.storage_and_layout();
    let Storage::Cuda(ys) = &*ys else { return Err(drv("input")("not on a CUDA device")) };
    let pred = ys.as_cuda_slice::<f32>()?.slice(ly.start_offset()..);
    let dev = ys.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let (rs, cs) = if p.channels_first { (na, 1) } else { (1, 4 + nc) };
    let slots = na * nc;
    let seg = slots.next_power_of_two().max(2);
    // The candidates are gathered into segments of `cap` keys and sorted there; only an image with more than
    // `cap` candidates sorts its whole segment of slots (each pass of that sort is launched for every batch and
    // returns at once for the others: no host read decides it).
    let cap = p.max_nms.max(WORD).next_power_of_two().min(seg);
    let n_max = slots.min(p.max_nms).max(1);
    let w = words(n_max);
    let max_det = p.max_det;
    let multi = p.multi_label && nc > 1;
    let (offset, per_class) = (p.class_offset, p.per_class);
    let (nci, bi, wi, mdi) = (i32_of(nc)?, i32_of(b)?, i32_of(w)?, i32_of(max_det)?);
    let (nai, rsi, csi, segi, ni) = (i64_of(na)?, i64_of(rs)?, i64_of(cs)?, i64_of(seg)?, i64_of(n_max)?);
    let capi = i64_of(cap)?;
    let alloc = |what: &'static str, n: usize| stream.alloc_zeros::<u32>(n).map_err(drv(what));
    // SAFETY: `masknms_fill` writes every key before anything reads them.
    let mut keys = unsafe { stream.alloc::<u64>(b * seg) }.map_err(drv("allocating the keys"))?;
    let mut bad = alloc("allocating the flags", b)?;
    let mut count = alloc("allocating the counts", b)?;
    let mut found = alloc("allocating the candidate counts", b)?;
    let mut overflow = alloc("allocating the overflow flags", b)?;
    // SAFETY: `masknms_fill` writes every key before anything reads them.
    let mut compact = unsafe { stream.alloc::<u64>(b * cap) }.map_err(drv("allocating the candidates"))?;
    let mut kept = alloc("allocating the kept counts", b)?;
    let mut keep = alloc("allocating the kept positions", b * max_det)?;
    let mut anchors = alloc("allocating the anchors", b * max_det)?;
    let mut rows = stream.alloc_zeros::<f32>(b * max_det * 6).map_err(drv("allocating the rows"))?;
    let mut boxes = stream.alloc_zeros::<f32>(b * n_max * 4).map_err(drv("allocating the boxes"))?;
    let mut sup = stream.alloc_zeros::<f32>(b * n_max * 5).map_err(drv("allocating the boxes"))?;
    let mut groups = alloc("allocating the groups", b * n_max)?;
    let mut masks = stream.alloc_zeros::<u64>(n_max * w).map_err(drv("allocating the masks"))?;

    let total = i64_of(b * seg)?;
    let mut l = stream.launch_builder(&k.fill);
    l.arg(&mut keys).arg(&total);
    // SAFETY (every launch below): the arguments match the kernel's signature in kernels.cu, and every index a
    // kernel forms is bounded by the sizes passed, which are those of the buffers allocated above.
    unsafe { l.launch(flat(b * seg)?) }.map_err(drv("fill"))?;
    let (conf, multi_i) = (p.conf_thres, i32::from(multi));
    let mut l = stream.launch_builder(&k.keys);
    l.arg(&pred).arg(&mut keys).arg(&mut bad).arg(&nci).arg(&nai).arg(&rsi).arg(&csi).arg(&segi).arg(&bi);
    l.arg(&conf).arg(&multi_i);
    unsafe { l.launch(flat(b * na)?) }.map_err(drv("candidate keys"))?;
    let total_c = i64_of(b * cap)?;
    let mut l = stream.launch_builder(&k.fill);
    l.arg(&mut compact).arg(&total_c);
    unsafe { l.launch(flat(b * cap)?) }.map_err(drv("fill"))?;
    let mut l = stream.launch_builder(&k.compact);
    l.arg(&keys).arg(&mut compact).arg(&mut found).arg(&mut overflow).arg(&segi).arg(&capi).arg(&bi);
    unsafe { l.launch(flat(b * seg)?) }.map_err(drv("compact"))?;
    // Every image's candidates (all that matters unless it overflowed), then the full segments of those that did.
    let none: Option<&CudaSlice<u32>> = None;
    for (buf, len, len_i, select) in [(&mut compact, cap, capi, none), (&mut keys, seg, segi, Some(&overflow))] {
        let mut size = 2usize;
        while size <= len {
            let mut j = size / 2;
            while j > 0 {
                let (ji, si, want) = (i64_of(j)?, i64_of(size)?, 1u32);
                let mut l = stream.launch_builder(&k.bitonic);
                l.arg(&mut *buf).arg(&len_i).arg(&bi).arg(&ji).arg(&si);
                match select {
                    Some(flags) => l.arg(flags),
                    None => l.arg(&0u64),
                };
                l.arg(&want);
                unsafe { l.launch(flat(b * len)?) }.map_err(drv("sort"))?;
                j /= 2;
            }
            size *= 2;
        }
    }
    let mut l = stream.launch_builder(&k.take_full);
    l.arg(&keys).arg(&mut compact).arg(&overflow).arg(&segi).arg(&capi).arg(&bi);
    unsafe { l.launch(flat(b * cap)?) }.map_err(drv("overflow"))?;
    let max_nms = i64_of(p.max_nms)?;
    let mut l = stream.launch_builder(&k.count);
    l.arg(&found).arg(&mut count).arg(&bi).arg(&max_nms);
    unsafe { l.launch(flat(b)?) }.map_err(drv("count"))?;
    let (max_wh, off_i, pc_i) = (offset.unwrap_or(0.0), i32::from(offset.is_some()), i32::from(per_class));
    let mut l = stream.launch_builder(&k.boxes);
    l.arg(&pred).arg(&compact).arg(&count).arg(&mut boxes).arg(&mut sup).arg(&mut groups).arg(&nci).arg(&nai);
    l.arg(&rsi).arg(&csi).arg(&capi).arg(&ni).arg(&bi).arg(&max_wh).arg(&off_i).arg(&pc_i);
    unsafe { l.launch(flat(b * n_max)?) }.map_err(drv("boxes"))?;
    let suppress = i32::from(p.suppress);
    let blocks = u32::try_from(w).map_err(drv("too many candidates"))?;
    let shared = u32::try_from(w * 8).map_err(drv("too many candidates"))?;
    for img in 0..b {
        let img = i32_of(img)?;
        if suppress == 1 {
            let cfg =
                LaunchConfig { grid_dim: (blocks, blocks, 1), block_dim: (WORD as u32, 1, 1), shared_mem_bytes: 0 };
            let mut l = stream.launch_builder(&k.overlap);
            l.arg(&sup).arg(&groups).arg(&count).arg(&mut masks).arg(&ni).arg(&wi).arg(&img).arg(&p.iou_thres);
            unsafe { l.launch(cfg) }.map_err(drv("overlap masks"))?;
        }
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: shared };
        let mut l = stream.launch_builder(&k.keep);
        l.arg(&masks).arg(&count).arg(&mut keep).arg(&mut kept).arg(&wi).arg(&img).arg(&mdi).arg(&suppress);
        unsafe { l.launch(cfg) }.map_err(drv("greedy keep"))?;
    }
    let mut l = stream.launch_builder(&k.gather);
    l.arg(&pred).arg(&compact).arg(&boxes).arg(&keep).arg(&kept).arg(&mut rows).arg(&mut anchors).arg(&nci).arg(&nai);
    l.arg(&rsi).arg(&csi).arg(&capi).arg(&ni).arg(&bi).arg(&mdi);
    unsafe { l.launch(flat(b * max_det)?) }.map_err(drv("gather"))?;
    Ok(Kept {
        rows: wrap(rows, &dev, &[b, max_det, 6]),
        anchors: wrap(anchors, &dev, &[b, max_det]),
        kept: wrap(kept, &dev, &[b]),
        non_finite: wrap(bad, &dev, &[b]),
    })
}
