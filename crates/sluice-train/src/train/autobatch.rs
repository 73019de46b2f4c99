//! `batch: -1`, Ultralytics' AutoBatch: on a GPU, the batch size that fills 60% of the device's memory, from the
//! memory of a few probe training steps (forward, dense loss, backward) at batch 1, 2, 4 and 8 on a throwaway copy
//! of the model, fitted with a straight line; on the CPU, Ultralytics' default of 16. The choice comes back with a
//! line saying how it was made (the trainer hands it to its observer) and is stored in the run's configuration (so
//! a resume keeps it).

use crate::error::{Context, Result};
use candle_core::{DType, Device, Tensor};
use sluice_model::{DenseTargets, DetectionLoss, Mode, Yolo};

use super::config::TrainConfig;

/// Ultralytics' AutoBatch memory fraction.
pub const FRACTION: f64 = 0.6;
/// The CPU's batch for `-1` (Ultralytics' default when CUDA is absent).
pub const CPU_BATCH: usize = 16;
/// Probe batch sizes.
const PROBES: [usize; 4] = [1, 2, 4, 8];

/// The batch size for `cfg` on `device` (see the module docs), and a line saying how it was chosen.
pub fn auto_batch(cfg: &TrainConfig, nc: usize, device: &Device) -> Result<(usize, String)> {
    let Some((_, total)) = sluice_transfer::device_memory(device) else {
        return Ok((CPU_BATCH, format!("AutoBatch: no CUDA device, using the default CPU batch size {CPU_BATCH}")));
    };
    let model = Yolo::new_seeded(cfg.arch()?.config(nc), DType::F32, device, cfg.seed)?;
    model.set_autocast(super::setup::amp_dtype(cfg, device))?;
    let loss = DetectionLoss::new(nc);
    let side = cfg.imgsz as usize;
    let mut points = Vec::new();
    for b in PROBES {
        let used = probe(&model, &loss, b, side, device).with_context(|| format!("AutoBatch probe at batch {b}"))?;
        points.push((b as f64, used as f64));
    }
    let chosen = fit(&points, FRACTION * total as f64);
    let line = format!(
        "AutoBatch: batch {chosen} for {:.0}% of {:.1} GiB (probes {})",
        FRACTION * 100.0,
        total as f64 / f64::from(1u32 << 30),
        points.iter().map(|(b, m)| format!("{b}: {:.2} GiB", m / f64::from(1u32 << 30))).collect::<Vec<_>>().join(", ")
    );
    Ok((chosen, line))
}

/// Device memory in use after one training step at batch `b`, its tensors still alive.
fn probe(model: &Yolo, loss: &DetectionLoss, b: usize, side: usize, device: &Device) -> Result<u64> {
    let x = Tensor::zeros((b, 3, side, side), DType::F32, device)?;
    let (raw, _) = model.forward_raw(&x, Mode::Train)?;
    let classes = Tensor::zeros((b, 1), DType::F32, device)?;
    let boxes = Tensor::zeros((b, 1, 4), DType::F32, device)?;
    let mask = Tensor::zeros((b, 1), DType::F32, device)?;
    // An end-to-end head (YOLO26) trains on the host loss, which takes the targets as rows (none here).
    let total = if raw.one2one.is_some() {
        loss.compute(&raw, &[])?.total
    } else {
        loss.compute_dense(&raw, DenseTargets { classes: &classes, boxes: &boxes, mask: &mask })?.total
    };
    let grads = total.backward()?;
    let used = sluice_transfer::device_memory(device).map_or(0, |(used, _)| used);
    drop(grads);
    Ok(used)
}

/// The batch size whose memory, on the least-squares line through `points` `(batch, bytes)`, is `target`, clamped
/// to 1..=1024; [`CPU_BATCH`] when the line does not grow.
pub fn fit(points: &[(f64, f64)], target: f64) -> usize {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + (x - mx) * (y - my), b + (x - mx).powi(2)));
    if n < 2.0 || sxx == 0.0 || sxy <= 0.0 {
        return CPU_BATCH;
    }
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    ((target - intercept) / slope).floor().clamp(1.0, 1024.0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_through_the_probes_gives_the_batch_for_the_target() {
        // 1 GiB fixed + 0.5 GiB per image: 60% of 10 GiB = 6 GiB → 10 images.
        let gib = f64::from(1u32 << 30);
        let pts: Vec<(f64, f64)> = [1.0, 2.0, 4.0, 8.0].iter().map(|&b| (b, (1.0 + 0.5 * b) * gib)).collect();
        assert_eq!(fit(&pts, 0.6 * 10.0 * gib), 10);
        // A tiny target clamps to 1, a flat line falls back to the default.
        assert_eq!(fit(&pts, 0.0), 1);
        assert_eq!(fit(&[(1.0, 5.0), (2.0, 5.0)], 100.0), CPU_BATCH);
    }

    #[test]
    fn the_cpu_gets_ultralytics_default() {
        let cfg = TrainConfig::default();
        assert_eq!(auto_batch(&cfg, 2, &Device::Cpu).expect("cpu").0, CPU_BATCH);
    }
}
