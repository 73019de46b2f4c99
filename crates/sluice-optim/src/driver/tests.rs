//! The driver on a real yolov8n parameter set with small synthetic losses (no forward pass): schedule,
//! warmup, accumulation, clipping, skipping and the EMA.
#![allow(clippy::unwrap_used)]
use candle_core::Device;
use sluice_model::{Scale, YoloConfig};

use super::*;
use crate::schedule::interp;
use crate::settings::OptimizerKind;

const BIAS: &str = "model.22.cv3.0.2.bias"; // a head conv bias: group pg2, one per class

fn model() -> Yolo {
    Yolo::new(YoloConfig::new(Scale::N, 2), DType::F32, &Device::Cpu).unwrap()
}

fn read(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap()
}

/// Every variable's values, by name.
fn all(m: &Yolo) -> Vec<Vec<f64>> {
    let mut names: Vec<String> = m.varmap().data().lock().unwrap().keys().cloned().collect();
    names.sort();
    names.iter().map(|n| read(m.var(n).unwrap().as_tensor())).collect()
}

/// `sum(b · c)` for the head bias `b`: its gradient is `c`, whatever `b`.
fn linear_loss(model: &Yolo, c: &[f32]) -> Tensor {
    let b = model.var(BIAS).unwrap();
    let c = Tensor::new(c, &Device::Cpu).unwrap();
    (b.as_tensor() * c).unwrap().sum_all().unwrap()
}

fn sgd(warmup_epochs: f64) -> OptimSettings {
    OptimSettings { optimizer: OptimizerKind::Sgd, warmup_epochs, ..Default::default() }
}

#[test]
fn warmup_and_schedule_follow_ultralytics() {
    let m = model();
    // batch 16 → accumulate 4 after warmup; 10 epochs of 20 batches; warmup 3 epochs = 60 iterations.
    let shape = RunShape { batch: 16, epochs: 10, batches_per_epoch: 20, train_images: 320 };
    let mut opt = Optimization::new(&m, &sgd(3.0), shape).unwrap();
    assert_eq!(opt.schedule().nw, 60);
    assert_eq!(opt.lrs(), [0.01; 3]);
    let lf = |e: usize| (1.0 - e as f64 / 10.0).max(0.0) * (1.0 - 0.01) + 0.01;
    for epoch in 0..4 {
        for i in 0..20 {
            let ni = i + 20 * epoch;
            let out = opt.batch(&m, &linear_loss(&m, &[1e-3, -1e-3]), ni, epoch).unwrap();
            let target = 0.01 * lf(epoch);
            let (lr, bias_lr, mom, acc) = if ni <= 60 {
                let x = ni as f64;
                (
                    interp(x, 0.0, 60.0, 0.0, target),
                    interp(x, 0.0, 60.0, 0.1, target),
                    interp(x, 0.0, 60.0, 0.8, 0.937),
                    (interp(x, 0.0, 60.0, 1.0, 4.0).round_ties_even() as usize).max(1),
                )
            } else {
                // Ultralytics 8.4.190 warms up while `ni <= nw`: iteration nw set the momentum to `momentum`
                // exactly, and it stays there.
                (target, target, 0.937, 4)
            };
            assert_eq!(opt.lrs(), [lr, lr, bias_lr], "ni {ni}");
            assert_eq!(opt.momenta(), [mom; 3], "ni {ni}");
            assert_eq!(out.accumulate, acc, "ni {ni}");
        }
        assert_eq!(opt.end_epoch(epoch).unwrap(), opt.lrs());
    }
    // The first batch of the next epoch applies lf(4) (warmup is over).
    opt.batch(&m, &linear_loss(&m, &[1e-3, 0.0]), 80, 4).unwrap();
    assert_eq!(opt.lrs(), [0.01 * lf(4); 3]);
    // AdamW (auto) has no momentum to warm up.
    let mut adam = Optimization::new(&m, &OptimSettings::default(), shape).unwrap();
    adam.batch(&m, &linear_loss(&m, &[1e-3, 0.0]), 0, 0).unwrap();
    assert_eq!(adam.resolved().rule, Rule::AdamW);
    assert_eq!(adam.momenta(), [0.9; 3]);
    assert_eq!(adam.lrs(), [0.0; 3]); // warmup_bias_lr forced to 0 by auto
}

#[test]
fn device_checks_equal_the_host_path_and_mask_a_non_finite_step() {
    let shape = RunShape { batch: 32, epochs: 5, batches_per_epoch: 10, train_images: 320 };
    for (settings, fused) in [
        (sgd(0.0), false),
        (OptimSettings { optimizer: OptimizerKind::AdamW, ..Default::default() }, false),
        (sgd(0.0), true),
        (OptimSettings { optimizer: OptimizerKind::AdamW, ..Default::default() }, true),
        (OptimSettings { optimizer: OptimizerKind::Adam, ..Default::default() }, true),
    ] {
        let seeded = || Yolo::new_seeded(YoloConfig::new(Scale::N, 2), DType::F32, &Device::Cpu, 3).unwrap();
        let (host_m, dev_m) = (seeded(), seeded());
        let mut host = Optimization::new(&host_m, &settings, shape).unwrap();
        let path = if fused { StepPath::DeviceFused } else { StepPath::Device };
        let step = StepOptions { path, loss_scaling: None };
        let mut dev = Optimization::with_step(&dev_m, &settings, shape, step).unwrap();
        assert_eq!(dev.fused.is_some(), fused);
        // Large gradients (clipped) and small ones, over three optimizer steps.
        for (ni, c) in
            [[30.0f32, -40.0], [0.5, 1.0], [-2.0, 3.0], [0.1, 0.2], [50.0, 5.0], [1.0, -1.0]].iter().enumerate()
        {
            let a = host.batch_known_finite(&host_m, &linear_loss(&host_m, c), true, ni, 0).unwrap();
            let b = dev.batch_known_finite(&dev_m, &linear_loss(&dev_m, c), true, ni, 0).unwrap();
            assert_eq!(a.stepped, b.stepped, "ni {ni}");
        }
        // The composed device path is the host path bit for bit; the fused one sums the norm in another order,
        // so a clipped step may differ in the last bits of the clip factor.
        let same = |a: &[Vec<f64>], b: &[Vec<f64>], what: &str| {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                let d = x.iter().zip(y).map(|(p, q)| (p - q).abs() / p.abs().max(1e-3)).fold(0.0f64, f64::max);
                let tol = if fused { 1e-5 } else { 0.0 };
                assert!(d <= tol, "{:?} fused {fused}: {what} {i} differs by up to {d:e}", settings.optimizer);
            }
        };
        same(&all(&host_m), &all(&dev_m), "parameter");
        assert_eq!(
            host.ema_model().varmap().data().lock().unwrap().len(),
            dev.ema_model().varmap().data().lock().unwrap().len()
        );
        same(&all(host.ema_model()), &all(dev.ema_model()), "EMA variable");
        assert_ne!(all(&dev_m), all(&seeded()), "the steps changed the model");
        assert_eq!(dev.take_device_skips().unwrap(), 0);
        // A NaN gradient: the step is masked on the device, nothing changes, and the skip is counted.
        let before = (all(&dev_m), all(dev.ema_model()));
        let steps = dev.steps();
        for ni in 6..8 {
            dev.batch_known_finite(&dev_m, &linear_loss(&dev_m, &[f32::NAN, 1.0]), true, ni, 0).unwrap();
        }
        assert_eq!((all(&dev_m), all(dev.ema_model())), before);
        // Every step taken in that window (1 or 2, as the warmup's accumulation says) was masked and counted.
        let masked = dev.steps() - steps;
        assert!(masked >= 1);
        assert_eq!(dev.take_device_skips().unwrap(), masked);
        assert_eq!(dev.skipped(), masked);
    }
}

/// MuSGD with the fused step: its SGD parameters through the multi-tensor passes, its Muon parameters through
/// the composed update masked by the fused norm; against the composed device path over clipped and unclipped
/// steps and a non-finite one, every variable and the EMA.
#[test]
fn musgd_takes_the_fused_step_for_its_sgd_parameters() {
    let shape = RunShape { batch: 64, epochs: 5, batches_per_epoch: 10, train_images: 640 };
    let settings = OptimSettings { optimizer: OptimizerKind::MuSgd, warmup_epochs: 0.0, ..Default::default() };
    // A head bias (an SGD parameter) and a conv weight (a Muon one), both with gradients.
    const WEIGHT: &str = "model.22.cv2.0.0.conv.weight";
    let loss = |m: &Yolo, scale: f32| -> Tensor {
        let w = m.var(WEIGHT).unwrap();
        let c = Tensor::ones(w.dims(), DType::F32, &Device::Cpu).unwrap().affine(f64::from(scale), 0.0).unwrap();
        let lw = (w.as_tensor().sqr().unwrap() * c).unwrap().sum_all().unwrap();
        (linear_loss(m, &[scale, -2.0 * scale]) + lw).unwrap()
    };
    let seeded = || Yolo::new_seeded(YoloConfig::new(Scale::N, 2), DType::F32, &Device::Cpu, 4).unwrap();
    let (a_m, b_m) = (seeded(), seeded());
    let device = StepOptions { path: StepPath::Device, loss_scaling: None };
    let mut a = Optimization::with_step(&a_m, &settings, shape, device).unwrap();
    let fused = StepOptions { path: StepPath::DeviceFused, loss_scaling: None };
    let mut b = Optimization::with_step(&b_m, &settings, shape, fused).unwrap();
    assert_eq!(a.resolved().rule, Rule::MuSgd);
    assert!(b.fused.is_some());
    for (ni, scale) in [1.0f32, 300.0, 0.5, f32::NAN].into_iter().enumerate() {
        a.batch_known_finite(&a_m, &loss(&a_m, scale), true, ni, 0).unwrap();
        b.batch_known_finite(&b_m, &loss(&b_m, scale), true, ni, 0).unwrap();
    }
    for (x, y) in [(all(&a_m), all(&b_m)), (all(a.ema_model()), all(b.ema_model()))] {
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            let d = p.iter().zip(q).map(|(u, v)| (u - v).abs() / u.abs().max(1e-3)).fold(0.0f64, f64::max);
            assert!(d <= 1e-5, "variable {i} differs by up to {d:e}");
        }
    }
    assert_ne!(all(&b_m), all(&seeded()), "the steps changed the model");
    assert_eq!(a.take_device_skips().unwrap(), 1);
    assert_eq!(b.take_device_skips().unwrap(), 1);
}

/// Float16 loss scaling against PyTorch's `GradScaler` driving Ultralytics' optimizer step
/// (`tests/data/grad_scaler`): the scale, its growth tracker, which steps were skipped, the gradient norm, and the
/// parameter and its EMA after every step, on the host path and on the device path's tensor arithmetic (run here on the CPU).
#[test]
fn loss_scaling_matches_torch_grad_scaler() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../tests/data/grad_scaler/grad_scaler.json")).unwrap();
    let f32s = |v: &serde_json::Value| -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    };
    let init = f32s(&fixture["init"]);
    let steps = fixture["steps"].as_array().unwrap();
    // Batch 64: one batch per optimizer step; no warmup: lr 0.01 and momentum 0.937 from the first step.
    let shape = RunShape { batch: 64, epochs: 5, batches_per_epoch: steps.len(), train_images: 64 * steps.len() };
    let settings = ScalerSettings { growth_interval: 3, ..Default::default() };
    for (device_checks, fused) in [(false, false), (true, false), (true, true)] {
        let m = model();
        let b = m.var(BIAS).unwrap();
        b.set(&Tensor::new(init.as_slice(), &Device::Cpu).unwrap()).unwrap();
        let path = match (device_checks, fused) {
            (false, _) => StepPath::Host,
            (true, false) => StepPath::Device,
            (true, true) => StepPath::DeviceFused,
        };
        let step = StepOptions { path, loss_scaling: Some(settings) };
        let mut opt = Optimization::with_step(&m, &sgd(0.0), shape, step).unwrap();
        assert_eq!(opt.fused.is_some(), fused);
        let mut overflows = 0;
        for (ni, step) in steps.iter().enumerate() {
            let c = f32s(&step["c"]);
            let out = opt.batch_known_finite(&m, &linear_loss(&m, &c), true, ni, 0).unwrap();
            let found_inf = step["found_inf"].as_bool().unwrap();
            overflows += u64::from(found_inf);
            if !device_checks {
                assert_eq!((out.stepped, out.skipped_overflow), (!found_inf, found_inf), "step {ni}");
                assert!(!out.skipped_nonfinite);
                if let Some(norm) = step["grad_norm"].as_f64() {
                    assert!((out.grad_norm.unwrap() - norm).abs() <= 1e-5 * norm, "step {ni}: norm");
                }
            }
            let state = opt.loss_scale().unwrap().unwrap();
            assert_eq!(state.scale as f64, step["scale"].as_f64().unwrap(), "step {ni}: scale");
            assert_eq!(state.growth_tracker as u64, step["growth_tracker"].as_u64().unwrap(), "step {ni}");
            assert_eq!(state.overflows, overflows, "step {ni}");
            let ema = opt.ema_model().var(BIAS).unwrap();
            for (what, t) in [("p", b.as_tensor()), ("ema", ema.as_tensor())] {
                let (got, want) = (read(t), f32s(&step[what]));
                for (g, w) in got.iter().zip(&want) {
                    let tol = 1e-6 * w.abs().max(1.0) as f64;
                    assert!((g - *w as f64).abs() <= tol, "step {ni} {what}: {got:?} vs {want:?}");
                }
            }
        }
        // Overflow skips are the scaler's, not the non-finite guard's.
        assert_eq!(opt.take_device_skips().unwrap(), 0);
        assert_eq!(opt.skipped(), 0);
        // The scaler's state survives a checkpoint.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        opt.save_state(&m, &path, &serde_json::json!({})).unwrap();
        let mut m2 = model();
        let mut again = Optimization::with_step(&m2, &sgd(0.0), shape, step).unwrap();
        again.load_state(&mut m2, &path).unwrap();
        assert_eq!(again.loss_scale().unwrap(), opt.loss_scale().unwrap());
    }
}

#[test]
fn gradients_accumulate_until_the_step_and_the_ema_follows_steps() {
    let m = model();
    // No warmup; batch 32 → accumulate 2: steps at ni 1, 3, 5, …
    let shape = RunShape { batch: 32, epochs: 5, batches_per_epoch: 10, train_images: 320 };
    let mut opt = Optimization::new(&m, &sgd(0.0), shape).unwrap();
    assert_eq!(opt.accumulate(), 2);
    let b0 = read(m.var(BIAS).unwrap().as_tensor());
    let (c1, c2) = ([0.5f32, -1.0], [0.25f32, 2.0]);
    let o = opt.batch(&m, &linear_loss(&m, &c1), 0, 0).unwrap();
    assert!(!o.stepped && o.grad_norm.is_none());
    assert_eq!(read(m.var(BIAS).unwrap().as_tensor()), b0, "no update before the step");
    let o = opt.batch(&m, &linear_loss(&m, &c2), 1, 0).unwrap();
    assert!(o.stepped);
    // Summed gradient g = c1 + c2 = (0.75, 1.0): norm 1.25 < 10, no clipping. First Nesterov step:
    // buf = g, p −= lr·(g + momentum·buf).
    assert!((o.grad_norm.unwrap() - 1.25).abs() < 1e-6);
    let g = [0.75, 1.0];
    let b1 = read(m.var(BIAS).unwrap().as_tensor());
    for k in 0..2 {
        let want = b0[k] - 0.01 * (g[k] + 0.937 * g[k]);
        assert!((b1[k] - want).abs() < 1e-6, "{} vs {want}", b1[k]);
    }
    assert_eq!((opt.steps(), opt.ema().updates()), (1, 1));
    // The EMA moved towards the model by 1 − d(1).
    let d = 0.9999 * (1.0 - (-1.0f64 / 2000.0).exp());
    let e = read(opt.ema_model().var(BIAS).unwrap().as_tensor());
    for k in 0..2 {
        assert!((e[k] - (d * b0[k] + (1.0 - d) * b1[k])).abs() < 1e-6);
    }
    // A huge gradient is clipped to norm 10 before the step.
    let big = [3000f32, 4000.0];
    opt.batch(&m, &linear_loss(&m, &big), 2, 0).unwrap();
    let before = read(m.var(BIAS).unwrap().as_tensor());
    let o = opt.batch(&m, &linear_loss(&m, &big), 3, 0).unwrap();
    assert!((o.grad_norm.unwrap() - 10_000.0).abs() < 1e-2);
    let after = read(m.var(BIAS).unwrap().as_tensor());
    // Clipped g = (6, 8); buf = 0.937·(0.75, 1) + g; p −= lr·(g + 0.937·buf).
    for k in 0..2 {
        let gk = [6.0, 8.0][k];
        let buf = 0.937 * g[k] + gk;
        assert!((after[k] - (before[k] - 0.01 * (gk + 0.937 * buf))).abs() < 1e-5, "{k}");
    }
}

#[test]
fn non_finite_loss_or_gradient_skips_the_step() {
    let m = model();
    let shape = RunShape { batch: 32, epochs: 5, batches_per_epoch: 10, train_images: 320 };
    let mut opt = Optimization::new(&m, &sgd(0.0), shape).unwrap();
    let b0 = read(m.var(BIAS).unwrap().as_tensor());
    opt.batch(&m, &linear_loss(&m, &[1.0, 1.0]), 0, 0).unwrap();
    let o = opt.batch(&m, &linear_loss(&m, &[f32::NAN, 1.0]), 1, 0).unwrap();
    assert!(o.skipped_nonfinite && !o.stepped);
    assert_eq!(read(m.var(BIAS).unwrap().as_tensor()), b0);
    assert_eq!((opt.skipped(), opt.steps(), opt.ema().updates()), (1, 0, 0));
    // Finite loss, infinite gradient: d√b/db at b = 0.
    let b = m.var(BIAS).unwrap();
    b.set(&b.zeros_like().unwrap()).unwrap();
    let loss = b.as_tensor().sqrt().unwrap().sum_all().unwrap();
    opt.batch(&m, &loss, 2, 0).unwrap();
    let loss = b.as_tensor().sqrt().unwrap().sum_all().unwrap();
    let o = opt.batch(&m, &loss, 3, 0).unwrap();
    assert!(o.skipped_nonfinite && !o.stepped && !o.grad_norm.unwrap().is_finite());
    assert_eq!(read(b.as_tensor()), vec![0.0, 0.0]);
    assert_eq!((opt.skipped(), opt.steps()), (2, 0));
    // The window restarts after the skipped batch: the next step is at ni 5, with only ni 4–5's gradients.
    assert!(!opt.batch(&m, &linear_loss(&m, &[1.0, 0.0]), 4, 0).unwrap().stepped);
    let o = opt.batch(&m, &linear_loss(&m, &[1.0, 0.0]), 5, 0).unwrap();
    assert!(o.stepped && (o.grad_norm.unwrap() - 2.0).abs() < 1e-6);
}

#[test]
fn caller_mistakes_are_errors() {
    let m = model();
    let shape = RunShape { batch: 32, epochs: 5, batches_per_epoch: 10, train_images: 320 };
    let mut opt = Optimization::new(&m, &sgd(0.0), shape).unwrap();
    opt.batch(&m, &linear_loss(&m, &[1.0, 1.0]), 3, 0).unwrap();
    let e = opt.batch(&m, &linear_loss(&m, &[1.0, 1.0]), 3, 0).unwrap_err().to_string();
    assert!(e.contains("iteration 3 after iteration 3"), "{e}");
    let other = model();
    assert!(
        opt.batch(&other, &linear_loss(&other, &[1.0, 1.0]), 4, 0).unwrap_err().to_string().contains("another model")
    );
    let vector = m.var(BIAS).unwrap().as_tensor().clone();
    assert!(opt.batch(&m, &vector, 5, 0).unwrap_err().to_string().contains("scalar"));
    let constant = Tensor::new(1f32, &Device::Cpu).unwrap();
    assert!(opt.batch(&m, &constant, 6, 0).unwrap_err().to_string().contains("does not depend"));
}

/// `Σ_v sum(c_v · v²)` over every trainable parameter: each has a gradient (`2 c_v v`) that changes with it.
fn quadratic_loss(model: &Yolo, scale: f32, seed: u64) -> Tensor {
    let mut total: Option<Tensor> = None;
    for (i, (_, v)) in model.trainable_vars().into_iter().enumerate() {
        let n = v.elem_count();
        let c: Vec<f32> = (0..n)
            .map(|j| {
                let h = (seed ^ ((i as u64) << 32) ^ j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                scale * (h as f32 / (1u64 << 24) as f32 - 0.5)
            })
            .collect();
        let c = Tensor::from_vec(c, v.shape(), &Device::Cpu).unwrap();
        let term = (v.as_tensor().sqr().unwrap() * c).unwrap().sum_all().unwrap();
        total = Some(match total {
            None => term,
            Some(t) => (t + term).unwrap(),
        });
    }
    total.unwrap()
}

/// The trainer's packed model: each element-wise group updated as one flat tensor over its buffer, against the
/// per-parameter update of an unpacked model on the host path. Bit for bit on the host path and on unclipped
/// device steps; a clipped device step differs only by the norm's summation order. Every parameter, optimizer
/// state and EMA variable, for every rule, and a checkpoint of the packed run resumed into an unpacked one.
#[test]
fn packed_groups_update_as_the_per_parameter_step() {
    let shape = RunShape { batch: 64, epochs: 5, batches_per_epoch: 10, train_images: 640 };
    let states = |o: &Optimization| -> Vec<Vec<f64>> {
        o.optimizer
            .state()
            .iter()
            .flat_map(|s| [&s.momentum_buffer, &s.momentum_buffer_sgd, &s.exp_avg, &s.exp_avg_sq])
            .map(|t| t.as_ref().map(read).unwrap_or_default())
            .collect()
    };
    // Relative to each tensor's largest value: a momentum where `β·buf` and the gradient nearly cancel keeps the
    // clip factor's rounding as an absolute, not a relative, difference.
    let differ = |a: &[Vec<f64>], b: &[Vec<f64>]| -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                let scale = x.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
                x.iter().zip(y).map(|(p, q)| (p - q).abs() / scale).fold(0.0, f64::max)
            })
            .fold(0.0, f64::max)
    };
    for kind in [OptimizerKind::Sgd, OptimizerKind::AdamW, OptimizerKind::Adam, OptimizerKind::MuSgd] {
        let settings = OptimSettings { optimizer: kind, warmup_epochs: 0.0, ..Default::default() };
        let seeded = || Yolo::new_seeded(YoloConfig::new(Scale::N, 2), DType::F32, &Device::Cpu, 5).unwrap();
        // MuSGD: its two Muon groups update per matrix, and every decayed weight is a Muon matrix.
        let groups = if kind == OptimizerKind::MuSgd { 4 } else { 3 };
        let plain_m = seeded();
        let mut plain = Optimization::new(&plain_m, &settings, shape).unwrap();
        assert_eq!(plain.optimizer.buffers_in_use(), 0);
        let runs: Vec<(Yolo, Optimization)> = [StepPath::Host, StepPath::Device]
            .into_iter()
            .map(|path| {
                let m = Optimization::pack_model(seeded(), &settings, shape).unwrap();
                assert_eq!(m.param_packs().len(), groups, "{kind:?}");
                let o =
                    Optimization::with_step(&m, &settings, shape, StepOptions { path, loss_scaling: None }).unwrap();
                assert_eq!(o.optimizer.buffers_in_use(), groups, "{kind:?}");
                (m, o)
            })
            .collect();
        let mut runs = runs;
        assert!(all(&runs[0].0) == all(&plain_m), "packing changes no value");
        // Unclipped steps (the norm stays under 10), then a clipped one.
        for (ni, scale) in [0.02f32, 0.01, 0.03, 20.0].into_iter().enumerate() {
            plain.batch_known_finite(&plain_m, &quadratic_loss(&plain_m, scale, ni as u64), true, ni, 0).unwrap();
            for (m, o) in runs.iter_mut() {
                o.batch_known_finite(m, &quadratic_loss(m, scale, ni as u64), true, ni, 0).unwrap();
            }
            let (host, dev) = (&runs[0], &runs[1]);
            assert!(all(&host.0) == all(&plain_m), "{kind:?} step {ni}: packed host parameters");
            assert!(states(&host.1) == states(&plain), "{kind:?} step {ni}: packed host optimizer state");
            assert!(all(host.1.ema_model()) == all(plain.ema_model()), "{kind:?} step {ni}: packed host EMA");
            // On the CPU a flat group's sum of squares is one sequential float32 sum over about a million values,
            // whose rounding reaches about 1e-5 of the clip factor (the per-tensor sums are a tenth as long).
            let tol = if scale > 1.0 { 1e-4 } else { 0.0 };
            for (what, d) in [
                ("parameters", differ(&all(&dev.0), &all(&plain_m))),
                ("optimizer state", differ(&states(&dev.1), &states(&plain))),
                ("EMA", differ(&all(dev.1.ema_model()), &all(plain.ema_model()))),
            ] {
                assert!(d <= tol, "{kind:?} step {ni}: packed device {what} differ by up to {d:e}");
            }
        }
        assert!(all(&plain_m) != all(&seeded()), "the steps changed the model");
        // The packed run's checkpoint resumes an unpacked run exactly, and the packed run goes on from it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        let (host_m, host) = &mut runs[0];
        host.save_state(host_m, &path, &serde_json::json!({})).unwrap();
        let mut back_m = seeded();
        let mut back = Optimization::new(&back_m, &settings, shape).unwrap();
        back.load_state(&mut back_m, &path).unwrap();
        let ni = 4;
        back.batch_known_finite(&back_m, &quadratic_loss(&back_m, 0.02, 9), true, ni, 0).unwrap();
        host.batch_known_finite(host_m, &quadratic_loss(host_m, 0.02, 9), true, ni, 0).unwrap();
        assert!(all(host_m) == all(&back_m), "{kind:?}: resumed parameters");
        assert!(states(host) == states(&back), "{kind:?}: resumed optimizer state");
    }
}
