//! The cost ledger of one training step and one validation batch (`sluice bench step-cost`): the trainer's own
//! step (train-mode forward, the device loss path, backward, the optimizer step with its clipping on the device,
//! the EMA) and validation's per-batch device work, run once on the CPU with candle's op ledger recording
//! ([`candle_core::ledger`], feature `ledger`). Each op is what the CUDA path dispatches: the device loss path,
//! the device-side clipping and non-finite skip, and the device-side shrink are taken as on a GPU, so the ledger
//! models the GPU step without a GPU. It is deterministic: the same code gives the same ledger, so it is compared
//! with PyTorch's (the peer script `benches/step_cost_pytorch.py` writes the same JSON) and held to a committed
//! budget by a test.
//!
//! Not in the ledger: the batch's transfer (uint8 → float on the device happens before the step, as
//! Ultralytics' `preprocess_batch` is outside the PyTorch peer's record) and the BatchNorm folding validation
//! does once per pass.

use std::collections::BTreeMap;

use candle_core::ledger::{self, OpRecord};
use candle_core::{DType, Device};
use serde::{Deserialize, Serialize};
use sluice_core::{Batch, BatchShape, BoxXyxy, Target, Transfer};
use sluice_eval::{NmsParams, ShrinkParams};
use sluice_model::{DetectionLoss, Mode, Yolo};
use sluice_transfer::{DeviceTransfer, Readback};

use sluice_infer::DevicePaths;
use sluice_infer::loss_path::{Items, step_loss};
use sluice_infer::validate::{BatchWork, batch_on_device};
use sluice_optim::{OptimSettings, Optimization, OptimizerKind, RunShape, ScalerSettings, StepOptions, StepPath};

mod error;

pub use error::{LedgerError, Result};

/// The phases of a training step, in order, then the validation batch.
pub const PHASES: [&str; 6] = ["forward", "loss", "backward", "optimizer", "ema", "val"];

/// What to record.
#[derive(Debug, Clone)]
pub struct StepCostOptions {
    /// `yolov8n` … `yolo26x` or a model YAML.
    pub model: String,
    /// Classes.
    pub nc: usize,
    /// Square input side (multiple of 32).
    pub imgsz: usize,
    /// Images per batch.
    pub batch: usize,
    /// Mixed precision: the convolutions' dtype under autocast (`F16` with loss scaling, or `BF16`), or f32.
    pub amp: Option<DType>,
    /// The optimizer (`Auto` is not resolved here: pass the one to record).
    pub optimizer: OptimizerKind,
    /// Boxes per image of the synthetic labels.
    pub boxes_per_image: usize,
    /// The opt-in device paths to record instead of the verified defaults.
    pub device_paths: DevicePaths,
    /// BatchNorm+SiLU composed from candle's ops instead of its CUDA kernels: the step of the first device run,
    /// for calibrating the ledger against it.
    pub composed_batch_norm: bool,
}

impl StepCostOptions {
    /// YOLOv8n at 640, batch 32, f32, SGD, 8 boxes per image, the verified defaults.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            nc: 80,
            imgsz: 640,
            batch: 32,
            amp: None,
            optimizer: OptimizerKind::Sgd,
            boxes_per_image: 8,
            device_paths: DevicePaths::default(),
            composed_batch_norm: false,
        }
    }
}

/// One phase's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseCost {
    /// `forward`, `loss`, `backward`, `optimizer`, `ema`, `val`, or `train` for the five training phases.
    pub phase: String,
    /// Ops recorded.
    pub ops: u64,
    /// Kernel launches they stand for.
    pub launches: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Fresh buffers.
    pub allocs: u64,
    /// Their bytes.
    pub alloc_bytes: u64,
    /// Reads back to the host.
    pub host_reads: u64,
}

impl PhaseCost {
    fn add(&mut self, r: &OpRecord) {
        self.ops += 1;
        self.launches += r.launches;
        self.bytes_read += r.bytes_read;
        self.bytes_written += r.bytes_written;
        self.allocs += r.allocs;
        self.alloc_bytes += r.alloc_bytes;
        self.host_reads += r.host_reads;
    }

    fn sum(&mut self, o: &PhaseCost) {
        self.ops += o.ops;
        self.launches += o.launches;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.allocs += o.allocs;
        self.alloc_bytes += o.alloc_bytes;
        self.host_reads += o.host_reads;
    }

    /// Bytes read and written.
    pub fn bytes(&self) -> u64 {
        self.bytes_read + self.bytes_written
    }
}

/// Records summed: how many, their launches and their bytes read and written.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    count: u64,
    launches: u64,
    bytes: u64,
}

impl Tally {
    fn add(&mut self, r: &OpRecord) {
        self.count += 1;
        self.launches += r.launches;
        self.bytes += r.bytes_read + r.bytes_written;
    }
}

/// Ops of one kind in one phase (same op, dtype and input shapes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpGroup {
    /// The phase.
    pub phase: String,
    /// The op (`binary:mul`, `custom:conv2d`, …).
    pub op: String,
    /// Its output dtype.
    pub dtype: String,
    /// Its input shapes.
    pub shapes: String,
    /// How many times it ran.
    pub count: u64,
    /// Launches.
    pub launches: u64,
    /// Bytes read and written.
    pub bytes: u64,
}

/// The ledger's summary, in the JSON shape the PyTorch peer script writes too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepCost {
    /// `sluice`.
    pub tool: String,
    /// The version that recorded it.
    pub version: String,
    /// The model.
    pub model: String,
    /// Input side.
    pub imgsz: usize,
    /// Batch.
    pub batch: usize,
    /// `f32`, `fp16` or `bf16`.
    pub amp: String,
    /// The optimizer, lower case.
    pub optimizer: String,
    /// What the records model.
    pub device_model: String,
    /// [`PHASES`], in order.
    pub phases: Vec<PhaseCost>,
    /// The five training phases summed.
    pub train_total: PhaseCost,
    /// The 20 largest op groups by bytes.
    pub top_by_bytes: Vec<OpGroup>,
    /// The 20 largest op groups by count.
    pub top_by_count: Vec<OpGroup>,
}

/// The amp spelling of the JSON.
pub fn amp_name(amp: Option<DType>) -> &'static str {
    match amp {
        None => "f32",
        Some(DType::BF16) => "bf16",
        Some(_) => "fp16",
    }
}

/// A batch of `batch` images of noise with `boxes` labelled boxes each, laid out as the PyTorch peer's: box `j`
/// of image `i` has class `(8i + j) mod nc`, centre `(0.1 + 0.1j, 0.2 + 0.07 (i mod 8))`, size
/// `(0.08 + 0.01 (j mod 3), 0.1)` of the side.
pub fn synthetic_batch(batch: usize, imgsz: usize, boxes: usize, nc: usize) -> Result<Batch> {
    let mut b = Batch::new(BatchShape::rgb(batch, imgsz, imgsz), batch * boxes);
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..batch {
        let (_, px) = b.push_slot(i as u64)?;
        for p in px.iter_mut() {
            // xorshift: deterministic, and not a constant image.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *p = (seed >> 56) as u8;
        }
        for j in 0..boxes {
            let s = imgsz as f32;
            let (cx, cy) = (0.1 + 0.1 * (j % 9) as f32, 0.2 + 0.07 * (i % 8) as f32);
            let (w, h) = (0.08 + 0.01 * (j % 3) as f32, 0.1);
            let bbox = BoxXyxy {
                x1: (cx - w / 2.0) * s,
                y1: (cy - h / 2.0) * s,
                x2: (cx + w / 2.0) * s,
                y2: (cy + h / 2.0) * s,
            };
            b.targets.push(Target { image: i as u32, class: ((i * 8 + j) % nc) as u32, bbox });
        }
    }
    Ok(b)
}

/// Records one training step (after one unrecorded step, so the optimizer's state and the loss scaler exist as in
/// steady state) and one validation batch of the EMA model, and returns every record.
pub fn record_step(opts: &StepCostOptions) -> Result<Vec<OpRecord>> {
    // The ops take CUDA's paths on the CPU while recording, and the CPU's again afterwards (also on an error).
    struct ModelCuda;
    impl Drop for ModelCuda {
        fn drop(&mut self) {
            sluice_kernels::ledger::set_model_cuda(false);
            sluice_kernels::ledger::set_model_composed_batch_norm(false);
        }
    }
    sluice_kernels::ledger::set_model_cuda(true);
    let _model_cuda = ModelCuda;
    sluice_kernels::ledger::set_model_composed_batch_norm(opts.composed_batch_norm);
    record_modelled(opts)
}

fn record_modelled(opts: &StepCostOptions) -> Result<Vec<OpRecord>> {
    if !ledger::AVAILABLE {
        return Err(LedgerError::Msg("this build has no op ledger (candle-core's `ledger` feature)".into()));
    }
    if opts.batch == 0 || opts.imgsz == 0 || !opts.imgsz.is_multiple_of(32) {
        return Err(LedgerError::Msg("imgsz must be a positive multiple of 32, batch at least 1".into()));
    }
    let device = Device::Cpu;
    let arch = sluice_model::parse_model(&opts.model)?;
    let model = Yolo::new_seeded(arch.config(opts.nc), DType::F32, &device, 0)?;
    model.set_autocast(opts.amp)?;
    // Every batch an optimizer step (nbs = batch): the record holds one whole step, as the peer's.
    let settings = OptimSettings { optimizer: opts.optimizer, nbs: opts.batch, ..OptimSettings::default() };
    let shape = RunShape { batch: opts.batch, epochs: 100, batches_per_epoch: 100, train_images: 100 * opts.batch };
    // The GPU's defaults: clipping and the skip on the device; the multi-tensor step only on request (its CPU twin
    // stands for the CUDA kernels).
    let path = if opts.device_paths.fused_step { StepPath::DeviceFused } else { StepPath::Device };
    let loss_scaling = (opts.amp == Some(DType::F16)).then(ScalerSettings::default);
    // Packed as the trainer packs it.
    let model = Optimization::pack_model(model, &settings, shape)?;
    let mut opt = Optimization::with_step(&model, &settings, shape, StepOptions { path, loss_scaling })?;
    let mut loss = DetectionLoss::new(opts.nc);
    // The opt-in one-kernel overlaps and class sum: their CPU twins stand for the CUDA kernels.
    loss.assigner.fused_ciou = opts.device_paths.fused_ciou;
    loss.fused_bce = opts.device_paths.fused_bce;
    sluice_kernels::pool::set_fused_pool(opts.device_paths.fused_pool);
    let transfer = DeviceTransfer::new(&device, DType::F32)?;
    let mut readback = Readback::new(&device)?;
    let mut landed = Vec::new();
    let mut step = |opt: &mut Optimization, batch: &Batch, ni: usize| -> Result<()> {
        let x = transfer.transfer(batch).map_err(LedgerError::transfer)?;
        ledger::set_phase("forward");
        let (raw, _) = model.forward_raw(&x.images, Mode::Train)?;
        ledger::set_phase("loss");
        let l = step_loss(&loss, &raw, batch, &x, true)?;
        // The trainer queues the items for an asynchronous read.
        if let Items::Device(t) = &l.items {
            readback.submit(ni as u64, t, &mut landed)?;
            while readback.wait(&mut landed)?.is_some() {}
        }
        opt.batch_known_finite(&model, &l.total, true, ni, 0)?;
        Ok(())
    };
    // The warm-up step creates the optimizer's state, which has the parameters' shapes whatever the batch: a small
    // batch does it in a fraction of the time.
    step(&mut opt, &synthetic_batch(2, 64, opts.boxes_per_image, opts.nc)?, 0)?;
    let batch = synthetic_batch(opts.batch, opts.imgsz, opts.boxes_per_image, opts.nc)?;
    ledger::start("forward");
    let recorded = step(&mut opt, &batch, 1);
    let train = ledger::stop();
    recorded?;

    // Validation: the EMA model folded once per pass (not recorded), then one batch's device work and the read of
    // its packed output.
    let ema = opt.ema_model();
    let folded;
    let val_model = if ema.autocast().is_some() {
        ema
    } else {
        folded = ema.fuse()?;
        &folded
    };
    let work = BatchWork { device_nms: opts.device_paths.device_nms, half: false, end2end: false, dense: true };
    let shrink_params = ShrinkParams { fit: false, ..ShrinkParams::default() };
    let nms = NmsParams::ultralytics_val();
    let x = transfer.transfer(&batch).map_err(LedgerError::transfer)?;
    ledger::start("val");
    let val = (|| -> Result<()> {
        let (l, out) = batch_on_device(val_model, &loss, &batch, &x, work, &nms, &shrink_params)?;
        let (packed, _) = out.pack()?;
        readback.submit(0, &packed, &mut landed)?;
        while readback.wait(&mut landed)?.is_some() {}
        drop(l);
        Ok(())
    })();
    let val_records = ledger::stop();
    val?;
    Ok(train.into_iter().chain(val_records).collect())
}

/// The summary of `records` (from [`record_step`]).
pub fn summarize(opts: &StepCostOptions, records: &[OpRecord]) -> StepCost {
    let mut phases: Vec<PhaseCost> =
        PHASES.iter().map(|p| PhaseCost { phase: (*p).to_string(), ..PhaseCost::default() }).collect();
    let mut groups: BTreeMap<(String, String, String, String), Tally> = BTreeMap::new();
    for r in records {
        if let Some(p) = phases.iter_mut().find(|p| p.phase == r.phase) {
            p.add(r);
        }
        groups
            .entry((r.phase.clone(), r.op.clone(), r.dtype.as_str().to_string(), r.shapes.clone()))
            .or_default()
            .add(r);
    }
    let mut train_total = PhaseCost { phase: "train".into(), ..PhaseCost::default() };
    for p in phases.iter().filter(|p| p.phase != "val") {
        train_total.sum(p);
    }
    let all: Vec<OpGroup> = groups
        .into_iter()
        .map(|((phase, op, dtype, shapes), t)| OpGroup {
            phase,
            op,
            dtype,
            shapes,
            count: t.count,
            launches: t.launches,
            bytes: t.bytes,
        })
        .collect();
    let top = |key: fn(&OpGroup) -> u64| {
        let mut v = all.clone();
        // Ties in the order of the map's key (phase, op, dtype, shapes): deterministic.
        v.sort_by_key(|g| std::cmp::Reverse(key(g)));
        v.truncate(20);
        v
    };
    StepCost {
        tool: "sluice".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        model: opts.model.clone(),
        imgsz: opts.imgsz,
        batch: opts.batch,
        amp: amp_name(opts.amp).into(),
        optimizer: opts.optimizer.name().to_lowercase(),
        device_model: {
            let mut m = String::from("cuda (recorded on the cpu build)");
            if opts.composed_batch_norm {
                m.push_str(", BatchNorm+SiLU composed");
            }
            for p in opts.device_paths.enabled() {
                m.push_str(", ");
                m.push_str(p);
            }
            m
        },
        phases,
        train_total,
        top_by_bytes: top(|g| g.bytes),
        top_by_count: top(|g| g.count),
    }
}

/// Records and summarizes.
pub fn step_cost(opts: &StepCostOptions) -> Result<StepCost> {
    let records = record_step(opts)?;
    Ok(summarize(opts, &records))
}

/// One op's totals in one phase (every shape), for the budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpTotal {
    /// The phase.
    pub phase: String,
    /// The op.
    pub op: String,
    /// Times it ran.
    pub count: u64,
    /// Launches.
    pub launches: u64,
    /// Bytes read and written.
    pub bytes: u64,
}

/// The committed budget of a ledger: per phase its totals and per (phase, op) its totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// The model.
    pub model: String,
    /// Input side.
    pub imgsz: usize,
    /// Batch.
    pub batch: usize,
    /// `f32`, `fp16` or `bf16`.
    pub amp: String,
    /// The optimizer.
    pub optimizer: String,
    /// [`PHASES`], in order.
    pub phases: Vec<PhaseCost>,
    /// Every (phase, op), sorted.
    pub ops: Vec<OpTotal>,
}

/// The budget of `records` (from [`record_step`]).
pub fn budget(opts: &StepCostOptions, records: &[OpRecord]) -> Budget {
    let cost = summarize(opts, records);
    let mut ops: BTreeMap<(String, String), Tally> = BTreeMap::new();
    for r in records {
        ops.entry((r.phase.clone(), r.op.clone())).or_default().add(r);
    }
    Budget {
        model: cost.model,
        imgsz: cost.imgsz,
        batch: cost.batch,
        amp: cost.amp,
        optimizer: cost.optimizer,
        phases: cost.phases,
        ops: ops
            .into_iter()
            .map(|((phase, op), t)| OpTotal { phase, op, count: t.count, launches: t.launches, bytes: t.bytes })
            .collect(),
    }
}

/// Where `now` leaves `budget` by more than `tolerance` (0.02 is 2 %) in a phase's launches or bytes moved, up or
/// down: one line per phase that moved, each followed by the ops whose count, launches or bytes changed. Empty
/// when `now` keeps to the budget. A different model, size, batch, precision or optimizer is one line.
pub fn budget_changes(budget: &Budget, now: &Budget, tolerance: f64) -> Vec<String> {
    let key = |b: &Budget| (b.model.clone(), b.imgsz, b.batch, b.amp.clone(), b.optimizer.clone());
    if key(budget) != key(now) {
        return vec![format!("the budget is of {:?}, the ledger of {:?}", key(budget), key(now))];
    }
    let moved = |was: u64, is: u64| (is as f64 - was as f64).abs() > tolerance * (was.max(1) as f64);
    let mut out = Vec::new();
    for phase in PHASES {
        let get = |b: &Budget| b.phases.iter().find(|p| p.phase == phase).cloned().unwrap_or_default();
        let (was, is) = (get(budget), get(now));
        if !(moved(was.launches, is.launches) || moved(was.bytes(), is.bytes())) {
            continue;
        }
        out.push(format!(
            "{phase}: launches {} → {}, bytes moved {} → {}",
            was.launches,
            is.launches,
            was.bytes(),
            is.bytes()
        ));
        let ops = |b: &Budget| -> BTreeMap<String, OpTotal> {
            b.ops.iter().filter(|o| o.phase == phase).map(|o| (o.op.clone(), o.clone())).collect()
        };
        let (a, b) = (ops(budget), ops(now));
        let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for name in names {
            let zero = OpTotal { phase: phase.into(), op: name.clone(), count: 0, launches: 0, bytes: 0 };
            let (x, y) = (a.get(name).unwrap_or(&zero), b.get(name).unwrap_or(&zero));
            if (x.count, x.launches, x.bytes) != (y.count, y.launches, y.bytes) {
                out.push(format!(
                    "  {name}: count {} → {}, launches {} → {}, bytes {} → {}",
                    x.count, y.count, x.launches, y.launches, x.bytes, y.bytes
                ));
            }
        }
    }
    out
}
