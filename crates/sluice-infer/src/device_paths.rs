//! The device paths a CUDA run may take beyond the ones a device run has verified. Code that has never passed on
//! a GPU is never what a plain `--device 0` executes: each path here is off until a device run passes it, and its
//! field's default then changes in the same commit as the figures in `docs/gpu-results.md`. The defaults are the
//! verified paths: the optimizer step as composed candle ops, cudarc's heuristic cuDNN algorithm pick, NMS on the
//! post-process workers after the device-side shrink, no CUDA-event timer, and the assigner's overlaps, the class
//! loss's sum and the max-pools' window search as composed candle ops. On the CPU none of them changes
//! what runs, except that [`DevicePaths::device_nms`] runs the kernels' host twin.

use serde::{Deserialize, Serialize};

/// How cuDNN picks a convolution's algorithm for a shape and pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CudnnSearch {
    /// cudarc's heuristic pick, the verified path.
    #[default]
    Cudarc,
    /// cuDNN's heuristics ranked by Sluice's own search (`cudnnGet*_v7`), deterministic algorithms only under
    /// `deterministic`.
    Heuristic,
    /// A timed search per shape and pass (`cudnnFind*Ex`), deterministic algorithms only under `deterministic`.
    Timed,
}

impl CudnnSearch {
    /// The kernels' setting for this choice.
    pub fn kernels(self) -> sluice_kernels::conv::search::Search {
        match self {
            Self::Cudarc => sluice_kernels::conv::search::Search::Cudarc,
            Self::Heuristic => sluice_kernels::conv::search::Search::Heuristic,
            Self::Timed => sluice_kernels::conv::search::Search::Timed,
        }
    }
}

/// The opt-in device paths of a run (config keys of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DevicePaths {
    /// The optimizer step on a GPU as four multi-tensor kernels (norm, clip, update, EMA) instead of the composed
    /// candle ops.
    pub fused_step: bool,
    /// How cuDNN picks its algorithms.
    pub cudnn_search: CudnnSearch,
    /// Validation and prediction run NMS where the predictions are (the batched kernels on a GPU, their host twin
    /// on the CPU) and copy only the kept rows, instead of NMS on the post-process workers.
    pub device_nms: bool,
    /// Validation measures the GPU's busy share with CUDA events on the compute stream.
    pub gpu_timer: bool,
    /// The loss's tensor assigner computes the CIoU of every (GT, prediction) pair in one kernel
    /// (`sluice_kernels::iou::ciou_pairs`) instead of composed candle ops: the same values, one launch.
    pub fused_ciou: bool,
    /// The loss sums its class term (BCE with logits against one-hot targets) in one kernel pass each way
    /// (`sluice_kernels::loss::bce_with_logits_sum_one_hot_kernel`) instead of composed candle ops.
    pub fused_bce: bool,
    /// SPPF's max-pools find each window's first maximum with one kernel (`sluice_kernels::pool::set_fused_pool`)
    /// instead of composed candle ops (training; the same positions, so the same values and gradients).
    pub fused_pool: bool,
}

impl DevicePaths {
    /// The names [`DevicePaths::enable`] takes, in order.
    pub const NAMES: [&'static str; 7] =
        ["fused_step", "cudnn_search", "device_nms", "gpu_timer", "fused_ciou", "fused_bce", "fused_pool"];

    /// These paths with the one called `name` turned on (`cudnn_search`: the timed search), or an error listing
    /// the names.
    pub fn enable(mut self, name: &str) -> std::result::Result<Self, String> {
        match name.trim() {
            "fused_step" => self.fused_step = true,
            "cudnn_search" => self.cudnn_search = CudnnSearch::Timed,
            "device_nms" => self.device_nms = true,
            "gpu_timer" => self.gpu_timer = true,
            "fused_ciou" => self.fused_ciou = true,
            "fused_bce" => self.fused_bce = true,
            "fused_pool" => self.fused_pool = true,
            other => return Err(format!("device path '{other}': expected one of {}", Self::NAMES.join(", "))),
        }
        Ok(self)
    }

    /// The paths turned on, by name (empty: every default is the verified path).
    pub fn enabled(&self) -> Vec<&'static str> {
        let on = [
            self.fused_step,
            self.cudnn_search != CudnnSearch::Cudarc,
            self.device_nms,
            self.gpu_timer,
            self.fused_ciou,
            self.fused_bce,
            self.fused_pool,
        ];
        Self::NAMES.iter().zip(on).filter(|(_, on)| *on).map(|(n, _)| *n).collect()
    }
}

/// A `--device-paths` value: a comma-separated list of [`DevicePaths::NAMES`], `none` for the verified defaults.
pub fn parse_device_paths(s: &str) -> std::result::Result<DevicePaths, String> {
    let s = s.trim();
    if s.is_empty() || s == "none" {
        return Ok(DevicePaths::default());
    }
    s.split(',').try_fold(DevicePaths::default(), DevicePaths::enable)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_the_verified_path() {
        let d = DevicePaths::default();
        assert!(!d.fused_step && !d.device_nms && !d.gpu_timer && !d.fused_ciou && !d.fused_bce && !d.fused_pool);
        assert_eq!(d.cudnn_search, CudnnSearch::Cudarc);
        assert!(d.enabled().is_empty());
    }

    #[test]
    fn a_list_turns_on_exactly_its_paths() {
        let d = parse_device_paths("fused_step, gpu_timer").unwrap();
        assert_eq!(d.enabled(), ["fused_step", "gpu_timer"]);
        let all = parse_device_paths(&DevicePaths::NAMES.join(",")).unwrap();
        assert_eq!(all.enabled(), DevicePaths::NAMES);
        assert_eq!(parse_device_paths("none").unwrap(), DevicePaths::default());
        let err = parse_device_paths("fused_step,fast").unwrap_err();
        assert!(err.contains("'fast'") && err.contains("gpu_timer"), "{err}");
    }
}
