//! The CUDA side of [`super::MultiTensor`]: the kernels of `kernels.cu`, the device tables of tensor addresses
//! and lengths, and a ring of pinned host buffers for each call's table (so the copy is asynchronous: a pageable
//! source would make the driver wait for the stream).
//!
//! Parameters, optimizer state and EMA variables are written in place: their addresses are taken from candle's
//! storage and the kernels run on the device's one compute stream, in order with every op that reads them.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, Device, Result, Storage, Tensor, Var, bail};

use super::Rule;
use crate::nvrtc::PerDevice;

const SRC: &str = include_str!("kernels.cu");
/// Blocks per tensor along grid.x (`CHUNKS` in the kernels).
const CHUNKS: u32 = 64;
/// Pinned table buffers in the ring: a buffer is rewritten only after the copy from it three calls back is done.
const RING: usize = 3;

struct Kernels {
    sumsq: CudaFunction,
    norm_final: CudaFunction,
    update: CudaFunction,
    ema: CudaFunction,
}

fn drv<E: std::fmt::Debug>(what: &'static str) -> impl Fn(E) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("multi-tensor step (CUDA) {what}: {e:?}"))
}

fn kernels(dev: &CudaDevice) -> Result<Arc<Kernels>> {
    static KERNELS: PerDevice<Kernels> = PerDevice::new();
    KERNELS.get(dev, "multi-tensor step (CUDA)", SRC, |f| {
        Ok(Kernels {
            sumsq: f.get("mt_sumsq")?,
            norm_final: f.get("mt_norm_final")?,
            update: f.get("mt_update")?,
            ema: f.get("mt_ema")?,
        })
    })
}

/// The device address of a contiguous f32 tensor's first element. Contiguous tensors only, so that no temporary
/// copy is taken whose memory the pool could hand out again before the kernel runs.
fn address(t: &Tensor, stream: &CudaStream) -> Result<u64> {
    let (s, l) = t.storage_and_layout();
    let Storage::Cuda(c) = &*s else { bail!("multi-tensor step (CUDA): a tensor is not on the CUDA device") };
    let Some((a, _)) = l.contiguous_offsets() else { bail!("multi-tensor step (CUDA): a tensor is not contiguous") };
    let slice = c.as_cuda_slice::<f32>()?;
    let (ptr, _sync) = slice.device_ptr(stream);
    Ok(ptr + (a * std::mem::size_of::<f32>()) as u64)
}

/// A pinned host buffer and the device buffer it is copied to, grown to fit.
struct Table {
    host: Vec<PinnedHostSlice<u64>>,
    next: usize,
    dev: Option<CudaSlice<u64>>,
}

impl Table {
    fn new() -> Self {
        Self { host: Vec::new(), next: 0, dev: None }
    }

    /// Writes `words` into the next pinned buffer of the ring and copies it to the device buffer (asynchronously,
    /// on the stream); returns the device buffer.
    fn upload(&mut self, stream: &Arc<CudaStream>, words: &[u64]) -> Result<&CudaSlice<u64>> {
        let n = words.len().max(1);
        if self.host.first().is_none_or(|h| h.len() < n) {
            self.host.clear();
            for _ in 0..RING {
                // SAFETY: the buffer is fully written below before any copy reads it.
                self.host.push(unsafe { stream.context().alloc_pinned::<u64>(n) }.map_err(drv("pinned table"))?);
            }
            self.dev = None;
        }
        if self.dev.as_ref().is_none_or(|d| d.len() < n) {
            // SAFETY: every word a kernel reads is copied in below first.
            self.dev = Some(unsafe { stream.alloc::<u64>(n) }.map_err(drv("device table"))?);
        }
        let host = &mut self.host[self.next];
        self.next = (self.next + 1) % RING;
        // Waits only if the copy from this buffer, three calls back, has not run yet.
        let slots = host.as_mut_slice().map_err(drv("pinned table"))?;
        slots[..words.len()].copy_from_slice(words);
        let Some(dev) = self.dev.as_mut() else { bail!("multi-tensor step (CUDA): no device table") };
        stream.memcpy_htod(&*host, dev).map_err(drv("copying the table"))?;
        Ok(dev)
    }
}

/// The kernels, the stream and the tables of one device.
pub(super) struct Gpu {
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    k: Arc<Kernels>,
    norm_table: Table,
    update_table: Table,
    ema_table: Table,
}

fn grid(tensors: usize) -> Result<LaunchConfig> {
    let t = u32::try_from(tensors).ok().filter(|t| *t <= 65_535);
    let Some(t) = t else { bail!("multi-tensor step (CUDA): {tensors} tensors in one launch") };
    Ok(LaunchConfig { grid_dim: (CHUNKS, t.max(1), 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 })
}

fn len_word(t: &Tensor) -> u64 {
    t.elem_count() as u64
}

impl Gpu {
    pub(super) fn new(device: &Device) -> Result<Self> {
        let Device::Cuda(dev) = device else { bail!("multi-tensor step (CUDA): not a CUDA device") };
        Ok(Self {
            dev: dev.clone(),
            stream: dev.cuda_stream(),
            k: kernels(dev)?,
            norm_table: Table::new(),
            update_table: Table::new(),
            ema_table: Table::new(),
        })
    }

    fn wrap(&self, s: CudaSlice<f32>, shape: &[usize]) -> Tensor {
        let storage = CudaStorage::wrap_cuda_slice(s, self.dev.clone());
        Tensor::from_storage(Storage::Cuda(storage), shape, BackpropOp::none(), false)
    }

    pub(super) fn grad_norm(&mut self, grads: &[&Tensor], scale: Option<&Tensor>, max_norm: f32) -> Result<Tensor> {
        let n = grads.len();
        if n == 0 {
            bail!("multi-tensor step (CUDA): a gradient norm of no tensors");
        }
        let mut words = Vec::with_capacity(2 * n);
        for g in grads {
            words.push(address(g, &self.stream)?);
        }
        words.extend(grads.iter().map(|g| len_word(g)));
        let stream = Arc::clone(&self.stream);
        let table = self.norm_table.upload(&stream, &words)?;
        let (ptrs, lens) = (table.slice(..n), table.slice(n..2 * n));
        // SAFETY (both allocations): every element is written by the kernel that follows before anything reads it.
        let mut part = unsafe { stream.alloc::<f64>(n * CHUNKS as usize) }.map_err(drv("allocating"))?;
        let mut out = unsafe { stream.alloc::<f32>(4) }.map_err(drv("allocating"))?;
        let mut l = stream.launch_builder(&self.k.sumsq);
        l.arg(&ptrs).arg(&lens).arg(&mut part);
        // SAFETY: the tables hold `n` addresses of live f32 tensors and their lengths; `part` has n × CHUNKS.
        unsafe { l.launch(grid(n)?) }.map_err(drv("norm"))?;
        let tensors = i32::try_from(n).map_err(drv("tensor count"))?;
        let scale_ptr = match scale {
            Some(s) => address(s, &stream)?,
            None => 0,
        };
        let mut l = stream.launch_builder(&self.k.norm_final);
        l.arg(&part).arg(&tensors).arg(&scale_ptr).arg(&max_norm).arg(&mut out);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `part` holds the sums of `n` tensors; `scale_ptr` is 0 or a live f32 scalar; `out` has 4.
        unsafe { l.launch(one) }.map_err(drv("norm"))?;
        Ok(self.wrap(out, &[4]))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn update(
        &mut self,
        rule: Rule,
        params: &[&Var],
        grads: &[&Tensor],
        state0: &[Option<Tensor>],
        state1: &[Option<Tensor>],
        consts: &[[f32; 8]],
        norm: &Tensor,
    ) -> Result<()> {
        let n = params.len();
        if n == 0 {
            return Ok(());
        }
        let stream = Arc::clone(&self.stream);
        // Layout: params, grads, state0, state1 (state0 again for SGD: unused), lengths, then the constants, two
        // f32 to a word.
        let mut words = Vec::with_capacity(9 * n);
        for p in params {
            words.push(address(p.as_tensor(), &stream)?);
        }
        for g in grads {
            words.push(address(g, &stream)?);
        }
        let state = |s: &Option<Tensor>| -> Result<u64> {
            match s {
                Some(t) => address(t, &stream),
                None => bail!("multi-tensor step (CUDA): optimizer state missing"),
            }
        };
        for s in state0 {
            words.push(state(s)?);
        }
        if rule == Rule::SgdNesterov {
            for s in state0 {
                words.push(state(s)?);
            }
        } else {
            for s in state1 {
                words.push(state(s)?);
            }
        }
        words.extend(params.iter().map(|p| len_word(p.as_tensor())));
        for c in consts {
            for pair in c.chunks_exact(2) {
                words.push(u64::from(pair[0].to_bits()) | (u64::from(pair[1].to_bits()) << 32));
            }
        }
        let table = self.update_table.upload(&stream, &words)?;
        let at = |k: usize| table.slice(k * n..(k + 1) * n);
        let (p, g, b0, b1, lens) = (at(0), at(1), at(2), at(3), at(4));
        // The constants as the f32 array the kernel reads (little-endian: the low half is the first float).
        let consts_view = table.slice(5 * n..9 * n);
        let (cs, cl) = norm.storage_and_layout();
        let Storage::Cuda(ns) = &*cs else { bail!("multi-tensor step (CUDA): the norm is not on the device") };
        let out = ns.as_cuda_slice::<f32>()?.slice(cl.start_offset()..);
        let code = rule.code();
        let mut l = stream.launch_builder(&self.k.update);
        l.arg(&code).arg(&p).arg(&g).arg(&b0).arg(&b1).arg(&lens).arg(&consts_view).arg(&out);
        // SAFETY: the tables hold `n` addresses of live, contiguous f32 tensors of the lengths given (parameters,
        // gradients and state of the same shapes, checked by the caller) and 8 constants per tensor; `out` has 4.
        unsafe { l.launch(grid(n)?) }.map_err(drv("update"))?;
        Ok(())
    }

    pub(super) fn ema(&mut self, ema: &[&Var], model: &[&Tensor], w: f32, mask: Option<&Tensor>) -> Result<()> {
        let n = ema.len();
        if n == 0 {
            return Ok(());
        }
        let stream = Arc::clone(&self.stream);
        let mut words = Vec::with_capacity(3 * n);
        for e in ema {
            words.push(address(e.as_tensor(), &stream)?);
        }
        for m in model {
            words.push(address(m, &stream)?);
        }
        words.extend(ema.iter().map(|e| len_word(e.as_tensor())));
        let table = self.ema_table.upload(&stream, &words)?;
        let at = |k: usize| table.slice(k * n..(k + 1) * n);
        let (e, m, lens) = (at(0), at(1), at(2));
        let ok_ptr = match mask {
            Some(t) => address(t, &stream)?,
            None => 0,
        };
        let (wm1, small) = (w - 1.0, i32::from(w.abs() < 0.5));
        let mut l = stream.launch_builder(&self.k.ema);
        l.arg(&e).arg(&m).arg(&lens).arg(&w).arg(&wm1).arg(&small).arg(&ok_ptr);
        // SAFETY: the tables hold `n` addresses of live, contiguous f32 tensors of equal shapes (checked by the
        // caller) and their lengths; `ok_ptr` is 0 or the norm's 4 floats.
        unsafe { l.launch(grid(n)?) }.map_err(drv("EMA"))?;
        Ok(())
    }
}
