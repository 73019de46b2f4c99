//! Data-parallel training across two real processes under `mpirun` (feature `mpi`): the all-reduced gradient
//! against one process's DDP combination of the same halves, and bit-equal replicas after optimizer steps. The
//! ranks are this test binary run again as the helper [`dist_rank`]: the gradient that the ranks' all-reduce gives
//! equals what one process computes from the same two halves combined as Ultralytics' DDP combines them, and the
//! replicas' weights stay bit-equal over optimizer steps. Rank 0 prints `ok NAME …` or `FAIL NAME: …` per check.
#![cfg(feature = "mpi")]

use candle_core::{DType, Device, Tensor};
use sluice_core::{BoxXyxy, Target};
use sluice_model::{DetectionLoss, Mode, Scale, Yolo, YoloConfig};
use sluice_train::dist::{Dist, all_vars};
use sluice_train::optim::{OptimSettings, Optimization, OptimizerKind, ParamGroups, RunShape};

#[test]
fn two_ranks_sum_gradients_as_ddp_and_stay_bit_equal() {
    let (exe, args) = sluice_testkit::helper::program("dist_rank");
    let (k, v) = sluice_testkit::helper::env("dist_rank");
    let lookup = sluice_dist::mpirun::MpirunLookup::from_vars(|k| std::env::var_os(k));
    let out = sluice_dist::mpirun::mpirun_command(&lookup, 2, exe, &args)
        .expect("mpirun")
        .env(k, v)
        .env("CANDLE_NUM_THREADS", "1")
        .output()
        .expect("running mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for check in ["ddp_gradient", "reduction_changes_the_gradient", "weights_bit_equal", "weights_moved"] {
        assert!(stdout.lines().any(|l| l.starts_with(&format!("ok {check}"))), "{check}\n{stdout}\n{stderr}");
    }
    assert!(!stdout.contains("FAIL"), "{stdout}\n{stderr}");
}

/// A rank (started by [`two_ranks_sum_gradients_as_ddp_and_stay_bit_equal`] under `mpirun`).
#[test]
#[ignore = "a rank of `two_ranks_sum_gradients_as_ddp_and_stay_bit_equal`, which starts it under mpirun"]
fn dist_rank() {
    if !sluice_testkit::helper::is("dist_rank") {
        return;
    }
    std::process::exit(rank_main());
}

const SIDE: usize = 64;
const NC: usize = 3;

/// Batch `k`'s half `half` (8 images): seeded pixels and two boxes per image.
fn half_batch(k: u64, half: u64) -> candle_core::Result<(Tensor, Vec<Target>)> {
    let n = 8;
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ (k * 1000 + half);
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let pixels: Vec<f32> = (0..n * 3 * SIDE * SIDE).map(|_| next()).collect();
    let images = Tensor::from_vec(pixels, (n, 3, SIDE, SIDE), &Device::Cpu)?;
    let mut targets = Vec::new();
    for i in 0..n as u32 {
        for j in 0..2u32 {
            let (x, y) = (next() * 40.0, next() * 40.0);
            let (w, h) = (8.0 + next() * 16.0, 8.0 + next() * 16.0);
            targets.push(Target { image: i, class: (i + j) % NC as u32, bbox: BoxXyxy::new(x, y, x + w, y + h) });
        }
    }
    Ok((images, targets))
}

/// The gradients of one half's loss (`(box + cls + dfl) · batch`, Ultralytics' per-rank loss), in the optimizer's
/// parameter order.
fn grads_of(model: &Yolo, groups: &ParamGroups, k: u64, half: u64) -> Result<Vec<Tensor>, String> {
    let run = || -> Result<Vec<Tensor>, Box<dyn std::error::Error>> {
        let (x, t) = half_batch(k, half)?;
        let (raw, _) = model.forward_raw(&x, Mode::Train)?;
        let loss = DetectionLoss::new(NC).compute(&raw, &t)?;
        let grads = loss.total.backward()?;
        let mut out = Vec::new();
        for p in groups.params() {
            let g = grads.get(p.var.as_tensor()).ok_or_else(|| format!("no gradient for {}", p.name))?;
            out.push(g.clone());
        }
        Ok(out)
    };
    run().map_err(|e| e.to_string())
}

fn max_rel_diff(a: &[Tensor], b: &[Tensor]) -> Result<f64, String> {
    let (mut diff, mut scale) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let x: Vec<f32> = x.flatten_all().and_then(|t| t.to_vec1()).map_err(|e| e.to_string())?;
        let y: Vec<f32> = y.flatten_all().and_then(|t| t.to_vec1()).map_err(|e| e.to_string())?;
        for (p, q) in x.iter().zip(&y) {
            diff = diff.max(f64::from((p - q).abs()));
            scale = scale.max(f64::from(q.abs()));
        }
    }
    Ok(diff / scale.max(1e-30))
}

fn run(dist: &Dist, report: &mut dyn FnMut(&str, bool, String)) -> Result<(), String> {
    let rank = dist.rank() as u64;
    let world = dist.world() as u64;
    if world != 2 {
        return Err(format!("run with 2 ranks, not {world}"));
    }
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let model = Yolo::new_seeded(YoloConfig::new(Scale::N, NC), DType::F32, &Device::Cpu, 7).map_err(|x| e(&x))?;
    let groups = ParamGroups::new(&model).map_err(|x| e(&x))?;

    // 1. One batch of 16: each rank's half, all-reduced, against one process's halves combined as DDP does
    //    (each rank backpropagates `loss · world`, DDP averages over the ranks).
    let mine = grads_of(&model, &groups, 0, rank)?;
    let mut reduced: Vec<Option<Tensor>> = mine.iter().cloned().map(Some).collect();
    dist.grad_reduce().reduce(&mut reduced, groups.params()).map_err(|x| e(&x))?;
    let reduced: Vec<Tensor> = reduced.into_iter().flatten().collect();
    if rank == 0 {
        let g0 = grads_of(&model, &groups, 0, 0)?;
        let g1 = grads_of(&model, &groups, 0, 1)?;
        let w = world as f64;
        let ddp: Vec<Tensor> = g0
            .iter()
            .zip(&g1)
            .map(|(a, b)| ((a * w)? + (b * w)?)? / w)
            .collect::<candle_core::Result<_>>()
            .map_err(|x| e(&x))?;
        let rel = max_rel_diff(&reduced, &ddp)?;
        report("ddp_gradient", rel < 1e-5, format!("max relative difference {rel:.3e}"));
        // The reduction did something: rank 0's own half differs from the sum.
        let own = max_rel_diff(&g0, &ddp)?;
        report("reduction_changes_the_gradient", own > 1e-3, format!("rank 0's half alone differs by {own:.3e}"));
    }

    // 2. Optimizer steps: every rank updates from the summed gradient, so the replicas stay bit-equal.
    // nbs 16: an optimizer step after every batch of 16.
    let settings = OptimSettings { optimizer: OptimizerKind::Sgd, lr0: 0.01, nbs: 16, ..OptimSettings::default() };
    let shape = RunShape { batch: 16, epochs: 1, batches_per_epoch: 6, train_images: 96 };
    let mut opt = Optimization::new(&model, &settings, shape).map_err(|x| e(&x))?;
    opt.set_grad_reduce(dist.grad_reduce());
    let before = all_vars(&model);
    let first_before = before[0].1.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|x| e(&x))?;
    for k in 1..=6u64 {
        let (x, t) = half_batch(k, rank).map_err(|x| e(&x))?;
        let (raw, _) = model.forward_raw(&x, Mode::Train).map_err(|x| e(&x))?;
        let loss = DetectionLoss::new(NC).compute(&raw, &t).map_err(|x| e(&x))?;
        opt.batch(&model, &loss.total, k as usize - 1, 0).map_err(|x| e(&x))?;
    }
    let steps = opt.steps();
    // BatchNorm's running statistics stay per rank (as in Ultralytics, whose DDP does not broadcast buffers), so
    // the trained parameters and their EMA are what must be equal.
    let mut bytes = Vec::new();
    for (_, v) in model.trainable_vars().iter().chain(opt.ema_model().trainable_vars().iter()) {
        let t = v.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|x| e(&x))?;
        bytes.extend(t.iter().flat_map(|f| f.to_le_bytes()));
    }
    let first_after =
        all_vars(&model)[0].1.as_tensor().flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(|x| e(&x))?;
    let parts = dist.gather_bytes(&bytes).map_err(|x| e(&x))?;
    if rank == 0 {
        let equal = parts.iter().all(|p| *p == bytes);
        report("weights_bit_equal", equal && steps > 0, format!("{steps} optimizer steps, {} bytes", bytes.len()));
        report("weights_moved", first_after != first_before, String::new());
    }
    Ok(())
}

/// One rank's work; the process's exit code: 0 when every check passed on every rank, 1 when one failed, 2 when
/// the ranks did not start.
fn rank_main() -> i32 {
    let dist = match Dist::from_vars(&Device::Cpu, &|k| std::env::var(k).ok()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("FAIL start: {e}");
            return 2;
        }
    };
    let rank = dist.rank();
    let mut failed = false;
    let mut report = |name: &str, ok: bool, why: String| {
        println!("{} {name}: {why}", if ok { "ok" } else { "FAIL" });
        failed |= !ok;
    };
    if let Err(e) = run(&dist, &mut report) {
        println!("FAIL rank {rank}: {e}");
        failed = true;
    }
    let all_ok = dist.any(failed).map(|any| !any).unwrap_or(false);
    if let Err(e) = dist.finish() {
        println!("FAIL finish: {e}");
        return 1;
    }
    if all_ok { 0 } else { 1 }
}
