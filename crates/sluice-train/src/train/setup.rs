//! What a run is built from, step by step: the splits, the loaders' settings (the batch after AutoBatch, each rank's
//! share), the model (fresh, or shaped for a checkpoint or weights file), the decoded-image sources of the splits.

use std::path::Path;
use std::sync::Arc;

use sluice_dataset::{IndexOptions, SampleIndex, Split};
use sluice_loader::default_workers;
use sluice_loader::split::{LoadedSplit, RemoteConfig, load_split_observed, packed};
use sluice_loader::{CacheFile, CacheMode, DecodedSource, LoaderConfig, NodeCache, ReadFrom, STRIDE, SourceKind};
use sluice_model::Yolo;
use sluice_model::candle_core::{DType, Device};

use super::config::{Amp, TrainConfig};
use super::events::{Observer, SetupEvent, SetupTask};
use super::run::Note;
use crate::dist::Dist;
use crate::error::{Context, Result};

/// The dtype of the convolutions under `amp` on a CUDA device, `None` for full f32: float16 for `true` / `fp16`,
/// bfloat16 for `bf16`. The CPU trains in f32 whatever `amp` says, as Ultralytics' `check_amp` does for float16
/// (candle's CPU matmul has no bfloat16).
pub(crate) fn amp_dtype(cfg: &TrainConfig, device: &Device) -> Option<DType> {
    match cfg.amp {
        _ if !device.is_cuda() => None,
        Amp::Off => None,
        Amp::On | Amp::Fp16 => Some(DType::F16),
        Amp::Bf16 => Some(DType::BF16),
    }
}

/// What the set-up says as it goes: lines given to the observer when the run starts, progress at once.
pub(super) struct Report<'a> {
    pub(super) notes: Vec<Note>,
    pub(super) observer: &'a mut dyn Observer,
}

/// The decoded-image source of a split's `index`: read through the reader `kind` names, decoded to `imgsz`.
pub(crate) fn source(
    kind: &SourceKind,
    index: SampleIndex,
    imgsz: u32,
    augment: bool,
    cache: CacheMode,
) -> Result<Arc<DecodedSource>> {
    Ok(Arc::new(DecodedSource::open(kind, index, imgsz, augment, cache.budget_bytes())?))
}

/// The decoded-image source of a split of the run `cfg` describes, for training (`augment`) or validation, at
/// `cfg.imgsz` with `cfg.cache`:
/// - `cache=disk`: the images come from the split's disk cache file ([`disk_source`]);
/// - `cache=ram` in a data-parallel run: the decoded images live in one node cache per machine
///   (`sluice_loader::NodeCache`, a file in shared memory that every rank of the node maps, in `cfg.cache_dir` or
///   else in `/dev/shm`), built by the node's local rank 0 while the others wait, its budget counted once. Once
///   every rank has it mapped the file is unlinked, so the memory goes back to the system when the last rank
///   ends, however it ends;
/// - otherwise each process's own [`source`].
pub(super) fn node_source(
    dist: &crate::dist::Dist,
    kind: &SourceKind,
    index: SampleIndex,
    augment: bool,
    cfg: &TrainConfig,
    report: &mut Report<'_>,
) -> Result<Arc<DecodedSource>> {
    let (imgsz, cache) = (cfg.imgsz, cfg.cache);
    if cache == CacheMode::Disk {
        return disk_source(dist, kind, index, augment, cfg, report);
    }
    if !dist.is_distributed() || cache == CacheMode::None {
        return source(kind, index, imgsz, augment, cache);
    }
    let src = DecodedSource::open(kind, index, imgsz, augment, 0)?;
    let key = src.node_cache_key();
    let path = NodeCache::default_path(cfg.cache_dir.as_deref(), key);
    let builder = dist.launch().local_rank == 0;
    let built = if builder {
        Some(
            src.build_node_cache(&path, cache.budget_bytes())
                .with_context(|| format!("building {}", path.display()))?,
        )
    } else {
        None
    };
    dist.barrier().context("waiting for the node cache")?;
    let node = match built {
        Some(c) => c,
        None => NodeCache::open(&path, key).with_context(|| format!("opening {}", path.display()))?,
    };
    dist.barrier().context("waiting for every rank to map the node cache")?;
    if builder {
        std::fs::remove_file(&path).with_context(|| format!("unlinking {}", path.display()))?;
    }
    Ok(Arc::new(src.with_node_cache(node)?))
}

/// `cache=disk`: the split's decoded images in one mapped file beside its label cache (or in `cfg.cache_dir`),
/// reused while its key matches and rebuilt when not. One process per machine (local rank 0) opens or builds it
/// while the node's other ranks wait, then they map the finished file. An empty split has no file.
fn disk_source(
    dist: &crate::dist::Dist,
    kind: &SourceKind,
    index: SampleIndex,
    augment: bool,
    cfg: &TrainConfig,
    report: &mut Report<'_>,
) -> Result<Arc<DecodedSource>> {
    let src = DecodedSource::open(kind, index, cfg.imgsz, augment, 0)?;
    let Some(path) = sluice_loader::disk_cache_path(src.index(), cfg.imgsz, augment, cfg.cache_dir.as_deref()) else {
        return Ok(Arc::new(src));
    };
    let split = if augment { "train" } else { "val" };
    let builder = !dist.is_distributed() || dist.launch().local_rank == 0;
    let built = if builder {
        let t0 = std::time::Instant::now();
        let task = SetupTask::DiskCache { split, path: &path };
        let mut progress = |done: usize, total: usize| {
            report.observer.setup(&SetupEvent { task, done: done as u64, total: total as u64 });
        };
        let (cache, how) = src.open_or_build_disk_cache(&path, &mut progress).with_context(|| {
            format!("cache=disk: {split} images into {} (cache_dir names another folder)", path.display())
        })?;
        let held = format!("{} images, {:.1} MB", cache.images(), cache.len() as f64 / 1e6);
        report.notes.push(Note::Info(match how {
            CacheFile::Reused => format!("cache=disk: {split} images from {} ({held})", path.display()),
            CacheFile::Built { replaced } => {
                let why = replaced.map_or_else(String::new, |r| format!("; replaced the previous file: {r}"));
                let s = t0.elapsed().as_secs_f64();
                format!("cache=disk: decoded {split} images into {} ({held}) in {s:.1} s{why}", path.display())
            }
        }));
        Some(cache)
    } else {
        None
    };
    if dist.is_distributed() {
        dist.barrier().context("waiting for the disk cache")?;
    }
    let cache = match built {
        Some(c) => c,
        None => NodeCache::open(&path, src.node_cache_key()).with_context(|| format!("opening {}", path.display()))?,
    };
    Ok(Arc::new(src.with_node_cache(cache)?))
}

/// The run's train and val splits, indexed. Splits in object storage are copied to local disk once per machine
/// (the node's local rank 0 copies, its other ranks wait). What the splits left out is named once here (each val
/// pass also counts the val ones); fatal with `strict`.
pub(super) fn splits(cfg: &TrainConfig, dist: &Dist, report: &mut Report<'_>) -> Result<(LoadedSplit, LoadedSplit)> {
    let opts = IndexOptions { cache: true, find_orphans: false };
    let mut split = |s: Split| -> Result<LoadedSplit> {
        let remote = RemoteConfig { cache_dir: cfg.cache_dir.clone(), settings: cfg.store_settings.clone() };
        let mut progress = |url: &str, done: u64, total: u64| {
            report.observer.setup(&SetupEvent { task: SetupTask::Fetch { url }, done, total });
        };
        let loaded = load_split_observed(&cfg.data, s, &opts, s == Split::Train, &remote, &mut progress)
            .with_context(|| format!("dataset {}, {} split", cfg.data.display(), s.as_str()))?;
        match cfg.source {
            ReadFrom::Files => Ok(loaded),
            ReadFrom::Packed => Ok(packed(loaded)?),
        }
    };
    let remote = dist.is_distributed()
        && sluice_dataset::DataConfig::load(&cfg.data).is_ok_and(|d| {
            [&d.train, &d.val].into_iter().flatten().any(|p| sluice_dataset::is_url(&p.to_string_lossy()))
        });
    let first =
        if !remote || dist.launch().local_rank == 0 { Some((split(Split::Train)?, split(Split::Val)?)) } else { None };
    if remote {
        dist.barrier().context("waiting for the node's copies of the dataset")?;
    }
    let (train, val) = if let Some(loaded) = first { loaded } else { (split(Split::Train)?, split(Split::Val)?) };
    for (what, split) in [("train split", &train), ("val split", &val)] {
        if let Some(copy) = &split.staged {
            report.notes.push(Note::Info(format!("{what}: {}", copy.line())));
        }
    }
    for (what, left_out) in [("train split", train.left_out()), ("val split", val.left_out())] {
        if let Some(line) = left_out.line(what) {
            crate::ensure!(!cfg.strict, "strict: {line}");
            report.notes.push(Note::Warn(line));
        }
    }
    Ok((train, val))
}

/// The training loader's settings: the global batch (chosen by AutoBatch for `batch=-1`) and each rank's share of
/// it, checked as Ultralytics checks them.
pub(super) fn loader_config(
    cfg: &mut TrainConfig,
    dist: &Dist,
    nc: usize,
    device: &Device,
    train_images: usize,
    notes: &mut Vec<Note>,
) -> Result<LoaderConfig> {
    let world = dist.world();
    if cfg.batch == super::config::AUTO_BATCH {
        crate::ensure!(
            world == 1,
            "batch=-1 (AutoBatch) is for single-device training; give the global batch for {world} ranks, e.g. \
             batch={}",
            world * 8
        );
        let (batch, line) = super::autobatch::auto_batch(cfg, nc, device)?;
        cfg.batch = batch;
        notes.push(Note::Info(line));
    }
    // As Ultralytics: `batch` is the global batch, each rank loads its share of it.
    crate::ensure!(
        cfg.batch >= world,
        "batch={} is smaller than the {world} ranks; use a multiple of the rank count, e.g. batch={}",
        cfg.batch,
        world * 8
    );
    let local_batch = cfg.batch / world;
    let workers = if cfg.workers == 0 { default_workers() } else { cfg.workers };
    let lcfg = LoaderConfig {
        workers,
        strict: cfg.strict,
        multi_scale: cfg.multi_scale,
        ..LoaderConfig::new(cfg.imgsz, local_batch, cfg.seed)
    };
    // Ultralytics' guard: a final batch of one image at a side under two strides gives BatchNorm one value per
    // channel.
    let (min_side, _) = lcfg.train_sides();
    let last_batch = Some(train_images.div_ceil(world) % local_batch).filter(|&r| r > 0).unwrap_or(local_batch);
    if min_side < 2 * STRIDE && last_batch == 1 {
        crate::bail!(
            "final batch=1 training at imgsz={min_side} gives BatchNorm a single value per channel; change batch, or \
             use imgsz and multi_scale that keep every size >= {}",
            2 * STRIDE
        );
    }
    Ok(lcfg)
}

/// The run's model and its autocast dtype: seeded, shaped for the checkpoint being resumed (whose weights the caller
/// loads) or for fine-tuning weights, of which it takes every tensor whose name and shape fit, as Ultralytics'
/// trainer does; every rank starts from rank 0's weights.
pub(super) fn model(
    cfg: &TrainConfig,
    resume_from: Option<&Path>,
    nc: usize,
    device: &Device,
    dist: &Dist,
    notes: &mut Vec<Note>,
) -> Result<(Yolo, Option<DType>)> {
    let base = cfg.arch()?.config(nc);
    // The class branch's width follows the weights it is built for (Ultralytics' load keeps a fine-tuning
    // source's width; a checkpoint holds its own).
    let arch = match (resume_from, &cfg.weights) {
        (Some(ckpt), _) => base.fit_to_weights(ckpt, "").with_context(|| format!("reading {}", ckpt.display()))?,
        (None, Some(w)) => base.for_transfer(w).with_context(|| format!("initial weights {}", w.display()))?,
        (None, None) => base,
    };
    let mut model = Yolo::new_seeded(arch, DType::F32, device, cfg.seed)?;
    if let (None, Some(w)) = (resume_from, &cfg.weights) {
        let t = model.transfer_weights(w).with_context(|| format!("initial weights {}", w.display()))?;
        let mut line = format!("Transferred {}/{} items from pretrained weights {}", t.loaded, t.total, w.display());
        if !t.skipped.is_empty() {
            let shown: Vec<&str> = t.skipped.iter().take(4).map(String::as_str).collect();
            let more = if t.skipped.len() > 4 { ", …" } else { "" };
            line.push_str(&format!(" (left out: {}{more})", shown.join(", ")));
        }
        notes.push(Note::Info(line));
    }
    // A seeded start is the same everywhere; fine-tuning weights or a file that differs between nodes are not.
    dist.broadcast_vars(&crate::dist::all_vars(&model)).context("starting from rank 0's weights")?;
    let half = amp_dtype(cfg, device);
    if let Some(half) = half {
        model.set_autocast(Some(half))?;
    } else if cfg.amp.is_on() {
        notes.push(Note::Warn(format!(
            "amp={}: mixed precision is for CUDA devices (as Ultralytics' AMP check); training in f32 on the CPU",
            cfg.amp
        )));
    }
    Ok((model, half))
}
