//! `sluice model run`'s logic: the eval-mode forward of a model on an NCHW float32 `.npy`, written as `.npy`
//! files, so a user can check a port of their weights against another implementation.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor};

use crate::config::YoloConfig;
use crate::error::{ModelError, Result};
use crate::model::Yolo;

/// What to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Architecture.
    pub config: YoloConfig,
    /// Weights (safetensors, Ultralytics key names).
    pub weights: PathBuf,
    /// Input `(B, 3, H, W)` float32 `.npy`, H and W multiples of 32.
    pub input: PathBuf,
    /// Where the decoded `(B, 4 + nc, A)` output goes.
    pub output: PathBuf,
    /// Where `raw_boxes.npy` `(B, 4·reg_max, A)` and `raw_scores.npy` `(B, nc, A)` go, if anywhere.
    pub raw_dir: Option<PathBuf>,
    /// Fold Conv+BN before running.
    pub fuse: bool,
    /// Write the end-to-end output `(B, 300, 6)` of a model's one-to-one head (YOLO26) instead of `(B, 4 + nc, A)`.
    pub end2end: bool,
}

/// What was run and written.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Input shape.
    pub input_shape: Vec<usize>,
    /// Output shape `(B, 4 + nc, A)`.
    pub output_shape: Vec<usize>,
    /// Whether the model was fused.
    pub fused: bool,
    /// Milliseconds of the forward alone.
    pub forward_ms: f64,
    /// Files written.
    pub written: Vec<PathBuf>,
}

fn write_npy(t: &Tensor, path: &Path) -> Result<()> {
    t.write_npy(path).map_err(|source| ModelError::Npy { file: path.to_path_buf(), source })
}

/// Loads the model and the input, runs the eval forward on the CPU and writes the outputs.
pub fn run_npy(opts: &RunOptions) -> Result<RunSummary> {
    let device = Device::Cpu;
    let model = Yolo::load(opts.config, &opts.weights, DType::F32, &device)?;
    let model = if opts.fuse { model.fuse()? } else { model };
    let x = Tensor::read_npy(&opts.input).map_err(|source| ModelError::Npy { file: opts.input.clone(), source })?;
    if x.dtype() != DType::F32 {
        return Err(ModelError::BadInput(format!("{}: dtype {:?}, expected float32", opts.input.display(), x.dtype())));
    }
    let named = |e| match e {
        ModelError::BadInput(m) => ModelError::BadInput(format!("{}: {m}", opts.input.display())),
        e => e,
    };
    let start = Instant::now();
    if opts.end2end {
        let y = model.forward_end2end(&x, 300).map_err(named)?;
        let forward_ms = start.elapsed().as_secs_f64() * 1e3;
        write_npy(&y, &opts.output)?;
        return Ok(RunSummary {
            input_shape: x.dims().to_vec(),
            output_shape: y.dims().to_vec(),
            fused: opts.fuse,
            forward_ms,
            written: vec![opts.output.clone()],
        });
    }
    let out = model.forward(&x).map_err(named)?;
    let forward_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut written = Vec::new();
    write_npy(&out.y, &opts.output)?;
    written.push(opts.output.clone());
    if let Some(dir) = &opts.raw_dir {
        std::fs::create_dir_all(dir).map_err(|source| ModelError::Io { file: dir.clone(), source })?;
        for (name, t) in [("raw_boxes.npy", &out.raw.boxes), ("raw_scores.npy", &out.raw.scores)] {
            let p = dir.join(name);
            write_npy(t, &p)?;
            written.push(p);
        }
    }
    Ok(RunSummary {
        input_shape: x.dims().to_vec(),
        output_shape: out.y.dims().to_vec(),
        fused: opts.fuse,
        forward_ms,
        written,
    })
}
