//! The device checks, for any CUDA machine: `cargo test -p sluice-infer --features cuda,cudnn --test gpu` runs
//! `smoke`; the executable (`cargo xtask gpu-check` packs it) also takes the check to run and its options:
//! `gpu smoke|h2d|convs [--device N] [--json FILE]` (`convs`: `[--batch 32] [--imgsz 640] [--samples 11]`).
//!
//! - `smoke`: every op the model and the validation use, run on the GPU and on the CPU from the same inputs —
//!   convolution forward and backward, training BatchNorm + SiLU (Sluice's fused CUDA kernels), max-pool,
//!   nearest upsample, DFL decode, BCE, argsort / the validation shrink at 8400 anchors, batched NMS, the CUDA
//!   transfer (bit-identical to the CPU one), one YOLOv8n training loss and the fused optimizer step — with the
//!   largest difference relative to the CPU result's magnitude; it fails when any check is out of its tolerance.
//! - `h2d`: host→device bandwidth of a plain 256 MiB copy from pinned and from pageable memory, and of the
//!   training transfer (pinned ring + copy stream + device conversion) on 640 × 640 batches of 32. A measurement:
//!   it asserts nothing about speed.
//! - `convs`: the convolutions' speed on YOLOv8n's layer shapes, Sluice's cuDNN ops against candle's stock conv2d
//!   ([`convs`]; needs `cudnn`). A measurement too.
//!
//! A test target without libtest's harness (`harness = false`), built only with `cuda`: it needs a device, and
//! with one it runs as any other test. A name that is not a check (a `cargo test` filter meant for other tests)
//! runs nothing.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};

#[cfg(feature = "cudnn")]
mod convs;
#[cfg(feature = "cudnn")]
use convs::convs;

#[cfg(not(feature = "cudnn"))]
fn convs(_: usize, _: usize, _: usize, _: usize, _: Option<&std::path::Path>) -> Result<()> {
    anyhow::bail!("`convs` times Sluice's cuDNN convolutions: build with `--features cuda,cudnn`")
}

/// What to run and with which options.
#[derive(Debug)]
struct Args {
    what: Option<String>,
    device: usize,
    json: Option<PathBuf>,
    batch: usize,
    imgsz: usize,
    samples: usize,
}

/// Libtest's options that take a value, which `cargo test` passes through.
const LIBTEST_VALUED: &[&str] = &["--test-threads", "--skip", "--color", "--format", "--logfile", "-Z"];

fn parse(args: impl IntoIterator<Item = String>) -> Result<Args> {
    let mut a = Args { what: Some("smoke".into()), device: 0, json: None, batch: 32, imgsz: 640, samples: 11 };
    let mut named = false;
    let mut it = args.into_iter();
    let value =
        |it: &mut dyn Iterator<Item = String>, flag: &str| it.next().with_context(|| format!("{flag} needs a value"));
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--device" => a.device = value(&mut it, "--device")?.parse().context("--device")?,
            "--json" => a.json = Some(PathBuf::from(value(&mut it, "--json")?)),
            "--batch" => a.batch = value(&mut it, "--batch")?.parse().context("--batch")?,
            "--imgsz" => a.imgsz = value(&mut it, "--imgsz")?.parse().context("--imgsz")?,
            "--samples" => a.samples = value(&mut it, "--samples")?.parse().context("--samples")?,
            f if LIBTEST_VALUED.contains(&f) => {
                value(&mut it, f)?;
            }
            f if f.starts_with('-') => {}
            name => {
                // The first name picks the check; a name that is none (a filter for other tests) runs nothing.
                if !named {
                    a.what = ["smoke", "h2d", "convs"].contains(&name).then(|| name.to_string());
                    named = true;
                }
            }
        }
    }
    Ok(a)
}

fn run(a: Args) -> Result<()> {
    let json = a.json.as_deref();
    match a.what.as_deref() {
        Some("smoke") => imp::smoke(a.device, json),
        Some("h2d") => imp::h2d(a.device, json),
        Some("convs") => convs(a.device, a.batch, a.imgsz, a.samples, json),
        _ => {
            println!("gpu: no device check matches; nothing run");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpu: {e:#}");
            ExitCode::FAILURE
        }
    }
}

mod imp {
    use std::path::Path;
    use std::time::Instant;

    use anyhow::{Context, Result, bail};
    use candle_core::{D, DType, Device, Tensor, Var};
    use rand::Rng;
    use serde::Serialize;
    use sluice_core::{Batch, BatchShape, BoxXyxy, RngStream, Target, Transfer, sample_rng};
    use sluice_eval::{ShrinkParams, shrink};
    use sluice_infer::loss_path::{dense_on, step_loss};
    use sluice_kernels::{conv, dfl, loss, norm, pool};
    use sluice_transfer::{CpuTransfer, CudaTransfer};

    #[derive(Debug, Serialize)]
    struct Check {
        name: String,
        /// Largest |gpu − cpu| over the largest |cpu|, per output.
        rel_diff: Vec<f64>,
        tolerance: f64,
        ok: bool,
        error: Option<String>,
        note: Option<String>,
    }

    fn rand_tensor(rng: &mut RngStream, shape: &[usize], lo: f32, hi: f32) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    fn rel(a: &Tensor, b: &Tensor) -> Result<f64> {
        let a = a.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
        let b = b.to_device(&Device::Cpu)?.to_dtype(DType::F64)?;
        let d = (&a - &b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
        let m = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
        Ok(d / m.max(1e-12))
    }

    /// Outputs and the gradients of `sum(y · r)` for each `Var`.
    fn with_grads(ys: &[Tensor], r: &[Tensor], vars: &[&Var]) -> Result<Vec<Tensor>> {
        let mut l = Tensor::zeros((), ys[0].dtype(), ys[0].device())?;
        for (y, r) in ys.iter().zip(r) {
            l = (l + (y * r.to_device(y.device())?)?.sum_all()?)?;
        }
        let g = l.backward()?;
        let mut out = ys.to_vec();
        for v in vars {
            out.push(g.get(v.as_tensor()).cloned().context("missing gradient")?);
        }
        Ok(out)
    }

    /// Runs `f` on both devices (inputs built on the CPU and moved) and compares every output.
    fn compare(name: &str, tolerance: f64, gpu: &Device, f: impl Fn(&Device) -> Result<Vec<Tensor>>) -> Check {
        let run = || -> Result<Vec<f64>> {
            let c = f(&Device::Cpu)?;
            let g = f(gpu)?;
            c.iter().zip(&g).map(|(c, g)| rel(g, c)).collect()
        };
        Check::of(name.into(), tolerance, run())
    }

    impl Check {
        /// A check from its differences (ok when every one is within `tolerance`) or its error.
        fn of(name: String, tolerance: f64, result: Result<Vec<f64>>) -> Self {
            match result {
                Ok(rel_diff) => {
                    let ok = rel_diff.iter().all(|d| *d <= tolerance);
                    Check { name, rel_diff, tolerance, ok, error: None, note: None }
                }
                Err(e) => {
                    Check { name, rel_diff: vec![], tolerance, ok: false, error: Some(format!("{e:#}")), note: None }
                }
            }
        }
    }

    fn var_on(t: &Tensor, d: &Device) -> Result<Var> {
        Ok(Var::from_tensor(&t.to_device(d)?)?)
    }

    fn random_batch(rng: &mut RngStream, n: usize, side: usize) -> Result<Batch> {
        let mut b = Batch::new(BatchShape::rgb(n, side, side), 8 * n);
        for i in 0..n {
            let (_, slot) = b.push_slot(i as u64)?;
            slot.iter_mut().for_each(|p| *p = rng.random());
            for _ in 0..rng.random_range(0..6) {
                let x = rng.random_range(0.0..side as f32 / 2.0);
                let y = rng.random_range(0.0..side as f32 / 2.0);
                b.targets.push(Target {
                    image: i as u32,
                    class: rng.random_range(0..80),
                    bbox: BoxXyxy::new(x, y, x + 20.0, y + 30.0),
                });
            }
        }
        Ok(b)
    }

    pub(super) fn smoke(ordinal: usize, json: Option<&Path>) -> Result<()> {
        let gpu = Device::new_cuda(ordinal).context("opening the CUDA device")?;
        let mut rng = sample_rng(0, 0, 0);
        let mut checks = Vec::new();
        let x = rand_tensor(&mut rng, &[4, 32, 40, 40], -1.0, 1.0)?;
        // The convolutions are checked under the timed algorithm search, the opt-in path this run verifies (the
        // default, cudarc's pick, passed the first device run).
        sluice_kernels::conv::search::set_algorithm_search(sluice_kernels::conv::search::Search::Timed, true);
        conv_checks(&gpu, &mut rng, &x, &mut checks)?;
        let logits = op_checks(&gpu, &mut rng, &x, &mut checks)?;
        sort_checks(&gpu, &mut rng, &logits, &mut checks)?;
        transfer_checks(&gpu, &mut rng, &mut checks)?;
        model_checks(&gpu, &mut rng, &mut checks)?;
        optimizer_checks(&gpu, &mut rng, &mut checks)?;
        report(&checks, json)
    }

    /// Convolutions: YOLO-like shapes, the geometries of the kernels' CPU tests in f32 and bf16, and (with
    /// `cudnn`) the per-shape plan cache.
    fn conv_checks(gpu: &Device, rng: &mut RngStream, x: &Tensor, checks: &mut Vec<Check>) -> Result<()> {
        let w = rand_tensor(rng, &[64, 32, 3, 3], -0.2, 0.2)?;
        let r = rand_tensor(rng, &[4, 64, 20, 20], -1.0, 1.0)?;
        // cuDNN may run f32 convolutions on TF32 tensor cores (its default math, as PyTorch's `allow_tf32`): 10
        // mantissa bits, so the convolution checks allow 5e-3 where the element-wise ones allow 1e-4.
        checks.push(compare("conv3x3 s2 fwd+bwd", 5e-3, gpu, |d| {
            let (xv, wv) = (var_on(x, d)?, var_on(&w, d)?);
            let y = conv::conv2d(xv.as_tensor(), wv.as_tensor(), 2, 1)?;
            with_grads(&[y], std::slice::from_ref(&r), &[&xv, &wv])
        }));
        let w1 = rand_tensor(rng, &[48, 32, 1, 1], -0.3, 0.3)?;
        let r1 = rand_tensor(rng, &[4, 48, 40, 40], -1.0, 1.0)?;
        checks.push(compare("conv1x1 fwd+bwd", 5e-3, gpu, |d| {
            let (xv, wv) = (var_on(x, d)?, var_on(&w1, d)?);
            let y = conv::conv2d(xv.as_tensor(), wv.as_tensor(), 1, 0)?;
            with_grads(&[y], std::slice::from_ref(&r1), &[&xv, &wv])
        }));
        // The kinds of geometry the kernels' CPU tests cover (`sluice-kernels/tests/conv.rs`), on the device: batch
        // 1, odd sizes and channel counts, stride 2, no padding, 1×1 with stride 2 and a 5×5 — forward, input and
        // weight gradients, against the CPU op
        // (which its own tests hold equal to candle's stock conv2d). In bf16 too (the `--amp` path): bf16 keeps 8
        // bits, so those checks allow 3e-2.
        const GEOMS: &[[usize; 8]] = &[
            // (n, c, h, w, o, k, stride, pad)
            [1, 3, 37, 53, 8, 3, 2, 1],
            [2, 5, 17, 17, 7, 3, 1, 1],
            [3, 16, 20, 20, 24, 1, 1, 0],
            [2, 8, 15, 11, 6, 3, 1, 0],
            [2, 4, 9, 9, 4, 1, 2, 0],
            [2, 6, 13, 13, 9, 5, 1, 2],
        ];
        for &[n, c, h, wd, o, k, s, p] in GEOMS {
            let xi = rand_tensor(rng, &[n, c, h, wd], -1.0, 1.0)?;
            let wi = rand_tensor(rng, &[o, c, k, k], -0.3, 0.3)?;
            let (ho, wo) = ((h + 2 * p - k) / s + 1, (wd + 2 * p - k) / s + 1);
            let ri = rand_tensor(rng, &[n, o, ho, wo], -1.0, 1.0)?;
            for (dtype, tol) in [(DType::F32, 5e-3), (DType::BF16, 3e-2)] {
                let name = format!("conv {n}x{c}x{h}x{wd} -> {o} k{k} s{s} p{p} {dtype:?} fwd+bwd");
                checks.push(compare(&name, tol, gpu, |d| {
                    // The CPU runs f32 (the reference), the GPU the dtype under test.
                    let dt = if d.is_cuda() { dtype } else { DType::F32 };
                    let (xv, wv) = (var_on(&xi.to_dtype(dt)?, d)?, var_on(&wi.to_dtype(dt)?, d)?);
                    let y = conv::conv2d(xv.as_tensor(), wv.as_tensor(), s, p)?;
                    let out = with_grads(&[y], &[ri.to_dtype(dt)?], &[&xv, &wv])?;
                    out.iter().map(|t| Ok(t.to_dtype(DType::F32)?)).collect()
                }));
            }
        }
        // With the `cudnn` feature the passes above went through Sluice's cuDNN ops: each shape and pass is tuned
        // once, so running them again must add no plan.
        #[cfg(feature = "cudnn")]
        {
            let result = (|| -> Result<Vec<f64>> {
                let before = conv::cudnn::plans_cached();
                if before == 0 {
                    bail!("no cuDNN plan was made: the convolutions did not take the cuDNN path");
                }
                let (xv, wv) = (var_on(x, gpu)?, var_on(&w, gpu)?);
                let y = conv::conv2d(xv.as_tensor(), wv.as_tensor(), 2, 1)?;
                with_grads(&[y], std::slice::from_ref(&r), &[&xv, &wv])?;
                let after = conv::cudnn::plans_cached();
                if after != before {
                    bail!("{before} plans before the repeat, {after} after: the per-shape cache missed");
                }
                Ok(vec![])
            })();
            checks.push(Check::of("cuDNN algorithm cache (one plan per shape and pass)".into(), 0.0, result));
            // The plans above were chosen by the timed search (deterministic algorithms, the trainer's default):
            // none fell back to cudarc's heuristic pick.
            let fallbacks = conv::cudnn::search_fallbacks();
            let result = if fallbacks == 0 {
                Ok(vec![])
            } else {
                Err(anyhow::anyhow!("{fallbacks} of {} plans fell back to the heuristic", conv::cudnn::plans_cached()))
            };
            checks.push(Check::of("cuDNN timed algorithm search (no fallback)".into(), 0.0, result));
        }
        Ok(())
    }

    /// The fused element-wise ops (BatchNorm+SiLU, pooling, upsample, DFL, BCE); returns the class logits the
    /// shrink check reuses.
    fn op_checks(gpu: &Device, rng: &mut RngStream, x: &Tensor, checks: &mut Vec<Check>) -> Result<Tensor> {
        let g = rand_tensor(rng, &[32], 0.5, 1.5)?;
        let bta = rand_tensor(rng, &[32], -0.5, 0.5)?;
        let r2 = rand_tensor(rng, &[4, 32, 40, 40], -1.0, 1.0)?;
        checks.push(compare("batchnorm+silu train fwd+bwd", 1e-4, gpu, |d| {
            let (xv, gv, bv) = (var_on(x, d)?, var_on(&g, d)?, var_on(&bta, d)?);
            let (y, mean, var) = norm::batch_norm_silu_train(xv.as_tensor(), gv.as_tensor(), bv.as_tensor(), 1e-3)?;
            let mut out = with_grads(&[y], std::slice::from_ref(&r2), &[&xv, &gv, &bv])?;
            out.extend([mean, var]);
            Ok(out)
        }));
        // Odd sizes and channel count, and a map large enough that each channel's sums are split over blocks.
        for dims in [[3, 5, 37, 53], [8, 16, 96, 96]] {
            let xb = rand_tensor(rng, &dims, -2.0, 3.0)?;
            let (gb, bb) = (rand_tensor(rng, &[dims[1]], 0.5, 1.5)?, rand_tensor(rng, &[dims[1]], -0.5, 0.5)?);
            let rb = rand_tensor(rng, &dims, -1.0, 1.0)?;
            let name = format!("batchnorm+silu train fwd+bwd {dims:?}");
            checks.push(compare(&name, 1e-4, gpu, |d| {
                let (xv, gv, bv) = (var_on(&xb, d)?, var_on(&gb, d)?, var_on(&bb, d)?);
                let (y, mean, var) = norm::batch_norm_silu_train(xv.as_tensor(), gv.as_tensor(), bv.as_tensor(), 1e-3)?;
                let mut out = with_grads(&[y], std::slice::from_ref(&rb), &[&xv, &gv, &bv])?;
                out.extend([mean, var]);
                Ok(out)
            }));
        }
        // Mixed precision: half activations with f32 parameters and statistics. The device kernels read and write
        // the half dtype; the CPU runs the f32 op between casts (the reference). One rounding of the output apart.
        {
            let dims = [4, 24, 33, 35];
            let xb = rand_tensor(rng, &dims, -2.0, 3.0)?;
            let (gb, bb) = (rand_tensor(rng, &[dims[1]], 0.5, 1.5)?, rand_tensor(rng, &[dims[1]], -0.5, 0.5)?);
            let rb = rand_tensor(rng, &dims, -1.0, 1.0)?;
            for (half, tol) in [(DType::F16, 2e-3), (DType::BF16, 2e-2)] {
                let name = format!("batchnorm+silu train fwd+bwd {half:?} activations {dims:?}");
                checks.push(compare(&name, tol, gpu, |d| {
                    let xv = var_on(&xb.to_dtype(half)?, d)?;
                    let (gv, bv) = (var_on(&gb, d)?, var_on(&bb, d)?);
                    let (y, mean, var) =
                        norm::batch_norm_silu_train(xv.as_tensor(), gv.as_tensor(), bv.as_tensor(), 1e-3)?;
                    if y.dtype() != half || mean.dtype() != DType::F32 {
                        bail!("y is {:?} and the mean {:?}", y.dtype(), mean.dtype());
                    }
                    let y = y.to_dtype(DType::F32)?;
                    let mut out = with_grads(&[y], std::slice::from_ref(&rb), &[&xv, &gv, &bv])?;
                    out.extend([mean, var]);
                    out.iter().map(|t| Ok(t.to_dtype(DType::F32)?)).collect()
                }));
            }
        }
        // The assigner's overlaps in one kernel (opt-in `fused_ciou`) against its CPU twin: the same steps in the same
        // order, so equal up to the device's division and arctangent steps (nothing is contracted).
        {
            let (gx, gy) = (rand_tensor(rng, &[4, 9, 2], 0.0, 600.0)?, rand_tensor(rng, &[4, 9, 2], 1.0, 200.0)?);
            let gt = Tensor::cat(&[&gx, &(&gx + &gy)?], 2)?; // (B, M, 4) x1 y1 x2 y2
            let (px, py) = (rand_tensor(rng, &[4, 2, 8400], 0.0, 600.0)?, rand_tensor(rng, &[4, 2, 8400], 0.0, 300.0)?);
            let pred = Tensor::cat(&[&px, &(&px + &py)?], 1)?; // (B, 4, A)
            checks.push(compare("ciou pairs, one kernel (fused_ciou)", 1e-6, gpu, |d| {
                Ok(vec![sluice_kernels::iou::ciou_pairs(&gt.to_device(d)?, &pred.to_device(d)?)?])
            }));
        }
        // The class loss's one-kernel sum and gradient (opt-in `fused_bce`) against its host twin: the same sum in
        // another order (f64 block sums), the same gradient.
        {
            let (b, c, a) = (4usize, 80usize, 8400usize);
            let x = rand_tensor(rng, &[b, c, a], -12.0, 4.0)?;
            let p = sluice_model::ops::sigmoid(&x)?;
            let label = rand_tensor(rng, &[b, a], 0.0, c as f32 - 0.01)?.floor()?.to_dtype(DType::U32)?;
            let weight = rand_tensor(rng, &[b, a], 0.0, 1.0)?;
            checks.push(compare("bce one-hot sum, one kernel (fused_bce) fwd+bwd", 1e-5, gpu, |d| {
                let xv = var_on(&x, d)?;
                let on = |t: &Tensor| t.to_device(d);
                let s = sluice_kernels::loss::bce_with_logits_sum_one_hot_kernel(
                    xv.as_tensor(),
                    &on(&label)?,
                    &on(&weight)?,
                    &on(&p)?,
                )?;
                let g = (&s * 0.37)?.backward()?;
                let dx = g.get(&xv).context("no gradient for the logits")?.clone();
                Ok(vec![s, dx])
            }));
        }
        checks.push(compare("maxpool5 fwd+bwd", 1e-5, gpu, |d| {
            let xv = var_on(x, d)?;
            let y = pool::max_pool2d_same(xv.as_tensor(), 5)?;
            with_grads(&[y], std::slice::from_ref(&r2), &[&xv])
        }));
        // The same with the window search in one kernel (opt-in `fused_pool`); the CPU runs its fused pool as above.
        pool::set_fused_pool(true);
        checks.push(compare("maxpool5 fwd+bwd, window search in one kernel (fused_pool)", 1e-5, gpu, |d| {
            let xv = var_on(x, d)?;
            let y = pool::max_pool2d_same(xv.as_tensor(), 5)?;
            with_grads(&[y], std::slice::from_ref(&r2), &[&xv])
        }));
        pool::set_fused_pool(false);
        // YOLO11/YOLO26's depthwise convolutions (cuDNN's grouped convolution with `cudnn`, the composed form
        // without), on an odd shape, against the CPU's fused op.
        for k in [3usize, 5] {
            let xd = rand_tensor(rng, &[3, 24, 19, 23], -1.0, 1.0)?;
            let wd = rand_tensor(rng, &[24, 1, k, k], -0.5, 0.5)?;
            let rd = rand_tensor(rng, &[3, 24, 19, 23], -1.0, 1.0)?;
            checks.push(compare(&format!("depthwise conv {k}x{k} fwd+bwd"), 1e-5, gpu, |d| {
                let (xv, wv) = (var_on(&xd, d)?, var_on(&wd, d)?);
                let y = sluice_kernels::depthwise::depthwise_conv2d(xv.as_tensor(), wv.as_tensor(), k / 2)?;
                with_grads(&[y], std::slice::from_ref(&rd), &[&xv, &wv])
            }));
        }
        let r3 = rand_tensor(rng, &[4, 32, 80, 80], -1.0, 1.0)?;
        checks.push(compare("upsample2x fwd+bwd", 1e-5, gpu, |d| {
            let xv = var_on(x, d)?;
            let y = pool::upsample_nearest2x(xv.as_tensor())?;
            with_grads(&[y], std::slice::from_ref(&r3), &[&xv])
        }));
        // The backward's assembly of a split's gradient (the patched candle's narrow pieces: one concatenation, zeros
        // where no piece lies): C2f's halves of a product, and two pieces with a gap.
        checks.push(compare("split gradients assembled (narrow pieces) fwd+bwd", 1e-6, gpu, |d| {
            let xv = var_on(x, d)?;
            let (y, z) = ((xv.as_tensor() * 2.0)?, (xv.as_tensor() * 3.0)?);
            let ys = [y.narrow(1, 0, 16)?, y.narrow(1, 16, 16)?, z.narrow(1, 20, 12)?, z.narrow(1, 0, 16)?];
            let rs = [r2.narrow(1, 0, 16)?, r2.narrow(1, 16, 16)?, r2.narrow(1, 20, 12)?, r2.narrow(1, 3, 16)?];
            with_grads(&ys, &rs, &[&xv])
        }));
        // The patched candle's concatenation of adjacent blocks of one storage as one copy (C2f's halves beside
        // another tensor; a tensor's statistics side by side), and its `where` backward of maximum and minimum, with
        // ties (the rounded values meet often).
        checks.push(compare("concatenation of adjacent blocks fwd+bwd", 0.0, gpu, |d| {
            let xv = var_on(x, d)?;
            let y = (xv.as_tensor() * 2.0)?;
            let cat = Tensor::cat(&[y.narrow(1, 0, 16)?, y.narrow(1, 16, 16)?, xv.as_tensor().narrow(1, 4, 8)?], 1)?;
            let flat = y.flatten_all()?;
            let n = flat.elem_count() / 2;
            let runs = Tensor::cat(&[flat.narrow(0, 0, n)?, flat.narrow(0, n, n)?, flat.narrow(0, 0, 7)?], 0)?;
            let r = Tensor::cat(&[r2.narrow(1, 0, 32)?, r2.narrow(1, 0, 8)?], 1)?;
            let mut out = with_grads(&[cat], std::slice::from_ref(&r), &[&xv])?;
            out.push(runs);
            Ok(out)
        }));
        checks.push(compare("maximum and minimum with ties fwd+bwd", 1e-6, gpu, |d| {
            let (av, bv) = (var_on(&(x * 4.0)?.round()?, d)?, var_on(&(x * -4.0)?.round()?, d)?);
            let ys = [av.as_tensor().maximum(bv.as_tensor())?, av.as_tensor().minimum(&bv.as_tensor().detach())?];
            with_grads(&ys, &[r2.clone(), r2.clone()], &[&av, &bv])
        }));
        let bins = rand_tensor(rng, &[2, 64, 8400], -4.0, 4.0)?;
        let r4 = rand_tensor(rng, &[2, 4, 8400], -1.0, 1.0)?;
        checks.push(compare("dfl decode fwd+bwd", 1e-4, gpu, |d| {
            let xv = var_on(&bins, d)?;
            let y = dfl::dfl_decode(xv.as_tensor(), 16)?;
            with_grads(&[y], std::slice::from_ref(&r4), &[&xv])
        }));
        // The dense loss's DFL: the bins' softmax once, for the decoded distances and the cross entropy at two bins.
        let left = rand_tensor(rng, &[2, 4, 1, 8400], 0.0, 14.99)?.floor()?.to_dtype(DType::U32)?;
        checks.push(compare("dfl softmax parts: decode and cross entropy fwd+bwd", 1e-4, gpu, |d| {
            let xv = var_on(&bins, d)?;
            let parts = sluice_model::ops::SoftmaxParts::new(&xv.as_tensor().reshape((2, 4, 16, 8400))?, 2)?;
            let tl = left.to_device(d)?;
            let tr = (&tl + 1.0)?;
            let ce = parts.nll_at(&[&tl, &tr])?;
            let ys = [parts.expectation()?, ce[0].squeeze(2)?, ce[1].squeeze(2)?];
            with_grads(&ys, &[r4.clone(), r4.clone(), r4.clone()], &[&xv])
        }));
        let logits = rand_tensor(rng, &[2, 80, 8400], -6.0, 6.0)?;
        let z = rand_tensor(rng, &[2, 80, 8400], 0.0, 1.0)?;
        checks.push(compare("bce with logits fwd+bwd", 1e-4, gpu, |d| {
            let xv = var_on(&logits, d)?;
            let y = loss::bce_with_logits(xv.as_tensor(), &z.to_device(d)?)?;
            with_grads(&[y], std::slice::from_ref(&z), &[&xv])
        }));
        // The dense loss's form: on the device the sum against one-hot targets from candle's ops over the
        // probabilities and the gradient from `σ(x)` in one op.
        let half = Tensor::new(0.5f32, &Device::Cpu)?;
        let label = rand_tensor(rng, &[2, 8400], 0.0, 79.99)?.floor()?.to_dtype(DType::U32)?;
        let weight = rand_tensor(rng, &[2, 8400], 0.0, 1.0)?;
        checks.push(compare(
            "bce with logits against one-hot targets, summed from the probabilities fwd+bwd",
            1e-4,
            gpu,
            |d| {
                let xv = var_on(&logits, d)?;
                let p = sluice_model::ops::sigmoid(&xv.as_tensor().detach())?;
                let y =
                    loss::bce_with_logits_sum_one_hot(xv.as_tensor(), &label.to_device(d)?, &weight.to_device(d)?, &p)?;
                with_grads(&[y], std::slice::from_ref(&half), &[&xv])
            },
        ));
        Ok(logits)
    }

    /// Sorting and the validation shrink on the device.
    fn sort_checks(gpu: &Device, rng: &mut RngStream, logits: &Tensor, checks: &mut Vec<Check>) -> Result<()> {
        // argsort under candle's one-block limit, then the validation shrink at 8400 anchors. 8000 random f32 in
        // [0, 1) hold a few equal values per row, which two correct sorts may order differently: the check is on
        // the values the indices gather (the sorted rows) and on the indices being a permutation (their sorted
        // row is 0..n), not on the indices themselves.
        let sorted = |s: &Tensor, d: &Device| -> Result<Vec<Tensor>> {
            let s = s.to_device(d)?;
            let idx = s.arg_sort_last_dim(false)?;
            let perm = idx.to_dtype(DType::F32)?.to_device(&Device::Cpu)?.sort_last_dim(true)?.0;
            Ok(vec![s.gather(&idx, D::Minus1)?, perm])
        };
        let scores = rand_tensor(rng, &[4, 8000], 0.0, 1.0)?;
        checks.push(compare("argsort 8000 columns (sorted values, permutation)", 0.0, gpu, |d| sorted(&scores, d)));
        let mut c = compare("argsort 8400 columns (candle's limit is 8192)", 0.0, gpu, |d| {
            sorted(&rand_tensor(&mut sample_rng(1, 0, 0), &[2, 8400], 0.0, 1.0)?, d)
        });
        c.note = Some("informational: the shrink avoids sorting beyond 8192 columns on the GPU".into());
        checks.push(c);
        // The chunked top-k and YOLO26's end-to-end top-300 on the device against the CPU, past candle's limit, on
        // distinct values (so that no tie order can differ): a shuffled ramp.
        let distinct = |rng: &mut RngStream, shape: &[usize], lo: f32, hi: f32| -> Result<Tensor> {
            let n: usize = shape.iter().product();
            let mut v: Vec<f32> = (0..n).map(|i| lo + (hi - lo) * i as f32 / n as f32).collect();
            for i in (1..n).rev() {
                v.swap(i, rng.random_range(0..=i));
            }
            Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
        };
        let wide = distinct(rng, &[2, 33_600], 0.0, 1.0)?;
        checks.push(compare("top-300 of 33,600 columns (chunked argsort)", 0.0, gpu, |d| {
            let (v, i) = sluice_kernels::topk::topk_last(&wide.to_device(d)?, 300)?;
            Ok(vec![v, i.to_dtype(DType::F32)?])
        }));
        for side in [640usize, 1280] {
            let grids = [(side / 8, side / 8), (side / 16, side / 16), (side / 32, side / 32)];
            let a: usize = grids.iter().map(|(h, w)| h * w).sum();
            let boxes = rand_tensor(rng, &[2, 4, a], 0.0, 8.0)?;
            let scores = distinct(rng, &[2, 80, a], -6.0, 2.0)?;
            checks.push(compare(&format!("end-to-end top-300 on the device ({a} anchors)"), 1e-6, gpu, |d| {
                let raw = sluice_model::RawHead {
                    boxes: boxes.to_device(d)?,
                    scores: scores.to_device(d)?,
                    grids,
                    one2one: None,
                };
                Ok(vec![sluice_model::head::end2end_topk(&raw, 300)?])
            }));
        }
        let head = Tensor::cat(&[rand_tensor(rng, &[2, 4, 8400], 0.0, 640.0)?, logits.narrow(1, 0, 80)?], 1)?;
        let head = (head.narrow(1, 0, 4)?.clone(), sluice_model::ops::sigmoid(&head.narrow(1, 4, 80)?)?);
        let head = Tensor::cat(&[head.0, (head.1 * 0.01)?], 1)?;
        checks.push(compare("validation shrink (8400 anchors, conf 0.001)", 0.0, gpu, |d| {
            let s = shrink(&head.to_device(d)?, &ShrinkParams::default())?;
            Ok(vec![s.above_conf.to_dtype(DType::F32)?, s.finite_check])
        }));
        // At 1280 px (33,600 anchors) with about 5% of the anchors above conf: the device ranks them with the
        // chunked top-k and copies ~1700 per image instead of all of them; the kept anchors must be the CPU's.
        let wide_head = Tensor::cat(
            &[
                rand_tensor(rng, &[2, 4, 33_600], 0.0, 1280.0)?,
                rand_tensor(rng, &[2, 80, 33_600], 0.0, 1.0)?.powf(1e4)?,
            ],
            1,
        )?;
        checks.push(compare("validation shrink (33,600 anchors, ~5% above conf)", 0.0, gpu, |d| {
            let s = shrink(&wide_head.to_device(d)?, &ShrinkParams::default())?;
            Ok(vec![s.preds, s.anchors.to_dtype(DType::F32)?, s.above_conf.to_dtype(DType::F32)?])
        }));
        nms_checks(gpu, rng, checks)
    }

    /// Batched NMS on the device (`sluice_eval::masknms`) against its host twin, which the CPU tests hold equal to
    /// the CPU NMS and to Ultralytics: bit-equal rows, anchors and counts. Scores on a grid of 16 values and boxes
    /// on a 4 px grid give ties in scores and in IoU.
    fn nms_checks(gpu: &Device, rng: &mut RngStream, checks: &mut Vec<Check>) -> Result<()> {
        use sluice_eval::masknms::nms_tensor;
        use sluice_eval::{Layout, NmsMode, NmsParams};
        let tied = |rng: &mut RngStream, b: usize, nc: usize, a: usize, side: f32, pow: f64| -> Result<Tensor> {
            let xy = (rand_tensor(rng, &[b, 2, a], 0.0, side / 4.0)?.floor()? * 4.0)?;
            let wh = (rand_tensor(rng, &[b, 2, a], 1.0, 50.0)?.floor()? * 4.0)?;
            let s = (rand_tensor(rng, &[b, nc, a], 0.0, 1.0)?.powf(pow)? * 16.0)?.floor()?;
            Ok(Tensor::cat(&[xy, wh, (s / 16.0)?], 1)?)
        };
        let ul = NmsParams::ultralytics_val();
        let cases = [
            ("Ultralytics' val (class offset, multi-label, conf 0.001), 4 x 8400 x 80", 8400, 4.0, ul),
            ("exact per class, multi-label, 4 x 8400 x 80", 8400, 4.0, NmsParams { mode: NmsMode::Exact, ..ul }),
            (
                "predict settings (single-label, conf 0.25), 4 x 8400 x 80",
                8400,
                1.0,
                NmsParams { conf_thres: 0.25, multi_label: false, ..ul },
            ),
            ("class offset at 1280 px, 4 x 33,600 x 80, conf 0.5", 33_600, 2.0, NmsParams { conf_thres: 0.5, ..ul }),
        ];
        for (name, a, pow, params) in cases {
            let side = if a > 8400 { 1280.0 } else { 640.0 };
            let y = tied(rng, 4, 80, a, side, pow)?;
            checks.push(compare(&format!("batched NMS on the device: {name}"), 0.0, gpu, |d| {
                let k = nms_tensor(&y.to_device(d)?, Layout::ChannelsFirst, &params)?;
                Ok(vec![k.rows, k.anchors.to_dtype(DType::F32)?, k.kept.to_dtype(DType::F32)?])
            }));
        }
        Ok(())
    }

    /// The pinned CUDA transfer against the CPU one.
    fn transfer_checks(gpu: &Device, rng: &mut RngStream, checks: &mut Vec<Check>) -> Result<()> {
        // The CUDA transfer must equal the CPU one bit for bit, in f32 and bf16, over more batches than slots.
        for dtype in [DType::F32, DType::BF16] {
            let name = format!("transfer {dtype:?} (5 batches through 3 slots)");
            let result = (|| -> Result<Vec<f64>> {
                let cuda = CudaTransfer::new(gpu, dtype)?;
                let cpu = CpuTransfer::new(Device::Cpu, dtype);
                let mut diffs = Vec::new();
                for _ in 0..5 {
                    let b = random_batch(rng, 4, 64)?;
                    let (g, c) = (cuda.transfer(&b)?, cpu.transfer(&b)?);
                    for (g, c) in [(&g.images, &c.images), (&g.gt_boxes, &c.gt_boxes), (&g.gt_mask, &c.gt_mask)] {
                        diffs.push(rel(g, c)?);
                    }
                    let cls = (g.gt_classes.to_device(&Device::Cpu)? - &c.gt_classes)?.abs()?.sum_all()?;
                    diffs.push(f64::from(cls.to_scalar::<f32>()?));
                }
                // Staging grows only when a batch needs more (the batches above differ in target count): once
                // every slot has held the largest, more batches of the same size allocate nothing.
                let big = random_batch(rng, 4, 64)?;
                for _ in 0..CudaTransfer::SLOTS {
                    cuda.transfer(&big)?;
                }
                let before = cuda.stats().staging_allocs;
                for _ in 0..2 * CudaTransfer::SLOTS {
                    cuda.transfer(&big)?;
                }
                let after = cuda.stats().staging_allocs;
                if after != before {
                    bail!("{} staging allocations in steady state (want none)", after - before);
                }
                Ok(diffs)
            })();
            checks.push(Check::of(name, 0.0, result));
        }
        Ok(())
    }

    /// The fused optimizer step (`sluice_kernels::multi_tensor`: norm, clip, update and EMA as one pass each over
    /// every tensor), and the composed step over the trainer's packed parameter groups (the default), on the GPU
    /// against the composed ops per parameter on the CPU: yolov8n's parameters, SGD, Adam, AdamW and
    /// MuSGD (its Muon parameters composed on both), with float16 loss scaling, over three steps whose gradients
    /// are fixed random tensors (so the model's own numerics play no part), one of them clipped, then a step with a
    /// non-finite gradient, which must change nothing but the scale.
    fn optimizer_checks(gpu: &Device, rng: &mut RngStream, checks: &mut Vec<Check>) -> Result<()> {
        use sluice_optim::{
            OptimSettings, Optimization, OptimizerKind, RunShape, ScalerSettings, StepOptions, StepPath,
        };
        let cfg = sluice_model::YoloConfig::new(sluice_model::Scale::N, 80);
        let names: Vec<String> = {
            let m = sluice_model::Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 0)?;
            let mut n: Vec<String> = m.trainable_vars().into_iter().map(|(k, _)| k).collect();
            n.sort();
            n
        };
        // Per parameter and step, the gradient (the coefficient of a linear loss); step 1's are large (clipped).
        let mut coefs: Vec<Vec<Tensor>> = Vec::new();
        for step in 0..3 {
            let m = sluice_model::Yolo::new_seeded(cfg, DType::F32, &Device::Cpu, 0)?;
            let amp = if step == 1 { 50.0 } else { 0.01 };
            coefs.push(
                names
                    .iter()
                    .map(|n| {
                        let dims = m.var(n).context("a parameter")?.dims().to_vec();
                        rand_tensor(rng, &dims, -amp, amp)
                    })
                    .collect::<Result<_>>()?,
            );
        }
        // The GPU runs the fused passes, or the composed ops over the trainer's packed parameter groups; the CPU the
        // composed ops per parameter (the reference). Both sum the norm in another order than the reference.
        let variants =
            [("fused optimizer step", true, 1e-5), ("composed optimizer step over packed groups", false, 1e-4)];
        for ((what, fused, tolerance), kind) in variants.into_iter().flat_map(|v| {
            [OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW, OptimizerKind::MuSgd].map(|k| (v, k))
        }) {
            checks.push(compare(&format!("{what}, {kind:?}, fp16 loss scale"), tolerance, gpu, |d| {
                let m = sluice_model::Yolo::new_seeded(cfg, DType::F32, d, 0)?;
                let shape = RunShape { batch: 64, epochs: 3, batches_per_epoch: 4, train_images: 256 };
                let settings = OptimSettings { optimizer: kind, warmup_epochs: 0.0, ..OptimSettings::default() };
                let m = if d.is_cuda() && !fused { Optimization::pack_model(m, &settings, shape)? } else { m };
                let path = if d.is_cuda() && fused { StepPath::DeviceFused } else { StepPath::Device };
                let step = StepOptions { path, loss_scaling: Some(ScalerSettings::default()) };
                let mut opt = Optimization::with_step(&m, &settings, shape, step)?;
                let loss_of = |step: usize, factor: f64| -> Result<Tensor> {
                    let mut total: Option<Tensor> = None;
                    for (n, c) in names.iter().zip(&coefs[step]) {
                        let v = m.var(n).context("a parameter")?;
                        let term = (v.as_tensor() * c.to_device(d)?)?.sum_all()?;
                        total = Some(match total {
                            None => term,
                            Some(t) => (t + term)?,
                        });
                    }
                    Ok(total.context("no parameters")?.affine(factor, 0.0)?)
                };
                for step in 0..3 {
                    opt.batch_known_finite(&m, &loss_of(step, 1.0)?, true, step, 0)?;
                }
                let before: Vec<Tensor> = names
                    .iter()
                    .map(|n| Ok(m.var(n).context("a parameter")?.as_tensor().copy()?))
                    .collect::<Result<_>>()?;
                // A non-finite gradient: masked on the device, the scale halved.
                opt.batch_known_finite(&m, &loss_of(0, f64::NAN)?, true, 3, 0)?;
                let mut out = Vec::new();
                for (n, b) in names.iter().zip(&before) {
                    let v = m.var(n).context("a parameter")?;
                    if (v.as_tensor() - b)?.abs()?.sum_all()?.to_scalar::<f32>()? != 0.0 {
                        bail!("{n} changed in a step with a non-finite gradient");
                    }
                    out.push(v.as_tensor().flatten_all()?);
                    let e = opt.ema_model().var(n).context("an EMA variable")?;
                    out.push(e.as_tensor().flatten_all()?);
                }
                let s = opt.loss_scale()?.context("no loss scale")?;
                let scale = Tensor::new(&[s.scale, s.growth_tracker as f32, s.overflows as f32], d)?;
                Ok(vec![Tensor::cat(&out, 0)?, scale])
            }));
        }
        Ok(())
    }

    /// The whole model: the loss on both devices, bf16 autocast against f32, the caching memory pool.
    fn model_checks(gpu: &Device, rng: &mut RngStream, checks: &mut Vec<Check>) -> Result<()> {
        // One YOLOv8n training loss at 320 on both devices from the same weights and batch.
        let batch = random_batch(rng, 2, 320)?;
        checks.push(compare("yolov8n loss at 320 (forward, host vs dense assigner, loss)", 5e-3, gpu, |d| {
            let cfg = sluice_model::YoloConfig::new(sluice_model::Scale::N, 80);
            let m = sluice_model::Yolo::new_seeded(cfg, DType::F32, d, 0)?;
            let x = sluice_transfer::DeviceTransfer::new(d, DType::F32)?.transfer(&batch)?;
            let (raw, _) = m.forward_raw(&x.images, sluice_model::Mode::Train)?;
            // The CPU takes the host assigner, the GPU the dense (tensor-op) one: the check covers both.
            let loss = sluice_model::DetectionLoss::new(80);
            let out = step_loss(&loss, &raw, &batch, &x, dense_on(d, false))?;
            let items = out.items.read()?;
            let items = Tensor::new(&items, &Device::Cpu)?;
            Ok(vec![out.total.unsqueeze(0)?, items, raw.scores.mean_keepdim(D::Minus1)?])
        }));

        // Mixed precision on the device: the autocast train forward (half activations from layer to layer) and the
        // first conv's gradient against the f32 one, same weights and batch, in bf16 and f16. bf16 keeps 8 bits, so
        // the tolerance is loose: it catches a broken cast or a lost gradient, not rounding; f16 (11 bits) is held
        // to the same bounds.
        for half in [DType::BF16, DType::F16] {
            let result = (|| -> Result<Vec<f64>> {
                let x = sluice_transfer::DeviceTransfer::new(gpu, DType::F32)?.transfer(&batch)?;
                let run = |half: Option<DType>| -> Result<Vec<Tensor>> {
                    let cfg = sluice_model::YoloConfig::new(sluice_model::Scale::N, 80);
                    let m = sluice_model::Yolo::new_seeded(cfg, DType::F32, gpu, 0)?;
                    m.set_autocast(half)?;
                    let (raw, _) = m.forward_raw(&x.images, sluice_model::Mode::Train)?;
                    let out = Tensor::cat(&[&raw.boxes, &raw.scores], 1)?;
                    let w = m.var("model.0.conv.weight").context("model.0.conv.weight")?;
                    let g = out.sum_all()?.backward()?;
                    let gw = g.get(w.as_tensor()).cloned().context("no gradient for model.0.conv.weight")?;
                    if gw.dtype() != DType::F32 || out.dtype() != DType::F32 {
                        bail!(
                            "the head's output is {:?} and the master weight's gradient {:?}",
                            out.dtype(),
                            gw.dtype()
                        );
                    }
                    Ok(vec![out, gw])
                };
                let (f, h) = (run(None)?, run(Some(half))?);
                let cos = |a: &Tensor, b: &Tensor| -> Result<f64> {
                    let (a, b) = (a.to_dtype(DType::F64)?.flatten_all()?, b.to_dtype(DType::F64)?.flatten_all()?);
                    let dot = (&a * &b)?.sum_all()?.to_scalar::<f64>()?;
                    let na = a.sqr()?.sum_all()?.sqrt()?.to_scalar::<f64>()?;
                    let nb = b.sqr()?.sum_all()?.sqrt()?.to_scalar::<f64>()?;
                    Ok(dot / (na * nb).max(1e-300))
                };
                Ok(vec![rel(&h[0], &f[0])?, 1.0 - cos(&h[1], &f[1])?])
            })();
            // The outputs by their largest difference, the gradient by its direction (1 − cosine): a bf16 gradient
            // summed over 2 × 320² positions is far off in its small, cancelling elements. The tolerances come from
            // PyTorch's autocast on the same check (`xtask/gpu-check-amp.py`: Ultralytics' YOLOv8n, three seeds; its
            // figures are in docs/gpu-results.md), with headroom above PyTorch's worst seed.
            let (outputs, grad) = match result {
                Ok(v) => (Ok(vec![v[0]]), Ok(vec![v[1]])),
                Err(e) => (Err(anyhow::anyhow!("{e:#}")), Err(e)),
            };
            let name = format!("{half:?}").to_lowercase();
            checks.push(Check::of(format!("yolov8n {name} autocast vs f32 at 320 (outputs)"), 0.05, outputs));
            checks.push(Check::of(
                format!("yolov8n {name} autocast vs f32 at 320 (1 - cos of conv0 grad)"),
                0.15,
                grad,
            ));
        }

        // The caching pool: the release threshold takes, and the reserved bytes can be read.
        let result = (|| -> Result<Vec<f64>> {
            if !sluice_transfer::retain_device_pool(gpu)? {
                bail!("no memory pool on the device");
            }
            let r = sluice_transfer::device_pool_reserved(gpu).context("the pool's reserved bytes")?;
            println!("device pool: {:.1} MiB reserved", r as f64 / f64::from(1u32 << 20));
            Ok(vec![])
        })();
        checks.push(Check::of("device memory pool (release threshold, reserved bytes)".into(), 0.0, result));
        Ok(())
    }

    /// Prints every check, writes them as JSON when asked, and fails when any check without a note failed.
    fn report(checks: &[Check], json: Option<&Path>) -> Result<()> {
        let failed = checks.iter().filter(|c| !c.ok && c.note.is_none()).count();
        for c in checks {
            println!(
                "{:<52} {:<5} rel {:?} (tol {:e}){}{}",
                c.name,
                if c.ok { "ok" } else { "FAIL" },
                c.rel_diff.iter().map(|d| format!("{d:.2e}")).collect::<Vec<_>>(),
                c.tolerance,
                c.error.as_deref().map(|e| format!(" error: {e}")).unwrap_or_default(),
                c.note.as_deref().map(|n| format!(" [{n}]")).unwrap_or_default(),
            );
        }
        if let Some(p) = json {
            let v = serde_json::json!({ "checks": checks, "failed": failed });
            std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
        }
        if failed > 0 {
            bail!("{failed} smoke checks failed");
        }
        Ok(())
    }

    pub(super) fn h2d(ordinal: usize, json: Option<&Path>) -> Result<()> {
        let gpu = Device::new_cuda(ordinal).context("opening the CUDA device")?;
        let Device::Cuda(cd) = &gpu else { bail!("not a CUDA device") };
        let stream = cd.cuda_stream();
        let ctx = stream.context().clone();
        let copy = ctx.new_stream()?;
        const BIG: usize = 256 << 20;
        let reps = 10;
        let mut dev = copy.alloc_zeros::<u8>(BIG)?;
        // SAFETY: filled below before any copy reads it.
        let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<u8>(BIG, 0) }?;
        pinned.as_mut_slice()?.fill(1);
        let pageable = vec![1u8; BIG];
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
            f()?; // warm-up
            copy.synchronize()?;
            let t = Instant::now();
            for _ in 0..reps {
                f()?;
            }
            copy.synchronize()?;
            Ok((BIG * reps) as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let pinned_gbs = time(&mut || Ok(copy.memcpy_htod(&pinned, &mut dev)?))?;
        let pageable_gbs = time(&mut || Ok(copy.memcpy_htod(&pageable, &mut dev)?))?;
        drop((dev, pinned, pageable));

        let mut rng = sample_rng(0, 0, 0);
        let batch = random_batch(&mut rng, 32, 640)?;
        let t = CudaTransfer::new(&gpu, DType::F32)?;
        for _ in 0..3 {
            t.transfer(&batch)?;
        }
        stream.synchronize()?;
        let n = 30;
        let start = Instant::now();
        for _ in 0..n {
            let x = t.transfer(&batch)?;
            drop(x);
        }
        stream.synchronize()?;
        let secs = start.elapsed().as_secs_f64();
        let bytes = batch.pixels().len() as f64 * n as f64;
        let transfer_gbs = bytes / secs / 1e9;
        let stats = t.stats();
        let v = serde_json::json!({
            "plain_pinned_gbs": pinned_gbs,
            "plain_pageable_gbs": pageable_gbs,
            "transfer_u8_gbs": transfer_gbs,
            "transfer_batches_per_s": n as f64 / secs,
            "transfer_vs_plain_pinned": transfer_gbs / pinned_gbs,
            "transfer_slot_waits": stats.slot_waits,
            "transfer_staging_allocs": stats.staging_allocs,
            "batch": "32 x 3 x 640 x 640 u8 -> f32",
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        if let Some(p) = json {
            std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    }
}
