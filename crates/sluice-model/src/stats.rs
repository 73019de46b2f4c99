//! BatchNorm's running statistics in a training forward, updated for the whole model at once.
//!
//! Each BatchNorm layer of a training forward reports its batch mean and unbiased variance to the model's
//! [`StatsSink`] instead of updating its running statistics itself; when the forward ends the model commits them.
//! A model keeps the running statistics of the layers that run together in one forward as consecutive parts of
//! one buffer, each layer's running mean then its running variance ([`StatsPack`]), so the commit is one gather and
//! the momentum update over the buffer: a few kernels per forward instead of seven per layer. The order is that of
//! the CUDA kernel's statistics (each layer's mean and variance side by side in one tensor), so the gather copies
//! each layer's pair at once. The values are those of the per-layer update, bit for bit (the same element-wise ops
//! on the same values; the means are multiplied by an exact 1). A forward that reports another set of layers (a part of
//! the model, a layer twice) is committed layer by layer, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::{Result, Tensor, Var};

use crate::layers::BN_MOMENTUM;
use crate::params::pack;

/// One layer's report: its running statistics, the batch's mean and (biased) variance (detached), and the factor
/// `n / (n − 1)` that makes the variance unbiased (`n` values per channel).
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub(crate) key: String,
    pub(crate) running_mean: Var,
    pub(crate) running_var: Var,
    pub(crate) mean: Tensor,
    pub(crate) var: Tensor,
    pub(crate) unbiased_factor: f64,
}

/// `running · (1 − momentum) + batch · momentum` (PyTorch's running-statistics update).
fn momentum_update(running: &Tensor, batch: &Tensor) -> Result<Tensor> {
    (running * (1.0 - BN_MOMENTUM))? + (batch * BN_MOMENTUM)?
}

impl Report {
    /// The update of this layer alone.
    fn commit(self) -> Result<()> {
        let rm = momentum_update(self.running_mean.as_tensor(), &self.mean)?;
        let rv = momentum_update(self.running_var.as_tensor(), &(&self.var * self.unbiased_factor)?)?;
        self.running_mean.set_owned(rm)?;
        self.running_var.set_owned(rv)
    }
}

/// Where a model's BatchNorm layers report during a training forward; shared by every layer of one model.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatsSink(Arc<Mutex<Vec<Report>>>);

impl StatsSink {
    pub(crate) fn report(&self, report: Report) {
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        self.0.lock().unwrap().push(report);
    }

    /// The reports so far, leaving none.
    pub(crate) fn take(&self) -> Vec<Report> {
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Variables stored back to back in one variable: a buffer and its parts, or one variable alone.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The names of the variables it holds, in order.
    pub names: Vec<String>,
    /// The variable holding them.
    pub var: Var,
}

/// The factors' bits and the per-element factor tensor.
type Factors = (Vec<u64>, Tensor);

/// A layer's name prefix with its running mean and running variance.
pub(crate) type LayerStats = (String, Var, Var);

/// The running statistics of a set of layers that run together, as parts of one buffer in the order of `keys`
/// (the layers' name prefixes): each layer's running mean, then its running variance.
#[derive(Debug, Clone)]
pub(crate) struct StatsPack {
    keys: HashMap<String, usize>,
    buffer: Var,
    /// The variable names of the buffer's parts, in order.
    names: Vec<String>,
    /// Each element's factor for the last input geometry (1 over a layer's means, its unbiasing factor over its
    /// variances), with the factors' bits: made again only when the geometry changes.
    factors: Arc<Mutex<Option<Factors>>>,
}

impl StatsPack {
    /// The pack of `layers` (`(prefix, running_mean, running_var)`), with their current values; returns it with
    /// each layer's two parts, which take the place of its variables.
    pub(crate) fn new(layers: &[LayerStats]) -> Result<(Self, Vec<LayerStats>)> {
        let (buffer, parts) = pack(&layers.iter().flat_map(|(_, m, v)| [m, v]).collect::<Vec<_>>())?;
        let parts = layers
            .iter()
            .zip(parts.chunks_exact(2))
            .map(|((key, _, _), mv)| (key.clone(), mv[0].clone(), mv[1].clone()))
            .collect();
        let keys = layers.iter().enumerate().map(|(i, (k, _, _))| (k.clone(), i)).collect();
        let names =
            layers.iter().flat_map(|(k, _, _)| [format!("{k}.running_mean"), format!("{k}.running_var")]).collect();
        let factors = Arc::new(Mutex::new(None));
        Ok((Self { keys, buffer, names, factors }, parts))
    }

    /// The buffer as a segment.
    pub(crate) fn segment(&self) -> Segment {
        Segment { names: self.names.clone(), var: self.buffer.clone() }
    }

    /// The per-element factors of `ordered` (this pack's layers in order): 1 over each layer's means, its
    /// unbiasing factor over its variances, as `var · factor` would round it (converted from f64 to the buffer's
    /// dtype).
    fn unbiasing(&self, ordered: &[Report]) -> Result<Tensor> {
        let bits: Vec<u64> = ordered.iter().map(|r| r.unbiased_factor.to_bits()).collect();
        #[allow(clippy::unwrap_used)] // A poisoned lock means another thread panicked holding it.
        let mut cached = self.factors.lock().unwrap();
        if let Some((b, t)) = cached.as_ref()
            && *b == bits
        {
            return Ok(t.clone());
        }
        let mut values = Vec::with_capacity(self.buffer.elem_count());
        for r in ordered {
            values.extend(std::iter::repeat_n(1.0, r.mean.elem_count()));
            values.extend(std::iter::repeat_n(r.unbiased_factor, r.var.elem_count()));
        }
        let t = Tensor::from_vec(values, self.buffer.elem_count(), &candle_core::Device::Cpu)?
            .to_dtype(self.buffer.dtype())?
            .to_device(self.buffer.device())?;
        *cached = Some((bits, t.clone()));
        Ok(t)
    }

    /// The reports in this pack's order when they are exactly its layers, each once; otherwise the reports as
    /// they came.
    fn order(&self, reports: Vec<Report>) -> std::result::Result<Vec<Report>, Vec<Report>> {
        if reports.len() != self.keys.len() {
            return Err(reports);
        }
        let mut seen = vec![false; reports.len()];
        for r in &reports {
            match self.keys.get(&r.key) {
                Some(&i) if !seen[i] => seen[i] = true,
                _ => return Err(reports),
            }
        }
        let mut slots: Vec<Option<Report>> = vec![None; reports.len()];
        for r in reports {
            if let Some(&i) = self.keys.get(&r.key) {
                slots[i] = Some(r);
            }
        }
        Ok(slots.into_iter().flatten().collect())
    }
}

/// Commits the reports of one forward: over a pack's buffers when they are exactly one pack's layers, layer by
/// layer otherwise.
pub(crate) fn commit(packs: &[StatsPack], mut reports: Vec<Report>) -> Result<()> {
    if reports.is_empty() {
        return Ok(());
    }
    for pack in packs {
        match pack.order(reports) {
            Ok(ordered) => {
                let parts = ordered
                    .iter()
                    .flat_map(|r| [r.mean.flatten_all(), r.var.flatten_all()])
                    .collect::<Result<Vec<_>>>()?;
                let batch = Tensor::cat(&parts, 0)?.mul(&pack.unbiasing(&ordered)?)?;
                return pack.buffer.set_owned(momentum_update(pack.buffer.as_tensor(), &batch)?);
            }
            Err(back) => reports = back,
        }
    }
    reports.into_iter().try_for_each(Report::commit)
}
