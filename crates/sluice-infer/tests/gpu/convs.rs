//! `gpu convs`: the speed of the convolutions on the device, on YOLOv8n's layer shapes, Sluice's ops
//! (`sluice_kernels::conv::conv2d`: cuDNN for all three passes, algorithms chosen once per shape) against candle's
//! stock `conv2d` (cuDNN forward chosen on every call, input gradient through candle's own `conv_transpose2d`
//! kernel) in the same process, in f32 and bf16.
//!
//! Each layer is timed as a forward (`y = conv(x, w)`) and as a training pass (`sum(y · r)` and its backward, which
//! computes the weight gradient and, except for the stem, the input gradient). The backward's time is the
//! difference. Timing is the host's clock around a device synchronisation, over enough repetitions that a sample
//! lasts about 3 ms (each implementation its own count); the implementations and passes are interleaved sample by
//! sample (rotated each time), so a change of clocks or load hits all of them alike. Medians with the range over
//! the samples. The loss alone (`sum(y · r)` and its backward on a variable of `y`'s shape, candle's element-wise
//! ops, the same for both implementations) is timed in the same samples, so `conv_bwd_ms` (training pass −
//! forward − loss) is the convolution's two gradients alone. candle's stock backward can take half a second a layer: where its training pass is over 50 ms it
//! is timed in the first 3 samples only. The device's memory pool keeps freed memory, as the trainer sets it up
//! (`retain_device_pool`), so allocations are the stream-ordered pool's, not the driver's.
//!
//! The JSON it writes (`--json`) names every shape, repetition count and sample count, so that the device check's
//! PyTorch script (`xtask/gpu-check-convs.py`) times exactly the same work with `torch.nn.functional.conv2d`.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use serde::Serialize;
use sluice_kernels::conv;

/// A YOLOv8n convolution: name, input channels, output channels, kernel, stride, input side at imgsz 640, and
/// whether its backward computes the input gradient (the stem's input is the image, which needs none).
struct Layer(&'static str, usize, usize, usize, usize, usize, bool);

/// One of each kind of YOLOv8n's convolutions, from the stem to the detect head, at their sides for 640.
const LAYERS: &[Layer] = &[
    Layer("stem_3x3s2_3to16", 3, 16, 3, 2, 640, false),
    Layer("down_3x3s2_16to32", 16, 32, 3, 2, 320, true),
    Layer("c2f_3x3_16to16", 16, 16, 3, 1, 160, true),
    Layer("c2f_1x1_48to32", 48, 32, 1, 1, 160, true),
    Layer("down_3x3s2_32to64", 32, 64, 3, 2, 160, true),
    Layer("c2f_3x3_32to32", 32, 32, 3, 1, 80, true),
    Layer("c2f_3x3_64to64", 64, 64, 3, 1, 40, true),
    Layer("sppf_1x1_512to256", 512, 256, 1, 1, 20, true),
    Layer("head_3x3_64to80", 64, 80, 3, 1, 80, true),
    Layer("head_1x1_80to80", 80, 80, 1, 1, 80, true),
];

/// Median, least and most of a set of samples (milliseconds per repetition).
#[derive(Debug, Clone, Copy, Serialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    Spread { median, min: v[0], max: v[n - 1] }
}

#[derive(Debug, Serialize)]
struct Timing {
    fwd_ms: Spread,
    fwdbwd_ms: Spread,
    /// Median of (training pass − forward) over the samples.
    bwd_ms: f64,
    bwd_over_fwd: f64,
    /// Median of (training pass − forward − loss) over the samples: the two gradients alone.
    conv_bwd_ms: f64,
    conv_bwd_over_fwd: f64,
    fwd_tflops: f64,
}

#[derive(Debug, Serialize)]
struct Row {
    layer: &'static str,
    dtype: String,
    /// `[n, c, h, w, o, k, stride, pad]`.
    geom: [usize; 8],
    input_grad: bool,
    fwd_gflop: f64,
    /// Repetitions per sample of Sluice's passes (the PyTorch script uses the same).
    reps: usize,
    candle_reps: usize,
    /// The loss's element-wise ops and their backward alone (candle's; both implementations run them).
    loss_ms: Option<Spread>,
    sluice: Option<Timing>,
    candle: Option<Timing>,
    /// candle's training pass over Sluice's (how much faster Sluice's is).
    candle_over_sluice_fwdbwd: Option<f64>,
    candle_over_sluice_fwd: Option<f64>,
    errors: Vec<String>,
}

/// Seconds per repetition of `f`, `reps` times between two synchronisations.
fn per_rep(gpu: &Device, reps: usize, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    gpu.synchronize()?;
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    gpu.synchronize()?;
    Ok(t.elapsed().as_secs_f64() / reps as f64)
}

type Conv = fn(&Tensor, &Tensor, usize, usize) -> candle_core::Result<Tensor>;

fn sluice_conv(x: &Tensor, w: &Tensor, s: usize, p: usize) -> candle_core::Result<Tensor> {
    conv::conv2d(x, w, s, p)
}

fn candle_conv(x: &Tensor, w: &Tensor, s: usize, p: usize) -> candle_core::Result<Tensor> {
    x.conv2d(w, p, s, 1, 1)
}

/// The two passes of one implementation on one layer's tensors.
struct Passes<'a> {
    conv: Conv,
    x: &'a Tensor,
    xv: Option<&'a Var>,
    wv: &'a Var,
    r: &'a Tensor,
    s: usize,
    p: usize,
}

impl Passes<'_> {
    fn fwd(&self) -> Result<()> {
        let y = (self.conv)(self.x, self.wv.as_tensor(), self.s, self.p)?;
        drop(y);
        Ok(())
    }

    fn fwdbwd(&self) -> Result<()> {
        let x = self.xv.map_or(self.x, |v| v.as_tensor());
        let y = (self.conv)(x, self.wv.as_tensor(), self.s, self.p)?;
        let g = (y * self.r)?.sum_all()?.backward()?;
        g.get(self.wv.as_tensor()).context("no weight gradient")?;
        if let Some(xv) = self.xv {
            g.get(xv.as_tensor()).context("no input gradient")?;
        }
        Ok(())
    }
}

/// `gpu convs`.
pub(super) fn convs(ordinal: usize, batch: usize, imgsz: usize, samples: usize, json: Option<&Path>) -> Result<()> {
    let gpu = Device::new_cuda(ordinal).context("opening the CUDA device")?;
    sluice_transfer::retain_device_pool(&gpu).context("the device memory pool")?;
    let samples = samples.max(3);
    let mut rows = Vec::new();
    println!(
        "{:<20} {:<5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6}",
        "layer", "dtype", "reps", "sl fwd", "cd fwd", "sl f+b", "cd f+b", "loss", "cd/sl", "sl b/f", "TF/s"
    );
    for dtype in [DType::F32, DType::BF16] {
        for &Layer(layer, c, o, k, s, side640, input_grad) in LAYERS {
            let side = (side640 * imgsz / 640).max(k);
            let p = k / 2;
            let ho = (side + 2 * p - k) / s + 1;
            let geom = [batch, c, side, side, o, k, s, p];
            let fwd_gflop = 2.0 * (batch * o * ho * ho * c * k * k) as f64 / 1e9;
            let mut row = Row {
                layer,
                dtype: format!("{dtype:?}").to_lowercase(),
                geom,
                input_grad,
                fwd_gflop,
                reps: 1,
                candle_reps: 1,
                loss_ms: None,
                sluice: None,
                candle: None,
                candle_over_sluice_fwdbwd: None,
                candle_over_sluice_fwd: None,
                errors: Vec::new(),
            };
            let x = Tensor::randn(0f32, 1.0, (batch, c, side, side), &gpu)?.to_dtype(dtype)?;
            let w = Tensor::randn(0f32, 0.1, (o, c, k, k), &gpu)?.to_dtype(dtype)?;
            let r = Tensor::randn(0f32, 1.0, (batch, o, ho, ho), &gpu)?.to_dtype(dtype)?;
            let (xv, wv) = (Var::from_tensor(&x)?, Var::from_tensor(&w)?);
            let yv = Var::from_tensor(&Tensor::randn(0f32, 1.0, (batch, o, ho, ho), &gpu)?.to_dtype(dtype)?)?;
            let loss = || -> Result<()> {
                let g = (yv.as_tensor() * &r)?.sum_all()?.backward()?;
                g.get(yv.as_tensor()).context("no gradient of y")?;
                Ok(())
            };
            loss()?;
            let impls: [(&str, Conv); 2] = [("sluice", sluice_conv), ("candle", candle_conv)];
            let passes: Vec<Passes> = impls
                .iter()
                .map(|&(_, conv)| Passes { conv, x: &x, xv: input_grad.then_some(&xv), wv: &wv, r: &r, s, p })
                .collect();
            // Warm up (the first call of a shape makes cuDNN's plans), drop an implementation that fails, and size
            // each implementation's repetitions from its training pass.
            let mut ok = [true; 2];
            let mut pass_s = [0f64; 2];
            for (i, ps) in passes.iter().enumerate() {
                let warm = (|| -> Result<f64> {
                    for _ in 0..2 {
                        ps.fwd()?;
                        ps.fwdbwd()?;
                    }
                    per_rep(&gpu, 1, &mut || ps.fwdbwd())
                })();
                match warm {
                    Ok(t) => pass_s[i] = t,
                    Err(e) => {
                        ok[i] = false;
                        row.errors.push(format!("{}: {e:#}", impls[i].0));
                    }
                }
            }
            let reps = pass_s.map(|t| ((3e-3 / t.max(1e-6)).ceil() as usize).clamp(1, 200));
            (row.reps, row.candle_reps) = (reps[0], reps[1]);
            let wanted = pass_s.map(|t| if t > 0.05 { 3.min(samples) } else { samples });
            // times[impl][pass] in ms per repetition, one entry per sample; the loss alone in Sluice's repetitions.
            let mut times = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
            let mut loss_times = Vec::new();
            for sample in 0..samples {
                loss_times.push(per_rep(&gpu, reps[0], &mut || loss())? * 1e3);
                for j in 0..4 {
                    let slot = (j + sample) % 4;
                    let (i, pass) = (slot / 2, slot % 2);
                    if !ok[i] || sample >= wanted[i] {
                        continue;
                    }
                    let ps = &passes[i];
                    let t = if pass == 0 {
                        per_rep(&gpu, reps[i], &mut || ps.fwd())
                    } else {
                        per_rep(&gpu, reps[i], &mut || ps.fwdbwd())
                    };
                    match t {
                        Ok(t) => times[i][pass].push(t * 1e3),
                        Err(e) => {
                            ok[i] = false;
                            row.errors.push(format!("{}: {e:#}", impls[i].0));
                        }
                    }
                }
            }
            let timing = |i: usize| -> Option<Timing> {
                let [f, fb] = &times[i];
                if !ok[i] || f.len() != wanted[i] || fb.len() != wanted[i] {
                    return None;
                }
                let fwd = spread(f.clone());
                let fwdbwd = spread(fb.clone());
                let bwd = spread(fb.iter().zip(f).map(|(a, b)| a - b).collect()).median;
                let conv_bwd = spread(fb.iter().zip(f).zip(&loss_times).map(|((a, b), l)| a - b - l).collect()).median;
                Some(Timing {
                    fwd_ms: fwd,
                    fwdbwd_ms: fwdbwd,
                    bwd_ms: bwd,
                    bwd_over_fwd: bwd / fwd.median,
                    conv_bwd_ms: conv_bwd,
                    conv_bwd_over_fwd: conv_bwd / fwd.median,
                    fwd_tflops: fwd_gflop / fwd.median,
                })
            };
            row.loss_ms = Some(spread(loss_times.clone()));
            row.sluice = timing(0);
            row.candle = timing(1);
            if let (Some(sl), Some(cd)) = (&row.sluice, &row.candle) {
                row.candle_over_sluice_fwdbwd = Some(cd.fwdbwd_ms.median / sl.fwdbwd_ms.median);
                row.candle_over_sluice_fwd = Some(cd.fwd_ms.median / sl.fwd_ms.median);
            }
            let ms =
                |t: &Option<Timing>, f: fn(&Timing) -> f64| t.as_ref().map_or("-".into(), |t| format!("{:.3}", f(t)));
            println!(
                "{:<20} {:<5} {:>4} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6}{}",
                layer,
                row.dtype,
                row.reps,
                ms(&row.sluice, |t| t.fwd_ms.median),
                ms(&row.candle, |t| t.fwd_ms.median),
                ms(&row.sluice, |t| t.fwdbwd_ms.median),
                ms(&row.candle, |t| t.fwdbwd_ms.median),
                row.loss_ms.map_or("-".into(), |l| format!("{:.3}", l.median)),
                row.candle_over_sluice_fwdbwd.map_or("-".into(), |v| format!("{v:.2}")),
                ms(&row.sluice, |t| t.conv_bwd_over_fwd),
                ms(&row.sluice, |t| t.fwd_tflops),
                if row.errors.is_empty() { String::new() } else { format!("  errors: {}", row.errors.join("; ")) },
            );
            rows.push(row);
        }
    }
    if let Some(p) = json {
        let v = serde_json::json!({
            "batch": batch,
            "imgsz": imgsz,
            "samples": samples,
            "timing": "host clock around device synchronisation; ms per repetition; median and range over samples",
            "fwdbwd": "y = conv(x, w); sum(y * r).backward(): weight gradient, and input gradient where input_grad",
            "rows": rows,
        });
        std::fs::write(p, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
