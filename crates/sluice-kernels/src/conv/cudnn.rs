//! The three convolution passes on a CUDA device through cuDNN (feature `cudnn`): forward, backward-data (the input
//! gradient) and backward-filter (the weight gradient), for f32, bf16 and f16 tensors (bf16 and f16 with f32
//! compute and tensor-op math, cuDNN's "pseudo half" configurations; f32 with cuDNN's default math, which, as
//! PyTorch's default `allow_tf32`, may use TF32 tensor cores).
//!
//! Stock candle 0.11 runs only the forward pass through cuDNN, and asks cuDNN's heuristics for an algorithm and
//! allocates (and zero-fills) a fresh workspace on every call; its input gradient is `conv_transpose2d`, a direct
//! CUDA kernel of candle's own. Here:
//!
//! - **Algorithms are chosen once per shape.** The first call for a `(device, pass, dtype, geometry)` chooses as
//!   [`super::search`] is set: by timing every algorithm on the call's tensors (`cudnnFind*`, the default, as
//!   PyTorch's `cudnn.benchmark`; it blocks once per shape and pass) or by cuDNN's heuristics
//!   (`cudnnGetConvolution*Algorithm_v7`), deterministic algorithms only when asked; and keeps the answer and its
//!   workspace size in a per-thread table; later calls only look it up. Multi-scale training adds one entry per
//!   batch side and pass. A failed search falls back to cudarc's heuristic pick ([`search_fallbacks`] counts them).
//! - **One workspace per thread and device**, grown when a pass needs more and otherwise reused (stream order
//!   makes the reuse safe: every pass runs on the device's one compute stream). It is never zero-filled.
//! - **Outputs are not zero-filled**: cuDNN writes every element with `beta = 0`.
//!
//! Grouped convolutions (`run_groups`: the depthwise convolutions of YOLO11 and YOLO26) set cuDNN's group count
//! on the same descriptors, where candle would run one convolution per group.
//!
//! [`plans_cached`] reports the table's size (the shapes tuned so far, all threads).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cudnn::{
    ConvBackwardData, ConvBackwardFilter, ConvDescriptor, ConvForward, Cudnn, CudnnDataType, FilterDescriptor,
    TensorDescriptor, sys,
};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr};
use candle_core::cuda_backend::{CudaDType, DeviceId};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, WithDType, bail};

use super::kernels::Geom;
use super::search;

/// Which pass of the convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Pass {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx` from `(dy, w)`.
    BackwardData,
    /// `dw` from `(x, dy)`.
    BackwardFilter,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    device: DeviceId,
    pass: Pass,
    dtype: DType,
    /// `n, c, h, w, o, k, stride, pad, groups`.
    geom: [usize; 9],
}

#[derive(Debug, Clone, Copy)]
enum Algo {
    Forward(sys::cudnnConvolutionFwdAlgo_t),
    BackwardData(sys::cudnnConvolutionBwdDataAlgo_t),
    BackwardFilter(sys::cudnnConvolutionBwdFilterAlgo_t),
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    algo: Algo,
    workspace: usize,
}

#[derive(Default)]
struct State {
    handles: HashMap<DeviceId, Arc<Cudnn>>,
    plans: HashMap<Key, Plan>,
    workspaces: HashMap<DeviceId, CudaSlice<u8>>,
}

thread_local! {
    // cuDNN handles are neither Send nor Sync: one per thread and device, as candle keeps its own.
    static STATE: RefCell<State> = RefCell::new(State::default());
}

static PLANS: AtomicUsize = AtomicUsize::new(0);

/// The number of `(device, pass, dtype, shape)` algorithm choices made so far, over all threads: after the first
/// training step at a given size it stops growing.
pub fn plans_cached() -> usize {
    PLANS.load(Ordering::Relaxed)
}

fn err(what: &str) -> impl Fn(candle_core::cuda_backend::cudarc::cudnn::CudnnError) -> candle_core::Error + '_ {
    move |e| candle_core::Error::Msg(format!("cuDNN {what}: {e:?}"))
}

/// The contiguous view of a storage of `T`, or an error naming the pass.
fn view<'a, T: CudaDType>(s: &'a CudaStorage, l: &Layout, pass: Pass) -> Result<CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else { bail!("cuDNN conv {pass:?}: input is not contiguous") };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// Runs `pass` on the two inputs (`(x, w)`, `(dy, w)` or `(x, dy)`), returning the new storage.
pub(super) fn run(
    pass: Pass,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    g: &Geom,
) -> Result<CudaStorage> {
    run_groups(pass, (s1, l1), (s2, l2), g, 1)
}

/// [`run`] for a grouped convolution: `groups` divides the input channels `g.c` and the outputs `g.o`, and the
/// filter is `(o, c / groups, k, k)` (a depthwise convolution: `groups = c = o`, filter `(c, 1, k, k)`).
pub(crate) fn run_groups(
    pass: Pass,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    g: &Geom,
    groups: usize,
) -> Result<CudaStorage> {
    if groups == 0 || !g.c.is_multiple_of(groups) || !g.o.is_multiple_of(groups) {
        bail!("cuDNN conv {pass:?}: {groups} groups do not divide {} input and {} output channels", g.c, g.o);
    }
    match (s1.dtype(), s2.dtype()) {
        (DType::F32, DType::F32) => run_t::<f32>(pass, (s1, l1), (s2, l2), g, groups),
        (DType::BF16, DType::BF16) => run_t::<half::bf16>(pass, (s1, l1), (s2, l2), g, groups),
        (DType::F16, DType::F16) => run_t::<half::f16>(pass, (s1, l1), (s2, l2), g, groups),
        (a, b) => bail!("cuDNN conv {pass:?}: expected two f32, bf16 or f16 tensors, got {a:?} and {b:?}"),
    }
}

/// Whether cuDNN takes this dtype here.
pub(crate) fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::BF16 | DType::F16)
}

struct Descriptors<T: CudnnDataType> {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
}

fn descriptors<T: CudnnDataType>(cudnn: &Arc<Cudnn>, g: &Geom, groups: usize) -> Result<Descriptors<T>> {
    let i = |v: usize| i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("cuDNN conv: {v} overflows i32")));
    let (pad, stride) = (i(g.pad)?, i(g.stride)?);
    let mut conv = cudnn
        .create_conv2d::<f32>(
            [pad, pad],
            [stride, stride],
            [1, 1],
            sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
        )
        .map_err(err("convolution descriptor"))?;
    if T::DATA_TYPE != sys::cudnnDataType_t::CUDNN_DATA_FLOAT {
        conv.set_math_type(sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH).map_err(err("math type"))?;
    }
    if groups > 1 {
        conv.set_group_count(i(groups)?).map_err(err("group count"))?;
    }
    let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    let x = cudnn.create_4d_tensor::<T>(nchw, [i(g.n)?, i(g.c)?, i(g.h)?, i(g.w)?]).map_err(err("input descriptor"))?;
    let w = cudnn
        .create_4d_filter::<T>(nchw, [i(g.o)?, i(g.c / groups)?, i(g.k)?, i(g.k)?])
        .map_err(err("filter descriptor"))?;
    let y =
        cudnn.create_4d_tensor::<T>(nchw, [i(g.n)?, i(g.o)?, i(g.ho)?, i(g.wo)?]).map_err(err("output descriptor"))?;
    Ok(Descriptors { conv, x, w, y })
}

impl State {
    fn handle(&mut self, dev: &CudaDevice) -> Result<Arc<Cudnn>> {
        if let Some(h) = self.handles.get(&dev.id()) {
            return Ok(h.clone());
        }
        let h = Cudnn::new(dev.cuda_stream()).map_err(err("handle"))?;
        self.handles.insert(dev.id(), h.clone());
        Ok(h)
    }

    fn plan(&mut self, key: Key, choose: impl FnOnce() -> Result<Plan>) -> Result<Plan> {
        if let Some(p) = self.plans.get(&key) {
            return Ok(*p);
        }
        let p = choose()?;
        self.plans.insert(key, p);
        PLANS.fetch_add(1, Ordering::Relaxed);
        Ok(p)
    }

    /// This thread's workspace on `dev`, at least `bytes` long (`None` when the algorithm needs none).
    fn workspace(&mut self, dev: &CudaDevice, bytes: usize) -> Result<Option<&mut CudaSlice<u8>>> {
        if bytes == 0 {
            return Ok(None);
        }
        let grow = self.workspaces.get(&dev.id()).is_none_or(|w| w.len() < bytes);
        if grow {
            // SAFETY: a workspace is scratch that cuDNN writes before it reads; it is never read on the host.
            let ws = unsafe { dev.alloc::<u8>(bytes)? };
            self.workspaces.insert(dev.id(), ws);
        }
        Ok(self.workspaces.get_mut(&dev.id()))
    }
}

/// Bytes of scratch the timed search may give an algorithm (the chosen one's own workspace is allocated after).
const SEARCH_WORKSPACE: usize = 256 << 20;

static SEARCH_FALLBACKS: AtomicUsize = AtomicUsize::new(0);

/// The `(shape, pass)` choices for which the search of [`super::search`] failed (or found no algorithm that
/// qualifies) and cudarc's heuristic pick was taken instead.
pub fn search_fallbacks() -> usize {
    SEARCH_FALLBACKS.load(Ordering::Relaxed)
}

/// The algorithm and its workspace bytes by the search in force ([`super::search`]), or `None` (counted) when it
/// fails; `ptrs` are the pass's two inputs and its output, the tensors the timed search runs on.
fn searched<A>(
    dev: &CudaDevice,
    g: &Geom,
    groups: usize,
    data: sys::cudnnDataType_t,
    ptrs: (u64, u64, u64),
    find: impl FnOnce(&search::raw::Raw, Option<&search::raw::Buffers>) -> Result<Option<(A, usize)>>,
) -> Option<(A, usize)> {
    let run = || -> Result<Option<(A, usize)>> {
        let stream = dev.cuda_stream();
        let raw = search::raw::Raw::new(&stream, g, groups, data)?;
        match search::algorithm_search().0 {
            search::Search::Timed => {
                // SAFETY: scratch that the search writes before it reads; never read on the host.
                let ws = unsafe { dev.alloc::<u8>(SEARCH_WORKSPACE)? };
                let (workspace, _guard) = ws.device_ptr(&stream);
                let (a, b, out) = ptrs;
                let bufs = search::raw::Buffers { a, b, out, workspace, workspace_bytes: SEARCH_WORKSPACE };
                find(&raw, Some(&bufs))
            }
            search::Search::Heuristic => find(&raw, None),
            search::Search::Cudarc => Ok(None),
        }
    };
    if search::algorithm_search().0 == search::Search::Cudarc {
        return None;
    }
    let found = run().ok().flatten();
    if found.is_none() {
        SEARCH_FALLBACKS.fetch_add(1, Ordering::Relaxed);
    }
    found
}

fn run_t<T>(
    pass: Pass,
    (s1, l1): (&CudaStorage, &Layout),
    (s2, l2): (&CudaStorage, &Layout),
    g: &Geom,
    groups: usize,
) -> Result<CudaStorage>
where
    T: CudaDType + CudnnDataType + DeviceRepr + WithDType,
{
    let dev = s1.device().clone();
    let (x_len, w_len, y_len) = (g.n * g.c * g.h * g.w, g.o * (g.c / groups) * g.k * g.k, g.n * g.o * g.ho * g.wo);
    // (first input, second input, output) element counts of the pass.
    let (len1, len2, out_len) = match pass {
        Pass::Forward => (x_len, w_len, y_len),
        Pass::BackwardData => (y_len, w_len, x_len),
        Pass::BackwardFilter => (x_len, y_len, w_len),
    };
    for (l, want) in [(l1, len1), (l2, len2)] {
        if l.shape().elem_count() != want {
            bail!("cuDNN conv {pass:?}: an input has {} elements, expected {want}", l.shape().elem_count());
        }
    }
    let (a, b) = (view::<T>(s1, l1, pass)?, view::<T>(s2, l2, pass)?);
    // SAFETY: cuDNN writes every element of the output with beta = 0 before anything reads it.
    let mut out = unsafe { dev.alloc::<T>(out_len)? };
    let key =
        Key { device: dev.id(), pass, dtype: T::DTYPE, geom: [g.n, g.c, g.h, g.w, g.o, g.k, g.stride, g.pad, groups] };
    let scale = (T::from_f64(1.0), T::from_f64(0.0));
    let ptrs = {
        let stream = dev.cuda_stream();
        let (pa, _ga) = a.device_ptr(&stream);
        let (pb, _gb) = b.device_ptr(&stream);
        let (po, _go) = out.device_ptr(&stream);
        (pa, pb, po)
    };
    STATE.with(|cell| -> Result<()> {
        let mut st = cell.borrow_mut();
        let cudnn = st.handle(&dev)?;
        let d = descriptors::<T>(&cudnn, g, groups)?;
        match pass {
            Pass::Forward => {
                let op = ConvForward { conv: &d.conv, x: &d.x, w: &d.w, y: &d.y };
                let plan = st.plan(key, || {
                    if let Some((algo, workspace)) = searched(&dev, g, groups, T::DATA_TYPE, ptrs, search::raw::forward)
                    {
                        return Ok(Plan { algo: Algo::Forward(algo), workspace });
                    }
                    let algo = op.pick_algorithm().map_err(err("forward algorithm"))?;
                    let workspace = op.get_workspace_size(algo).map_err(err("forward workspace"))?;
                    Ok(Plan { algo: Algo::Forward(algo), workspace })
                })?;
                let Algo::Forward(algo) = plan.algo else { bail!("cuDNN conv: plan of the wrong pass") };
                let ws = st.workspace(&dev, plan.workspace)?;
                // SAFETY: the views and the output match the descriptors' dtype and NCHW shapes (checked by the
                // custom op against the geometry), and all of them live on the handle's stream.
                unsafe { op.launch(algo, ws, scale, &a, &b, &mut out) }.map_err(err("forward"))?;
            }
            Pass::BackwardData => {
                let op = ConvBackwardData { conv: &d.conv, dx: &d.x, w: &d.w, dy: &d.y };
                let plan = st.plan(key, || {
                    if let Some((algo, workspace)) =
                        searched(&dev, g, groups, T::DATA_TYPE, ptrs, search::raw::backward_data)
                    {
                        return Ok(Plan { algo: Algo::BackwardData(algo), workspace });
                    }
                    let algo = op.pick_algorithm().map_err(err("backward-data algorithm"))?;
                    let workspace = op.get_workspace_size(algo).map_err(err("backward-data workspace"))?;
                    Ok(Plan { algo: Algo::BackwardData(algo), workspace })
                })?;
                let Algo::BackwardData(algo) = plan.algo else { bail!("cuDNN conv: plan of the wrong pass") };
                let ws = st.workspace(&dev, plan.workspace)?;
                // SAFETY: as above; `a` is dy, `b` the filter.
                unsafe { op.launch(algo, ws, scale, &mut out, &b, &a) }.map_err(err("backward-data"))?;
            }
            Pass::BackwardFilter => {
                let op = ConvBackwardFilter { conv: &d.conv, x: &d.x, dw: &d.w, dy: &d.y };
                let plan = st.plan(key, || {
                    if let Some((algo, workspace)) =
                        searched(&dev, g, groups, T::DATA_TYPE, ptrs, search::raw::backward_filter)
                    {
                        return Ok(Plan { algo: Algo::BackwardFilter(algo), workspace });
                    }
                    let algo = op.pick_algorithm().map_err(err("backward-filter algorithm"))?;
                    let workspace = op.get_workspace_size(algo).map_err(err("backward-filter workspace"))?;
                    Ok(Plan { algo: Algo::BackwardFilter(algo), workspace })
                })?;
                let Algo::BackwardFilter(algo) = plan.algo else { bail!("cuDNN conv: plan of the wrong pass") };
                let ws = st.workspace(&dev, plan.workspace)?;
                // SAFETY: as above; `a` is x, `b` is dy.
                unsafe { op.launch(algo, ws, scale, &a, &mut out, &b) }.map_err(err("backward-filter"))?;
            }
        }
        Ok(())
    })?;
    Ok(CudaStorage::wrap_cuda_slice(out, dev))
}
