//! Timing of the model's three hot paths on one device (`sluice model bench`): eval forward, fused forward and a
//! training step (train-mode forward + loss + backward + optimizer update), as medians after warm-up. The update
//! is candle-nn's AdamW in [`bench_model`]; [`bench_model_with`] takes the caller's (`sluice bench model` passes
//! the trainer's SGD with Nesterov momentum, the update the PyTorch peer script times).

use std::time::Instant;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::Optimizer;
use sluice_core::{BoxXyxy, Target};
use sluice_kernels::threads::on_compute_pool;

use crate::config::YoloConfig;
use crate::error::Result;
use crate::layers::Mode;
use crate::loss::DetectionLoss;
use crate::model::Yolo;

/// What to time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchOptions {
    /// Architecture.
    pub config: YoloConfig,
    /// Square input side (multiple of 32).
    pub imgsz: usize,
    /// Images per batch.
    pub batch: usize,
    /// Untimed runs first.
    pub warmup: usize,
    /// Timed runs (the median is reported).
    pub iters: usize,
}

/// Medians in milliseconds, and the memory the runs peaked at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BenchReport {
    /// Eval-mode forward including the decode.
    pub eval_forward_ms: f64,
    /// The same with Conv+BN folded.
    pub fused_forward_ms: f64,
    /// Train-mode forward + loss + backward + optimizer step.
    pub train_step_ms: f64,
    /// The most bytes the convs' im2col/col2im workspaces held at once, all threads together (they are reused across
    /// layers and steps, so this is the largest layer's need, not a sum over layers).
    pub peak_conv_workspace_bytes: usize,
    /// The process's peak resident memory after the runs (`VmHWM` of `/proc/self/status`; `None` elsewhere).
    pub peak_rss_bytes: Option<u64>,
}

/// The process's resident-memory high-water mark, from Linux's `/proc/self/status`.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

fn sync(device: &Device, t: &Tensor) -> Result<()> {
    // Reading one value forces the queued work to finish on any backend.
    let _ = t.flatten_all()?.narrow(0, 0, 1)?.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    device.synchronize()?;
    Ok(())
}

fn median_ms<E>(opts: &BenchOptions, mut f: impl FnMut() -> std::result::Result<(), E>) -> std::result::Result<f64, E> {
    for _ in 0..opts.warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(opts.iters.max(1));
    for _ in 0..opts.iters.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Times a freshly initialised model on random input with a fixed synthetic target table (two boxes per image),
/// updating it with candle-nn's AdamW (lr 1e-4).
pub fn bench_model(opts: &BenchOptions, device: &Device) -> Result<BenchReport> {
    bench_model_with(opts, device, |model| {
        let vars = model.trainable_vars().into_iter().map(|(_, v)| v).collect();
        let mut opt = candle_nn::AdamW::new(vars, candle_nn::ParamsAdamW { lr: 1e-4, ..Default::default() })?;
        Ok(move |grads: &GradStore| Ok(opt.step(grads)?))
    })
}

/// [`bench_model`] with the optimizer update that `make_update` builds for the model: the training step is
/// forward + loss + backward + `update(&grads)`.
pub fn bench_model_with<E, U>(
    opts: &BenchOptions,
    device: &Device,
    make_update: impl FnOnce(&Yolo) -> std::result::Result<U, E>,
) -> std::result::Result<BenchReport, E>
where
    E: From<crate::error::ModelError> + Send,
    U: FnMut(&GradStore) -> std::result::Result<(), E> + Send,
{
    let model_err = |e: candle_core::Error| E::from(e.into());
    let model = Yolo::new(opts.config, DType::F32, device).map_err(E::from)?;
    let fused = model.fuse().map_err(E::from)?;
    let x = Tensor::rand(0f32, 1.0, (opts.batch, 3, opts.imgsz, opts.imgsz), device).map_err(model_err)?;
    let s = opts.imgsz as f32;
    let targets: Vec<Target> = (0..opts.batch as u32)
        .flat_map(|image| {
            [
                Target { image, class: 0, bbox: BoxXyxy::new(0.1 * s, 0.2 * s, 0.5 * s, 0.7 * s) },
                Target { image, class: 1, bbox: BoxXyxy::new(0.55 * s, 0.05 * s, 0.9 * s, 0.4 * s) },
            ]
        })
        .collect();
    // Each timed run on a worker of the compute pool, as the trainer, validator and predictor run them.
    let eval_forward_ms =
        median_ms(opts, || on_compute_pool(device, || sync(device, &model.forward(&x)?.y))).map_err(E::from)?;
    let fused_forward_ms =
        median_ms(opts, || on_compute_pool(device, || sync(device, &fused.forward(&x)?.y))).map_err(E::from)?;
    let loss = DetectionLoss::new(opts.config.nc);
    let mut update = make_update(&model)?;
    let train_step_ms = median_ms(opts, || {
        on_compute_pool(device, || {
            let (raw, _) = model.forward_raw(&x, Mode::Train).map_err(E::from)?;
            let out = loss.compute(&raw, &targets).map_err(E::from)?;
            update(&out.total.backward().map_err(model_err)?)?;
            sync(device, &out.total).map_err(E::from)
        })
    })?;
    Ok(BenchReport {
        eval_forward_ms,
        fused_forward_ms,
        train_step_ms,
        peak_conv_workspace_bytes: sluice_kernels::conv::peak_workspace_bytes(),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Scale;

    #[test]
    fn bench_runs_every_path_and_reports_positive_medians() {
        let opts = BenchOptions { config: YoloConfig::new(Scale::N, 2), imgsz: 64, batch: 1, warmup: 0, iters: 1 };
        let r = bench_model(&opts, &Device::Cpu).unwrap();
        for v in [r.eval_forward_ms, r.fused_forward_ms, r.train_step_ms] {
            assert!(v.is_finite() && v > 0.0, "{r:?}");
        }
        assert!(r.peak_conv_workspace_bytes > 0, "the 3x3 convs use the im2col workspace: {r:?}");
        if cfg!(target_os = "linux") {
            assert!(r.peak_rss_bytes.is_some_and(|b| b > 1 << 20), "{r:?}");
        }
    }
}
