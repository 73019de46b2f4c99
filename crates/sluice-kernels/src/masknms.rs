//! Batched NMS by overlap bitmasks on a CUDA device (feature `cuda`): the kernels of `masknms/kernels.cu`, compiled
//! by NVRTC once per device and chained on the input's stream with no host read. `sluice_eval::masknms` holds the
//! algorithm's steps and their host twins, which the CPU tests hold to the CPU NMS and Ultralytics' fixture; its
//! `nms_tensor` calls `run` for a CUDA tensor with the parameters as plain values ([`Params`]).

/// Bits per mask word (the kernels' `u64` overlap rows).
pub const WORD: usize = 64;

/// The CUDA source (compiled by NVRTC at run time; `cargo xtask kernels` compiles it in CI).
pub const CUDA_SOURCE: &str = include_str!("masknms/kernels.cu");

/// Words per mask row for `n` candidates.
pub fn words(n: usize) -> usize {
    n.div_ceil(WORD)
}

/// One batched NMS of `B` images of `(4 + nc)` rows over `na` anchors, float32, as the kernels take it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Classes.
    pub nc: usize,
    /// Anchors.
    pub na: usize,
    /// `(B, 4 + nc, na)` (channels first) rather than `(B, na, 4 + nc)`.
    pub channels_first: bool,
    /// A class score is a candidate when `> conf_thres`.
    pub conf_thres: f32,
    /// A candidate is suppressed when its float32 IoU with a kept one, compared in float64, is `> iou_thres`.
    pub iou_thres: f64,
    /// At most this many candidates (the highest scores) go into suppression.
    pub max_nms: usize,
    /// At most this many rows are kept per image (at least 1).
    pub max_det: usize,
    /// Every class above `conf_thres` is a candidate, not only the anchor's first best one.
    pub multi_label: bool,
    /// Suppression compares boxes shifted by `class * max_wh` (Ultralytics' class offset), if set.
    pub class_offset: Option<f32>,
    /// Suppression only within a class (the exact per-class mode).
    pub per_class: bool,
    /// Whether to suppress at all (no: the top `max_det` candidates are kept).
    pub suppress: bool,
}

/// What the kernels leave on the input's device, for one copy to the host.
#[derive(Debug, Clone)]
pub struct Kept {
    /// `(B, max_det, 6)` f32: `x1, y1, x2, y2, score, class` of the kept rows in score order, zeros after the last.
    pub rows: candle_core::Tensor,
    /// `(B, max_det)` u32: the anchor of each kept row, zeros after the last.
    pub anchors: candle_core::Tensor,
    /// `(B,)` u32: kept rows per image.
    pub kept: candle_core::Tensor,
    /// `(B,)` u32: 1 where the image has a NaN or infinite box or score.
    pub non_finite: candle_core::Tensor,
}

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::run;
