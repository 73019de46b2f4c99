//! The optimizer step over every parameter at once: the gradient norm and clip factor, the SGD / Adam / AdamW
//! update and the EMA, each one pass over all tensors instead of a chain of element-wise ops per tensor.
//!
//! Composed from candle's ops, one optimizer step of YOLOv8n is some four thousand small kernels on a GPU (per
//! tensor: its norm, the clip factor, eight to twelve update ops, the masks, three or four EMA ops, each a launch and
//! a fresh allocation), which costs more than the forward pass of a small model. On a CUDA device [`MultiTensor`]
//! runs four kernels (`kernels.cu`, compiled once per device with NVRTC) and one small copy of the step's table
//! of gradient addresses and constants through pinned memory, with nothing read back; parameters, optimizer state
//! and EMA are updated in place. Every operation is the composed ops' own, rounding included (the kernels write
//! each with explicit rounding, and an FMA where candle's `affine` contracts to one), so the step is theirs; only
//! the norm sums in a different order.
//!
//! On the CPU the same type runs the same arithmetic per element ([`twin`]), so the driver's use of it is tested
//! here; the trainer uses it on CUDA devices, where the launches are the cost. the device check `gpu smoke` compares the
//! kernels with the composed ops on the CPU.

use candle_core::{DType, Device, Result, Tensor, Var, bail};

#[cfg(feature = "cuda")]
mod cuda;

/// The update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// `torch.optim.SGD(nesterov=True)`, momentum and weight decay as given.
    SgdNesterov,
    /// `torch.optim.Adam` (weight decay added to the gradient).
    Adam,
    /// `torch.optim.AdamW` (decoupled weight decay).
    AdamW,
}

impl Rule {
    #[cfg(feature = "cuda")]
    fn code(self) -> i32 {
        match self {
            Rule::SgdNesterov => 0,
            Rule::Adam => 1,
            Rule::AdamW => 2,
        }
    }
}

/// One parameter's hyper-parameters at this step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hyper {
    /// Learning rate.
    pub lr: f64,
    /// SGD momentum, or Adam's β1.
    pub momentum: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Adam's step count after this step (its bias corrections); unused by SGD.
    pub step: u64,
}

/// Adam's β2 and ε (torch's defaults, as the trainer uses).
pub const ADAM_BETA2: f64 = 0.999;
/// Adam's ε.
pub const ADAM_EPS: f64 = 1e-8;

/// The eight f32 constants of one tensor's update, as candle's `affine` rounds its f64 factors to f32.
/// SGD: `[wd, momentum, −lr, has_wd, has_momentum, 0, 0, 0]`; Adam / AdamW:
/// `[wd, 1 − β1, 1 − β2, β2, 1/√(1 − β2ᵗ), ε, −lr/(1 − β1ᵗ), 1 − lr·wd]`.
pub fn consts(rule: Rule, h: Hyper) -> [f32; 8] {
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    match rule {
        Rule::SgdNesterov => [
            h.weight_decay as f32,
            h.momentum as f32,
            -h.lr as f32,
            flag(h.weight_decay != 0.0),
            flag(h.momentum != 0.0),
            0.0,
            0.0,
            0.0,
        ],
        Rule::Adam | Rule::AdamW => {
            let t = h.step as f64;
            let (bc1, bc2) = (1.0 - h.momentum.powf(t), 1.0 - ADAM_BETA2.powf(t));
            [
                h.weight_decay as f32,
                (1.0 - h.momentum) as f32,
                (1.0 - ADAM_BETA2) as f32,
                ADAM_BETA2 as f32,
                (1.0 / bc2.sqrt()) as f32,
                ADAM_EPS as f32,
                -(h.lr / bc1) as f32,
                (1.0 - h.lr * h.weight_decay) as f32,
            ]
        }
    }
}

/// The per-element arithmetic of the kernels on host slices (with the CPU's rounding: `x·mul + add` as two
/// operations, where the device contracts the one `affine` with an addend, Adam's denominator, into an FMA as
/// candle's kernel does).
pub mod twin {
    use super::Rule;

    /// `[total, clip coefficient, finite, 1/scale]` of the gradients: torch's `clip_grad_norm_` total (the norm of
    /// the per-tensor f32 norms) of the gradients divided by `scale`.
    pub fn norm(grads: &[&[f32]], scale: Option<f32>, max_norm: f32) -> [f32; 4] {
        let inv = scale.map_or(1.0, |s| (1.0 / f64::from(s)) as f32);
        let s: f64 = grads
            .iter()
            .map(|g| {
                let sum: f64 = g.iter().map(|v| f64::from(*v) * f64::from(*v)).sum();
                let nt = (sum as f32).sqrt() * inv;
                f64::from(nt) * f64::from(nt)
            })
            .sum();
        let total = (s as f32).sqrt();
        let coef = (max_norm / (total + 1e-6)).min(1.0);
        [total, coef, if total.is_finite() { 1.0 } else { 0.0 }, inv]
    }

    /// One tensor's update in place (`b1` unused by SGD), given [`norm`]'s output; nothing changes unless finite.
    pub fn update(rule: Rule, p: &mut [f32], g: &[f32], b0: &mut [f32], b1: &mut [f32], c: &[f32; 8], out: [f32; 4]) {
        if out[2] == 0.0 {
            return;
        }
        let (coef, inv) = (out[1], out[3]);
        for i in 0..p.len() {
            let mut gi = g[i] * inv * coef;
            let mut pi = p[i];
            if rule == Rule::SgdNesterov {
                let mut d = if c[3] != 0.0 { gi + pi * c[0] } else { gi };
                if c[4] != 0.0 {
                    let buf = b0[i] * c[1] + d;
                    b0[i] = buf;
                    d += buf * c[1];
                }
                p[i] = pi + d * c[2];
            } else {
                if c[0] != 0.0 {
                    if rule == Rule::AdamW {
                        pi *= c[7];
                    } else {
                        gi += p[i] * c[0];
                    }
                }
                let m = b0[i] + (gi - b0[i]) * c[1];
                let v = b1[i] * c[3] + gi * gi * c[2];
                let denom = v.sqrt() * c[4] + c[5];
                b0[i] = m;
                b1[i] = v;
                p[i] = pi + (m / denom) * c[6];
            }
        }
    }

    /// torch's `lerp_(model, w)` in place, with its two branches.
    pub fn ema(e: &mut [f32], m: &[f32], w: f32) {
        let small = w.abs() < 0.5;
        for (e, m) in e.iter_mut().zip(m) {
            let diff = m - *e;
            *e = if small { *e + diff * w } else { m + diff * (w - 1.0) };
        }
    }
}

/// The fused optimizer passes on one device (see the module header).
pub struct MultiTensor {
    device: Device,
    #[cfg(feature = "cuda")]
    gpu: Option<cuda::Gpu>,
}

impl std::fmt::Debug for MultiTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiTensor").field("device", &self.device).finish()
    }
}

/// An f32 tensor's values (any layout).
fn host(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()
}

fn check(what: &str, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        bail!("multi-tensor step: {what} must be f32, got {:?}", t.dtype());
    }
    Ok(())
}

impl MultiTensor {
    /// The passes for `device` (on CUDA the kernels are compiled on first use).
    pub fn new(device: &Device) -> Result<Self> {
        Ok(Self {
            device: device.clone(),
            #[cfg(feature = "cuda")]
            gpu: if device.is_cuda() { Some(cuda::Gpu::new(device)?) } else { None },
        })
    }

    /// `[total, clip coefficient, finite (1 or 0), 1/scale]` (f32, on the device) of `grads` divided by the loss
    /// `scale` (a scalar tensor, or none), for clipping to `max_norm`.
    pub fn grad_norm(&mut self, grads: &[&Tensor], scale: Option<&Tensor>, max_norm: f32) -> Result<Tensor> {
        for g in grads {
            check("a gradient", g)?;
            if !g.is_contiguous() {
                bail!("multi-tensor step: a gradient is not contiguous");
            }
        }
        #[cfg(feature = "cuda")]
        if let Some(gpu) = self.gpu.as_mut() {
            return gpu.grad_norm(grads, scale, max_norm);
        }
        let twin = || {
            let host_grads = grads.iter().map(|g| host(g)).collect::<Result<Vec<_>>>()?;
            let views: Vec<&[f32]> = host_grads.iter().map(Vec::as_slice).collect();
            let scale = scale.map(|s| s.to_dtype(DType::F32)?.flatten_all()?.get(0)?.to_scalar::<f32>()).transpose()?;
            Tensor::new(&twin::norm(&views, scale, max_norm), &self.device)
        };
        if !crate::ledger::model_cuda() {
            return twin();
        }
        // The CUDA path: the tensor table's upload, the per-chunk partial sums and their reduction.
        let out = candle_core::ledger::paused(twin)?;
        crate::ledger::record_kernel("multi_tensor:grad_norm", 3, grads, &[&out]);
        Ok(out)
    }

    /// The update of every parameter where `norm` (from [`MultiTensor::grad_norm`]) says the gradients are finite:
    /// `params[i]` from `grads[i]` (multiplied by the clip coefficient and 1/scale) with `state0[i]` (the momentum
    /// buffer or Adam's `exp_avg`) and, for Adam, `state1[i]` (`exp_avg_sq`); state that is `None` starts at zero
    /// (which is the first step's value) and is `Some` afterwards. `consts[i]` is [`consts`] for the parameter.
    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &mut self,
        rule: Rule,
        params: &[&Var],
        grads: &[&Tensor],
        state0: &mut [Option<Tensor>],
        state1: &mut [Option<Tensor>],
        consts: &[[f32; 8]],
        norm: &Tensor,
    ) -> Result<()> {
        let n = params.len();
        if grads.len() != n
            || state0.len() != n
            || consts.len() != n
            || (rule != Rule::SgdNesterov && state1.len() != n)
        {
            bail!("multi-tensor step: {n} parameters with {} gradients and {} states", grads.len(), state0.len());
        }
        for (p, g) in params.iter().zip(grads) {
            check("a parameter", p.as_tensor())?;
            if !g.is_contiguous() || !p.as_tensor().is_contiguous() {
                bail!("multi-tensor step: a parameter or gradient is not contiguous");
            }
            if p.dims() != g.dims() {
                bail!("multi-tensor step: a gradient of shape {:?} for a parameter of {:?}", g.dims(), p.dims());
            }
        }
        // Zero state is the first step's: `m·0 + d = d` (SGD), `0 + (g − 0)(1 − β1)` and `0·β2 + g²(1 − β2)` (Adam).
        let adam = rule != Rule::SgdNesterov;
        for (i, p) in params.iter().enumerate() {
            if state0[i].is_none() {
                state0[i] = Some(p.as_tensor().zeros_like()?);
            }
            if adam && state1[i].is_none() {
                state1[i] = Some(p.as_tensor().zeros_like()?);
            }
        }
        #[cfg(feature = "cuda")]
        if let Some(gpu) = self.gpu.as_mut() {
            return gpu.update(rule, params, grads, state0, state1, consts, norm);
        }
        if crate::ledger::model_cuda() {
            // The CUDA path: the table's upload and one kernel updating every tensor in place.
            candle_core::ledger::paused(|| self.update_twin(rule, params, grads, state0, state1, consts, norm))?;
            let mut read: Vec<&Tensor> = grads.to_vec();
            let mut written: Vec<&Tensor> = params.iter().map(|p| p.as_tensor()).collect();
            written.extend(state0.iter().chain(state1.iter()).flatten());
            read.extend(written.iter().copied());
            crate::ledger::record_inplace("multi_tensor:update", 2, &read, &written);
            return Ok(());
        }
        self.update_twin(rule, params, grads, state0, state1, consts, norm)
    }

    #[allow(clippy::too_many_arguments)]
    fn update_twin(
        &mut self,
        rule: Rule,
        params: &[&Var],
        grads: &[&Tensor],
        state0: &mut [Option<Tensor>],
        state1: &mut [Option<Tensor>],
        consts: &[[f32; 8]],
        norm: &Tensor,
    ) -> Result<()> {
        let (n, adam) = (params.len(), rule != Rule::SgdNesterov);
        let out = host(norm)?;
        let out = [out[0], out[1], out[2], out[3]];
        for i in 0..n {
            let mut p = host(params[i].as_tensor())?;
            let g = host(grads[i])?;
            let mut b0 = state0[i].as_ref().map(host).transpose()?.unwrap_or_default();
            let mut b1 = if adam { state1[i].as_ref().map(host).transpose()?.unwrap_or_default() } else { Vec::new() };
            twin::update(rule, &mut p, &g, &mut b0, &mut b1, &consts[i], out);
            let shape = params[i].dims();
            params[i].set(&Tensor::from_vec(p, shape, &self.device)?)?;
            state0[i] = Some(Tensor::from_vec(b0, shape, &self.device)?);
            if adam {
                state1[i] = Some(Tensor::from_vec(b1, shape, &self.device)?);
            }
        }
        Ok(())
    }

    /// The EMA update of every variable, `ema[i] ← lerp(ema[i], model[i], w)`, where `mask` (a
    /// [`MultiTensor::grad_norm`] output) says the step was finite, or always without one.
    pub fn ema(&mut self, ema: &[&Var], model: &[&Tensor], w: f32, mask: Option<&Tensor>) -> Result<()> {
        if ema.len() != model.len() {
            bail!("multi-tensor EMA: {} EMA variables for {} model variables", ema.len(), model.len());
        }
        for (e, m) in ema.iter().zip(model) {
            check("an EMA variable", e.as_tensor())?;
            check("a model variable", m)?;
            if !m.is_contiguous() || !e.as_tensor().is_contiguous() {
                bail!("multi-tensor EMA: a variable is not contiguous");
            }
            if e.dims() != m.dims() {
                bail!("multi-tensor EMA: shapes {:?} and {:?}", e.dims(), m.dims());
            }
        }
        #[cfg(feature = "cuda")]
        if let Some(gpu) = self.gpu.as_mut() {
            return gpu.ema(ema, model, w, mask);
        }
        let twin = || -> Result<()> {
            if let Some(mask) = mask
                && host(mask)?[2] == 0.0
            {
                return Ok(());
            }
            for (e, m) in ema.iter().zip(model) {
                let mut ev = host(e.as_tensor())?;
                twin::ema(&mut ev, &host(m)?, w);
                e.set(&Tensor::from_vec(ev, e.dims(), &self.device)?)?;
            }
            Ok(())
        };
        if !crate::ledger::model_cuda() {
            return twin();
        }
        // The CUDA path: the table's upload and one kernel updating every EMA tensor in place.
        candle_core::ledger::paused(twin)?;
        let written: Vec<&Tensor> = ema.iter().map(|e| e.as_tensor()).collect();
        let mut read: Vec<&Tensor> = model.to_vec();
        read.extend(written.iter().copied());
        crate::ledger::record_inplace("multi_tensor:ema", 2, &read, &written);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The twin against the composed candle ops it stands for (the trainer's optimizer in `sluice-train` holds the
    //! whole driver to them).
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    }

    fn t(v: &[f32]) -> Tensor {
        Tensor::new(v, &Device::Cpu).unwrap()
    }

    fn read(t: &Tensor) -> Vec<f32> {
        t.to_vec1().unwrap()
    }

    /// Composed SGD (Nesterov) and Adam(W) as `sluice-train`'s optimizer writes them, over three steps, against the
    /// twin through [`MultiTensor`] on the CPU: bit for bit.
    #[test]
    fn the_twin_is_the_composed_ops() {
        for rule in [Rule::SgdNesterov, Rule::Adam, Rule::AdamW] {
            let p0 = values(37, 1, 2.0);
            let var = Var::new(p0.as_slice(), &Device::Cpu).unwrap();
            let mut mt = MultiTensor::new(&Device::Cpu).unwrap();
            let (mut s0, mut s1) = (vec![None], vec![None]);
            let (mut p, mut b0, mut b1): (Tensor, Option<Tensor>, Option<Tensor>) = (t(&p0), None, None);
            for step in 1..=3u64 {
                let g = values(37, 10 + step, 3.0);
                let h = Hyper { lr: 0.01 * step as f64, momentum: 0.9, weight_decay: 5e-4, step };
                let c = consts(rule, h);
                let norm = mt.grad_norm(&[&t(&g)], None, 10.0).unwrap();
                mt.update(rule, &[&var], &[&t(&g)], &mut s0, &mut s1, &[c], &norm).unwrap();
                // The composed ops (clip coefficient 1 here: the norm is under 10).
                assert_eq!(read(&norm)[1], 1.0);
                let g = t(&g);
                match rule {
                    Rule::SgdNesterov => {
                        let d = (&g + p.affine(h.weight_decay, 0.0).unwrap()).unwrap();
                        let buf = match b0.take() {
                            None => d.clone(),
                            Some(b) => (b.affine(h.momentum, 0.0).unwrap() + &d).unwrap(),
                        };
                        let d = (d + buf.affine(h.momentum, 0.0).unwrap()).unwrap();
                        b0 = Some(buf);
                        p = (&p + d.affine(-h.lr, 0.0).unwrap()).unwrap();
                    }
                    Rule::Adam | Rule::AdamW => {
                        let (mut q, mut g) = (p.clone(), g.clone());
                        if rule == Rule::AdamW {
                            q = q.affine(1.0 - h.lr * h.weight_decay, 0.0).unwrap();
                        } else {
                            g = (g + p.affine(h.weight_decay, 0.0).unwrap()).unwrap();
                        }
                        let m = match b0.take() {
                            None => g.affine(1.0 - h.momentum, 0.0).unwrap(),
                            Some(m) => (&m + (&g - &m).unwrap().affine(1.0 - h.momentum, 0.0).unwrap()).unwrap(),
                        };
                        let g2 = g.sqr().unwrap().affine(1.0 - ADAM_BETA2, 0.0).unwrap();
                        let v = match b1.take() {
                            None => g2,
                            Some(v) => (v.affine(ADAM_BETA2, 0.0).unwrap() + g2).unwrap(),
                        };
                        let t = step as f64;
                        let (bc1, bc2) = (1.0 - h.momentum.powf(t), 1.0 - ADAM_BETA2.powf(t));
                        let denom = v.sqrt().unwrap().affine(1.0 / bc2.sqrt(), ADAM_EPS).unwrap();
                        p = (q + m.div(&denom).unwrap().affine(-h.lr / bc1, 0.0).unwrap()).unwrap();
                        b0 = Some(m);
                        b1 = Some(v);
                    }
                }
                assert_eq!(read(var.as_tensor()), read(&p), "{rule:?} step {step}");
                assert_eq!(read(s0[0].as_ref().unwrap()), read(b0.as_ref().unwrap()), "{rule:?} step {step}");
            }
        }
    }

    #[test]
    fn the_norm_clips_unscales_and_masks() {
        let (a, b) = (values(100, 3, 40.0), values(7, 4, 40.0));
        let scaled: Vec<Vec<f32>> = [&a, &b].iter().map(|v| v.iter().map(|x| x * 1024.0).collect()).collect();
        let want = a.iter().chain(&b).map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let mut mt = MultiTensor::new(&Device::Cpu).unwrap();
        let scale = Tensor::new(1024f32, &Device::Cpu).unwrap();
        let out = read(&mt.grad_norm(&[&t(&scaled[0]), &t(&scaled[1])], Some(&scale), 10.0).unwrap());
        assert!((f64::from(out[0]) - want).abs() < 1e-5 * want, "{out:?} vs {want}");
        assert_eq!(out[1], 10.0 / (out[0] + 1e-6));
        assert_eq!((out[2], out[3]), (1.0, 1.0 / 1024.0));
        // A non-finite gradient: the step and a masked EMA change nothing.
        let bad = t(&[1.0, f32::INFINITY]);
        let norm = mt.grad_norm(&[&bad], None, 10.0).unwrap();
        assert_eq!(read(&norm)[2], 0.0);
        let var = Var::new(&[0.5f32, 0.25], &Device::Cpu).unwrap();
        let (mut s0, mut s1) = (vec![None], vec![None]);
        let h = Hyper { lr: 0.1, momentum: 0.9, weight_decay: 0.0, step: 1 };
        mt.update(Rule::AdamW, &[&var], &[&bad], &mut s0, &mut s1, &[consts(Rule::AdamW, h)], &norm).unwrap();
        assert_eq!(read(var.as_tensor()), [0.5, 0.25]);
        assert_eq!(read(s0[0].as_ref().unwrap()), [0.0, 0.0], "state starts at zero and stays");
        let ema = Var::new(&[1.0f32, 2.0], &Device::Cpu).unwrap();
        mt.ema(&[&ema], &[var.as_tensor()], 0.1, Some(&norm)).unwrap();
        assert_eq!(read(ema.as_tensor()), [1.0, 2.0]);
        mt.ema(&[&ema], &[var.as_tensor()], 0.1, None).unwrap();
        assert_eq!(read(ema.as_tensor()), [1.0 + (0.5 - 1.0) * 0.1, 2.0 + (0.25 - 2.0) * 0.1]);
    }
}
