//! How cuDNN's algorithm is chosen for each `(shape, pass)` (feature `cudnn`; the settings exist in every build).
//!
//! - **Cudarc** (the default): cudarc's own heuristic pick, the choice a device run has verified.
//! - **Timed** (PyTorch's `cudnn.benchmark`): `cudnnFindConvolution*AlgorithmEx` runs every algorithm on the call's
//!   own tensors once and reports their times; the fastest that fits is kept. The search blocks on the device, once
//!   per shape and pass (a few per training size; multi-scale training adds one set per batch side).
//! - **Heuristic**: `cudnnGetConvolution*Algorithm_v7`'s ranking, no device work.
//!
//! For the last two, with `deterministic` (Ultralytics' `deterministic=True`, its default, which sets PyTorch's
//! `cudnn.deterministic`) only algorithms cuDNN marks deterministic are taken, those of the descriptor's math type
//! first (the launch runs with it). If the search fails the caller falls back to cudarc's heuristic pick.
//!
//! cudarc keeps its descriptors' handles private, so the search builds its own raw handle and descriptors (the same
//! geometry and types as `cudnn.rs`'s) on the device's compute stream.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// How the algorithm is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// cudarc's heuristic pick, with no search of Sluice's own.
    Cudarc,
    /// Time every algorithm once per shape and pass (`cudnnFind*`).
    Timed,
    /// cuDNN's heuristics (`cudnnGet*_v7`).
    Heuristic,
}

static SEARCH: AtomicU8 = AtomicU8::new(0);
static DETERMINISTIC: AtomicBool = AtomicBool::new(true);

/// Sets how later shapes choose their algorithm (shapes already chosen keep theirs).
pub fn set_algorithm_search(search: Search, deterministic: bool) {
    let code = match search {
        Search::Cudarc => 0,
        Search::Timed => 1,
        Search::Heuristic => 2,
    };
    SEARCH.store(code, Ordering::Relaxed);
    DETERMINISTIC.store(deterministic, Ordering::Relaxed);
}

/// The settings in force: `(search, deterministic)`.
pub fn algorithm_search() -> (Search, bool) {
    let s = match SEARCH.load(Ordering::Relaxed) {
        1 => Search::Timed,
        2 => Search::Heuristic,
        _ => Search::Cudarc,
    };
    (s, DETERMINISTIC.load(Ordering::Relaxed))
}

#[cfg(feature = "cudnn")]
pub(super) mod raw {
    use std::ffi::c_void;

    use candle_core::cuda_backend::cudarc::cudnn::sys;
    use candle_core::cuda_backend::cudarc::driver::CudaStream;
    use candle_core::{Result, bail};

    use super::super::kernels::Geom;
    use super::{Search, algorithm_search};

    fn ok(s: sys::cudnnStatus_t, what: &str) -> Result<()> {
        if s == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
            Ok(())
        } else {
            bail!("cuDNN algorithm search, {what}: {s:?}")
        }
    }

    /// A handle and the four descriptors of one convolution, destroyed on drop.
    pub(in super::super) struct Raw {
        handle: sys::cudnnHandle_t,
        x: sys::cudnnTensorDescriptor_t,
        w: sys::cudnnFilterDescriptor_t,
        y: sys::cudnnTensorDescriptor_t,
        conv: sys::cudnnConvolutionDescriptor_t,
        math: sys::cudnnMathType_t,
    }

    impl Drop for Raw {
        fn drop(&mut self) {
            // SAFETY: each was created by `Raw::new` and is destroyed once; a null one was never created.
            unsafe {
                if !self.conv.is_null() {
                    let _ = sys::cudnnDestroyConvolutionDescriptor(self.conv);
                }
                if !self.y.is_null() {
                    let _ = sys::cudnnDestroyTensorDescriptor(self.y);
                }
                if !self.w.is_null() {
                    let _ = sys::cudnnDestroyFilterDescriptor(self.w);
                }
                if !self.x.is_null() {
                    let _ = sys::cudnnDestroyTensorDescriptor(self.x);
                }
                if !self.handle.is_null() {
                    let _ = sys::cudnnDestroy(self.handle);
                }
            }
        }
    }

    /// The device pointers of one pass's tensors (inputs first, the output last) and a scratch workspace, for the
    /// timed search.
    pub(in super::super) struct Buffers {
        pub(in super::super) a: u64,
        pub(in super::super) b: u64,
        pub(in super::super) out: u64,
        pub(in super::super) workspace: u64,
        pub(in super::super) workspace_bytes: usize,
    }

    impl Raw {
        /// The descriptors of `g` with `groups` groups in `data` (compute in f32; tensor-op math for half types, as
        /// `cudnn.rs` sets), on `stream`.
        pub(in super::super) fn new(
            stream: &CudaStream,
            g: &Geom,
            groups: usize,
            data: sys::cudnnDataType_t,
        ) -> Result<Self> {
            let i = |v: usize| i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{v} overflows i32")));
            let math = if data == sys::cudnnDataType_t::CUDNN_DATA_FLOAT {
                sys::cudnnMathType_t::CUDNN_DEFAULT_MATH
            } else {
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            };
            let mut r = Raw {
                handle: std::ptr::null_mut(),
                x: std::ptr::null_mut(),
                w: std::ptr::null_mut(),
                y: std::ptr::null_mut(),
                conv: std::ptr::null_mut(),
                math,
            };
            let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
            // SAFETY: every call gets valid out-pointers or descriptors created just before; failures leave the
            // fields null or valid, and `Drop` destroys what exists.
            unsafe {
                ok(sys::cudnnCreate(&mut r.handle), "handle")?;
                ok(sys::cudnnSetStream(r.handle, stream.cu_stream() as sys::cudaStream_t), "stream")?;
                ok(sys::cudnnCreateTensorDescriptor(&mut r.x), "input descriptor")?;
                ok(sys::cudnnSetTensor4dDescriptor(r.x, nchw, data, i(g.n)?, i(g.c)?, i(g.h)?, i(g.w)?), "input")?;
                ok(sys::cudnnCreateFilterDescriptor(&mut r.w), "filter descriptor")?;
                ok(
                    sys::cudnnSetFilter4dDescriptor(r.w, data, nchw, i(g.o)?, i(g.c / groups)?, i(g.k)?, i(g.k)?),
                    "filter",
                )?;
                ok(sys::cudnnCreateTensorDescriptor(&mut r.y), "output descriptor")?;
                ok(sys::cudnnSetTensor4dDescriptor(r.y, nchw, data, i(g.n)?, i(g.o)?, i(g.ho)?, i(g.wo)?), "output")?;
                ok(sys::cudnnCreateConvolutionDescriptor(&mut r.conv), "convolution descriptor")?;
                let (p, s) = (i(g.pad)?, i(g.stride)?);
                let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
                let compute = sys::cudnnDataType_t::CUDNN_DATA_FLOAT;
                ok(sys::cudnnSetConvolution2dDescriptor(r.conv, p, p, s, s, 1, 1, mode, compute), "convolution")?;
                ok(sys::cudnnSetConvolutionMathType(r.conv, math), "math type")?;
                if groups > 1 {
                    ok(sys::cudnnSetConvolutionGroupCount(r.conv, i(groups)?), "group count")?;
                }
            }
            Ok(r)
        }
    }

    /// The first usable algorithm of a ranked list: succeeded, within the workspace (when one was given),
    /// deterministic when asked; one of the descriptor's math type first (the launch runs with it), else any.
    macro_rules! pick {
        ($perf:expr, $n:expr, $raw:expr, $bufs:expr, $det:expr, $ty:ty) => {{
            let ranked: &[$ty] = &$perf[..$n.clamp(0, $perf.len() as i32) as usize];
            let usable = |p: &&$ty| {
                p.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
                    && $bufs.is_none_or(|b: &Buffers| p.memory <= b.workspace_bytes)
                    && (!$det || p.determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC)
            };
            ranked
                .iter()
                .filter(usable)
                .find(|p| p.mathType == $raw.math)
                .or_else(|| ranked.iter().find(usable))
                .map(|p| (p.algo, p.memory))
        }};
    }

    /// The forward algorithm and its workspace bytes; `bufs` for the timed search (`None`: heuristics).
    pub(in super::super) fn forward(
        raw: &Raw,
        bufs: Option<&Buffers>,
    ) -> Result<Option<(sys::cudnnConvolutionFwdAlgo_t, usize)>> {
        const N: usize = sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT as usize;
        // SAFETY: a zeroed perf struct is plain data (enums at their 0 variant) that cuDNN overwrites.
        let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        let (search, det) = algorithm_search();
        // SAFETY: the descriptors are live; the buffers hold the tensors the descriptors describe on the handle's
        // stream, and the workspace has `workspace_bytes`; `perf` has room for N results.
        unsafe {
            match (search, bufs) {
                (Search::Timed, Some(b)) => ok(
                    sys::cudnnFindConvolutionForwardAlgorithmEx(
                        raw.handle,
                        raw.x,
                        b.a as *const c_void,
                        raw.w,
                        b.b as *const c_void,
                        raw.conv,
                        raw.y,
                        b.out as *mut c_void,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                        b.workspace as *mut c_void,
                        b.workspace_bytes,
                    ),
                    "timing the forward algorithms",
                )?,
                _ => ok(
                    sys::cudnnGetConvolutionForwardAlgorithm_v7(
                        raw.handle,
                        raw.x,
                        raw.w,
                        raw.conv,
                        raw.y,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                    ),
                    "ranking the forward algorithms",
                )?,
            }
        }
        let bufs = bufs.filter(|_| search == Search::Timed);
        Ok(pick!(perf, n, raw, bufs, det, sys::cudnnConvolutionFwdAlgoPerf_t))
    }

    /// The backward-data algorithm (`a` is dy, `b` the filter, `out` dx).
    pub(in super::super) fn backward_data(
        raw: &Raw,
        bufs: Option<&Buffers>,
    ) -> Result<Option<(sys::cudnnConvolutionBwdDataAlgo_t, usize)>> {
        const N: usize = sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT as usize;
        // SAFETY: as in `forward`.
        let mut perf: [sys::cudnnConvolutionBwdDataAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        let (search, det) = algorithm_search();
        // SAFETY: as in `forward`.
        unsafe {
            match (search, bufs) {
                (Search::Timed, Some(b)) => ok(
                    sys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                        raw.handle,
                        raw.w,
                        b.b as *const c_void,
                        raw.y,
                        b.a as *const c_void,
                        raw.conv,
                        raw.x,
                        b.out as *mut c_void,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                        b.workspace as *mut c_void,
                        b.workspace_bytes,
                    ),
                    "timing the backward-data algorithms",
                )?,
                _ => ok(
                    sys::cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        raw.handle,
                        raw.w,
                        raw.y,
                        raw.conv,
                        raw.x,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                    ),
                    "ranking the backward-data algorithms",
                )?,
            }
        }
        let bufs = bufs.filter(|_| search == Search::Timed);
        Ok(pick!(perf, n, raw, bufs, det, sys::cudnnConvolutionBwdDataAlgoPerf_t))
    }

    /// The backward-filter algorithm (`a` is x, `b` dy, `out` dw).
    pub(in super::super) fn backward_filter(
        raw: &Raw,
        bufs: Option<&Buffers>,
    ) -> Result<Option<(sys::cudnnConvolutionBwdFilterAlgo_t, usize)>> {
        const N: usize = sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT as usize;
        // SAFETY: as in `forward`.
        let mut perf: [sys::cudnnConvolutionBwdFilterAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
        let mut n = 0;
        let (search, det) = algorithm_search();
        // SAFETY: as in `forward`.
        unsafe {
            match (search, bufs) {
                (Search::Timed, Some(b)) => ok(
                    sys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        raw.handle,
                        raw.x,
                        b.a as *const c_void,
                        raw.y,
                        b.b as *const c_void,
                        raw.conv,
                        raw.w,
                        b.out as *mut c_void,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                        b.workspace as *mut c_void,
                        b.workspace_bytes,
                    ),
                    "timing the backward-filter algorithms",
                )?,
                _ => ok(
                    sys::cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        raw.handle,
                        raw.x,
                        raw.y,
                        raw.conv,
                        raw.w,
                        N as i32,
                        &mut n,
                        perf.as_mut_ptr(),
                    ),
                    "ranking the backward-filter algorithms",
                )?,
            }
        }
        let bufs = bufs.filter(|_| search == Search::Timed);
        Ok(pick!(perf, n, raw, bufs, det, sys::cudnnConvolutionBwdFilterAlgoPerf_t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip() {
        let before = algorithm_search();
        assert_eq!(before, (Search::Cudarc, true), "the defaults: cudarc's pick, deterministic (Ultralytics')");
        set_algorithm_search(Search::Heuristic, false);
        assert_eq!(algorithm_search(), (Search::Heuristic, false));
        set_algorithm_search(Search::Timed, true);
        assert_eq!(algorithm_search(), (Search::Timed, true));
        set_algorithm_search(before.0, before.1);
        assert_eq!(algorithm_search(), before);
    }
}
