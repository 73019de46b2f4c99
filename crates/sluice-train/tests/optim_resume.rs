//! Resume exactness: a tiny yolov8n run (batch 1 of 64×64 inputs, 2 classes, 1–2 random boxes per image) trained for k batches,
//! checkpointed, loaded into fresh objects and trained for m more batches gives the same losses, weights and
//! EMA, bit for bit, as an uninterrupted run of k + m batches; for SGD, AdamW and MuSGD, with the checkpoint taken
//! inside a gradient-accumulation window during warmup.
#![allow(clippy::unwrap_used)]

use candle_core::{DType, Device, Tensor};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, LoadMode, Mode, Scale, Yolo, YoloConfig};
use sluice_train::optim::{OptimSettings, Optimization, OptimizerKind, RunShape, read_user_metadata};

const NC: usize = 2;
const BATCH: usize = 1;
const NB: usize = 3; // batches per epoch

/// Deterministic pseudo-random numbers in [0, 1).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

fn batch(ni: usize) -> (Tensor, Vec<Target>) {
    let mut r = Lcg(1000 + ni as u64);
    let px: Vec<f32> = (0..BATCH * 3 * 64 * 64).map(|_| r.next()).collect();
    let x = Tensor::from_vec(px, (BATCH, 3, 64, 64), &Device::Cpu).unwrap();
    let mut targets = Vec::new();
    for image in 0..BATCH as u32 {
        for _ in 0..1 + (r.next() * 2.0) as usize {
            let (cx, cy) = (12.0 + 40.0 * r.next(), 12.0 + 40.0 * r.next());
            let (w, h) = (8.0 + 16.0 * r.next(), 8.0 + 16.0 * r.next());
            let bbox = BoxXyxy { x1: cx - w / 2.0, y1: cy - h / 2.0, x2: cx + w / 2.0, y2: cy + h / 2.0 };
            targets.push(Target { image, class: (r.next() * NC as f32) as u32 % NC as u32, bbox });
        }
    }
    (x, targets)
}

fn settings(kind: OptimizerKind) -> OptimSettings {
    // nbs 2 with batch 1: accumulate 2 after warmup; warmup 1 epoch = 3 iterations (accumulate 1 → 2).
    OptimSettings { optimizer: kind, lr0: 0.01, nbs: 2, warmup_epochs: 1.0, ..Default::default() }
}

fn shape() -> RunShape {
    RunShape { batch: BATCH, epochs: 3, batches_per_epoch: NB, train_images: BATCH * NB }
}

/// Trains batches `range` (global iterations) and returns the loss of each, as bits.
fn train(model: &Yolo, opt: &mut Optimization, range: std::ops::Range<usize>) -> Vec<u32> {
    let loss_fn = DetectionLoss::new(NC);
    let mut losses = Vec::new();
    for ni in range {
        let (x, t) = batch(ni);
        let (raw, _) = model.forward_raw(&x, Mode::Train).unwrap();
        let loss = loss_fn.compute(&raw, &t).unwrap();
        losses.push(loss.total.to_scalar::<f32>().unwrap().to_bits());
        let out = opt.batch(model, &loss.total, ni, ni / NB).unwrap();
        assert!(!out.skipped_nonfinite);
        if (ni + 1) % NB == 0 {
            opt.end_epoch(ni / NB).unwrap();
        }
    }
    losses
}

fn bits(model: &Yolo) -> Vec<(String, Vec<u32>)> {
    let sd = model.state_dict().unwrap();
    let mut v: Vec<(String, Vec<u32>)> = sd
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1::<f32>().unwrap().iter().map(|x| x.to_bits()).collect()))
        .collect();
    v.sort();
    v
}

fn resume_is_exact(kind: OptimizerKind, k: usize, m: usize) {
    let expect_pending = true;
    let cfg = YoloConfig::new(Scale::N, NC);
    let base = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();

    // Uninterrupted run.
    let a = base.try_clone().unwrap();
    let mut opt_a = Optimization::new(&a, &settings(kind), shape()).unwrap();
    let all = train(&a, &mut opt_a, 0..k + m);

    // k batches, checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("last.safetensors");
    let b = base.try_clone().unwrap();
    let mut opt_b = Optimization::new(&b, &settings(kind), shape()).unwrap();
    let first = train(&b, &mut opt_b, 0..k);
    assert_eq!(first, all[..k], "{kind}: the same run twice gives the same losses");
    let user = serde_json::json!({ "epoch": k / NB, "next_ni": k, "settings": settings(kind) });
    opt_b.save_state(&b, &path, &user).unwrap();
    drop((b, opt_b));
    let names: Vec<String> = candle_core::safetensors::load(&path, &Device::Cpu).unwrap().into_keys().collect();
    let pending = names.iter().filter(|n| n.starts_with("optim.grad.")).count();
    assert_eq!(pending > 0, expect_pending, "{kind}: checkpoint inside an accumulation window");
    let buffers = names.iter().filter(|n| n.starts_with("optim.state.")).count();
    assert!(buffers > 0, "{kind}: optimizer buffers saved");

    // Fresh objects (another random init), loaded from the checkpoint, m more batches.
    let meta = read_user_metadata(&path).unwrap();
    assert_eq!(meta, user);
    let restored: OptimSettings = serde_json::from_value(meta["settings"].clone()).unwrap();
    let mut c = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
    let mut opt_c = Optimization::new(&c, &restored, shape()).unwrap();
    assert_eq!(opt_c.load_state(&mut c, &path).unwrap(), user);
    let rest = train(&c, &mut opt_c, k..k + m);
    assert_eq!(rest, all[k..], "{kind}: losses after resume");
    assert_eq!(bits(&c), bits(&a), "{kind}: model weights after resume");
    assert_eq!(bits(opt_c.ema_model()), bits(opt_a.ema_model()), "{kind}: EMA after resume");
    assert_eq!(
        (opt_c.steps(), opt_c.ema().updates(), opt_c.lrs()),
        (opt_a.steps(), opt_a.ema().updates(), opt_a.lrs())
    );

    // The checkpoint's parts load as plain models.
    let mut ema = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
    ema.load_weights_prefixed(&path, "ema.", LoadMode::Strict).unwrap();
    let mut trained = Yolo::new(cfg, DType::F32, &Device::Cpu).unwrap();
    trained.load_weights_prefixed(&path, "model.", LoadMode::Strict).unwrap();
    assert!(ema.load_weights(&path, LoadMode::Strict).is_err(), "the whole file is not a plain weights file");
}

#[test]
fn sgd_resume_is_bit_exact() {
    // Warmup nw = 3 (accumulate 1, 1, 2), then 2: steps at ni 0, 1, 3, 5, … Saved after ni 4, whose gradient is
    // pending; the resumed batch ni 5 steps with it.
    resume_is_exact(OptimizerKind::Sgd, 5, 1);
}

#[test]
fn adamw_resume_is_bit_exact() {
    // Saved during warmup after ni 2, whose gradient is pending (accumulate 2 from ni 2 on).
    resume_is_exact(OptimizerKind::AdamW, 3, 1);
}

#[test]
fn musgd_resume_is_bit_exact() {
    // MuSGD's two momentum buffers per conv filter (`momentum_buffer`, `momentum_buffer_SGD`) and its eight groups'
    // learning rates travel through the checkpoint; saved after two steps and a pending gradient.
    resume_is_exact(OptimizerKind::MuSgd, 3, 2);
}
