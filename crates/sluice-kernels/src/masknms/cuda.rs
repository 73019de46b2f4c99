//! The CUDA launches of batched mask NMS: the kernels of `kernels.cu`, compiled by NVRTC once per device, chained on
//! the input's stream with no host read. The steps and their host twins are `sluice_eval::masknms`'s.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg,
};
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

/// The sizes of one call, as the kernels take them.
struct Sizes {
    b: usize,
    /// Slots per image's key segment (`na · nc` rounded up to a power of two).
    seg: usize,
    /// Keys per image's compacted candidates.
    cap: usize,
    /// Candidates per image that reach the overlap step.
    n_max: usize,
    /// Mask words per candidate.
    w: usize,
    max_det: usize,
    nci: i32,
    bi: i32,
    wi: i32,
    mdi: i32,
    nai: i64,
    rsi: i64,
    csi: i64,
    segi: i64,
    capi: i64,
    ni: i64,
}

impl Sizes {
    fn new(b: usize, p: &Params) -> Result<Self> {
        let (nc, na) = (p.nc, p.na);
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
        Ok(Self {
            b,
            seg,
            cap,
            n_max,
            w,
            max_det,
            nci: i32_of(nc)?,
            bi: i32_of(b)?,
            wi: i32_of(w)?,
            mdi: i32_of(max_det)?,
            nai: i64_of(na)?,
            rsi: i64_of(rs)?,
            csi: i64_of(cs)?,
            segi: i64_of(seg)?,
            capi: i64_of(cap)?,
            ni: i64_of(n_max)?,
        })
    }
}

/// The device buffers of one call.
struct Buffers {
    keys: CudaSlice<u64>,
    bad: CudaSlice<u32>,
    count: CudaSlice<u32>,
    found: CudaSlice<u32>,
    overflow: CudaSlice<u32>,
    compact: CudaSlice<u64>,
    kept: CudaSlice<u32>,
    keep: CudaSlice<u32>,
    anchors: CudaSlice<u32>,
    rows: CudaSlice<f32>,
    boxes: CudaSlice<f32>,
    sup: CudaSlice<f32>,
    groups: CudaSlice<u32>,
    masks: CudaSlice<u64>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, z: &Sizes) -> Result<Self> {
        let b = z.b;
        let alloc = |what: &'static str, n: usize| stream.alloc_zeros::<u32>(n).map_err(drv(what));
        Ok(Self {
            // SAFETY: `masknms_fill` writes every key before anything reads them.
            keys: unsafe { stream.alloc::<u64>(b * z.seg) }.map_err(drv("allocating the keys"))?,
            bad: alloc("allocating the flags", b)?,
            count: alloc("allocating the counts", b)?,
            found: alloc("allocating the candidate counts", b)?,
            overflow: alloc("allocating the overflow flags", b)?,
            // SAFETY: `masknms_fill` writes every key before anything reads them.
            compact: unsafe { stream.alloc::<u64>(b * z.cap) }.map_err(drv("allocating the candidates"))?,
            kept: alloc("allocating the kept counts", b)?,
            keep: alloc("allocating the kept positions", b * z.max_det)?,
            anchors: alloc("allocating the anchors", b * z.max_det)?,
            rows: stream.alloc_zeros::<f32>(b * z.max_det * 6).map_err(drv("allocating the rows"))?,
            boxes: stream.alloc_zeros::<f32>(b * z.n_max * 4).map_err(drv("allocating the boxes"))?,
            sup: stream.alloc_zeros::<f32>(b * z.n_max * 5).map_err(drv("allocating the boxes"))?,
            groups: alloc("allocating the groups", b * z.n_max)?,
            masks: stream.alloc_zeros::<u64>(z.n_max * z.w).map_err(drv("allocating the masks"))?,
        })
    }
}

// SAFETY (every launch below): the arguments match the kernel's signature in kernels.cu, and every index a kernel
// forms is bounded by the sizes passed, which are those of the buffers `Buffers::new` allocated from the same `Sizes`.

/// What every step of one call reads: the stream, the kernels, the input, its sizes and the parameters.
struct Chain<'a> {
    stream: &'a Arc<CudaStream>,
    k: &'a Kernels,
    pred: &'a CudaView<'a, f32>,
    z: &'a Sizes,
    p: &'a Params,
}

/// Each image's candidates above `conf_thres` as sort keys, compacted and sorted by score, and their counts.
fn select(c: &Chain<'_>, m: &mut Buffers) -> Result<()> {
    let Chain { stream, k, pred, z, p } = *c;
    let b = z.b;
    let total = i64_of(b * z.seg)?;
    let mut l = stream.launch_builder(&k.fill);
    l.arg(&mut m.keys).arg(&total);
    unsafe { l.launch(flat(b * z.seg)?) }.map_err(drv("fill"))?;
    let (conf, multi_i) = (p.conf_thres, i32::from(p.multi_label && p.nc > 1));
    let mut l = stream.launch_builder(&k.keys);
    l.arg(pred).arg(&mut m.keys).arg(&mut m.bad).arg(&z.nci).arg(&z.nai).arg(&z.rsi).arg(&z.csi).arg(&z.segi);
    l.arg(&z.bi).arg(&conf).arg(&multi_i);
    unsafe { l.launch(flat(b * p.na)?) }.map_err(drv("candidate keys"))?;
    let total_c = i64_of(b * z.cap)?;
    let mut l = stream.launch_builder(&k.fill);
    l.arg(&mut m.compact).arg(&total_c);
    unsafe { l.launch(flat(b * z.cap)?) }.map_err(drv("fill"))?;
    let mut l = stream.launch_builder(&k.compact);
    l.arg(&m.keys).arg(&mut m.compact).arg(&mut m.found).arg(&mut m.overflow).arg(&z.segi).arg(&z.capi).arg(&z.bi);
    unsafe { l.launch(flat(b * z.seg)?) }.map_err(drv("compact"))?;
    // Every image's candidates (all that matters unless it overflowed), then the full segments of those that did.
    let none: Option<&CudaSlice<u32>> = None;
    let sorts = [(&mut m.compact, z.cap, z.capi, none), (&mut m.keys, z.seg, z.segi, Some(&m.overflow))];
    for (buf, len, len_i, select) in sorts {
        let mut size = 2usize;
        while size <= len {
            let mut j = size / 2;
            while j > 0 {
                let (ji, si, want) = (i64_of(j)?, i64_of(size)?, 1u32);
                let mut l = stream.launch_builder(&k.bitonic);
                l.arg(&mut *buf).arg(&len_i).arg(&z.bi).arg(&ji).arg(&si);
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
    l.arg(&m.keys).arg(&mut m.compact).arg(&m.overflow).arg(&z.segi).arg(&z.capi).arg(&z.bi);
    unsafe { l.launch(flat(b * z.cap)?) }.map_err(drv("overflow"))?;
    let max_nms = i64_of(p.max_nms)?;
    let mut l = stream.launch_builder(&k.count);
    l.arg(&m.found).arg(&mut m.count).arg(&z.bi).arg(&max_nms);
    unsafe { l.launch(flat(b)?) }.map_err(drv("count"))?;
    Ok(())
}

/// The candidates' boxes, then per image the overlap masks and the greedy keep.
fn suppress(c: &Chain<'_>, m: &mut Buffers) -> Result<()> {
    let Chain { stream, k, pred, z, p } = *c;
    let offset = p.class_offset;
    let (max_wh, off_i, pc_i) = (offset.unwrap_or(0.0), i32::from(offset.is_some()), i32::from(p.per_class));
    let mut l = stream.launch_builder(&k.boxes);
    l.arg(pred).arg(&m.compact).arg(&m.count).arg(&mut m.boxes).arg(&mut m.sup).arg(&mut m.groups).arg(&z.nci);
    l.arg(&z.nai).arg(&z.rsi).arg(&z.csi).arg(&z.capi).arg(&z.ni).arg(&z.bi).arg(&max_wh).arg(&off_i).arg(&pc_i);
    unsafe { l.launch(flat(z.b * z.n_max)?) }.map_err(drv("boxes"))?;
    let suppress = i32::from(p.suppress);
    let blocks = u32::try_from(z.w).map_err(drv("too many candidates"))?;
    let shared = u32::try_from(z.w * 8).map_err(drv("too many candidates"))?;
    for img in 0..z.b {
        let img = i32_of(img)?;
        if suppress == 1 {
            let cfg =
                LaunchConfig { grid_dim: (blocks, blocks, 1), block_dim: (WORD as u32, 1, 1), shared_mem_bytes: 0 };
            let mut l = stream.launch_builder(&k.overlap);
            l.arg(&m.sup).arg(&m.groups).arg(&m.count).arg(&mut m.masks).arg(&z.ni).arg(&z.wi).arg(&img);
            l.arg(&p.iou_thres);
            unsafe { l.launch(cfg) }.map_err(drv("overlap masks"))?;
        }
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: shared };
        let mut l = stream.launch_builder(&k.keep);
        l.arg(&m.masks).arg(&m.count).arg(&mut m.keep).arg(&mut m.kept).arg(&z.wi).arg(&img).arg(&z.mdi);
        l.arg(&suppress);
        unsafe { l.launch(cfg) }.map_err(drv("greedy keep"))?;
    }
    Ok(())
}

/// The kernels' chain on the `B` images of `y` (f32, shaped as `p` says; the caller checks the shape, `max_det >= 1`
/// and that `na · nc` fits 32 bits).
pub fn run(y: &Tensor, p: &Params) -> Result<Kept> {
    let b = y.dim(0)?;
    let y = y.contiguous()?;
    let (ys, ly) = y.storage_and_layout();
    let Storage::Cuda(ys) = &*ys else { return Err(drv("input")("not on a CUDA device")) };
    let pred = ys.as_cuda_slice::<f32>()?.slice(ly.start_offset()..);
    let dev = ys.device().clone();
    let stream = dev.cuda_stream();
    let k = kernels(&dev)?;
    let z = Sizes::new(b, p)?;
    let mut m = Buffers::new(&stream, &z)?;
    let chain = Chain { stream: &stream, k: &k, pred: &pred, z: &z, p };
    select(&chain, &mut m)?;
    suppress(&chain, &mut m)?;
    let mut l = stream.launch_builder(&k.gather);
    l.arg(&pred).arg(&m.compact).arg(&m.boxes).arg(&m.keep).arg(&m.kept).arg(&mut m.rows).arg(&mut m.anchors);
    l.arg(&z.nci).arg(&z.nai).arg(&z.rsi).arg(&z.csi).arg(&z.capi).arg(&z.ni).arg(&z.bi).arg(&z.mdi);
    unsafe { l.launch(flat(b * z.max_det)?) }.map_err(drv("gather"))?;
    Ok(Kept {
        rows: wrap(m.rows, &dev, &[b, z.max_det, 6]),
        anchors: wrap(m.anchors, &dev, &[b, z.max_det]),
        kept: wrap(m.kept, &dev, &[b]),
        non_finite: wrap(m.bad, &dev, &[b]),
    })
}
