//! `sluice train`: train a YOLOv8 detector. Settings come from Ultralytics' defaults, then a YAML config
//! (`--config`), then the flags given here. Ctrl-C saves `last` and exits; `--resume` continues it.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sluice_train::dist::Dist;
use sluice_train::train::checkpoint_config;
use sluice_train::train::{
    Amp, BatchEvent, CacheMode, DevicePaths, EpochEvent, FinalEvalEvent, FirstBatchEvent, Observer, ReadFrom,
    SetupEvent, SetupTask, TrainConfig, TrainSummary, Trainer, find_resume, parse_device_paths, parse_multi_scale,
};

use crate::plots::{plot_batch, plot_pr_curve, plot_results};

/// Arguments of `sluice train`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A YAML file of settings (Ultralytics' keys); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Dataset YAML.
    #[arg(long)]
    data: Option<PathBuf>,
    /// yolov8n|s|m|l|x[.yaml].
    #[arg(long)]
    model: Option<String>,
    /// Initial weights to fine-tune from (`.pt`, safetensors with Ultralytics key names, or a Sluice checkpoint's
    /// EMA): every tensor whose name and shape fit is taken, as Ultralytics' trainer does.
    #[arg(long)]
    weights: Option<PathBuf>,
    #[arg(long)]
    epochs: Option<u32>,
    #[arg(long)]
    imgsz: Option<u32>,
    /// Multi-scale training: per-batch sizes within imgsz x (1 ± RANGE), stride 32 (0 = off; true = 1).
    #[arg(long, value_name = "RANGE", value_parser = parse_multi_scale)]
    multi_scale: Option<f64>,
    /// Images per batch; -1: AutoBatch (60% of the GPU's memory; 16 on the CPU).
    #[arg(long, allow_negative_numbers = true, value_parser = sluice_train::train::config::parse_batch)]
    batch: Option<usize>,
    /// Loader workers per stage (0: about 80% of the cores).
    #[arg(long)]
    workers: Option<usize>,
    /// ram, disk or none (disk: decoded images in one memory-mapped file per split and image size, reused by
    /// later runs).
    #[arg(long)]
    cache: Option<CacheMode>,
    /// The folder of the decoded-image cache files: `--cache disk`'s (default: beside each split's label cache),
    /// and `--cache ram`'s node cache in a data-parallel run (default: /dev/shm).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// files (the image files, or the shard a split of the data YAML names) or packed (each split packed into a
    /// `.sluice` shard beside its label cache, then read from it).
    #[arg(long)]
    source: Option<ReadFrom>,
    /// cpu, cuda:N, or several GPUs for data-parallel training (0,1,2,3: one worker process each, NCCL).
    #[arg(long)]
    device: Option<String>,
    /// Data-parallel ranks on the CPU: this many worker processes (started under mpirun; `batch` is split
    /// between them).
    #[arg(long)]
    nproc: Option<usize>,
    /// GPU ranks on several machines: the number of machines; each runs this same command with its --node-rank.
    #[arg(long, default_value_t = 1)]
    nnodes: usize,
    /// This machine's place among --nnodes (0 is where rank 0 runs).
    #[arg(long, default_value_t = 0)]
    node_rank: usize,
    /// Rank 0's host name or address, which every machine can reach (with --nnodes above 1).
    #[arg(long)]
    master_addr: Option<String>,
    /// The port the ranks meet on at --master-addr (default 29500 across machines, a free one on one machine).
    #[arg(long)]
    master_port: Option<u16>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    project: Option<PathBuf>,
    #[arg(long)]
    name: Option<String>,
    /// Reuse `runs/<name>` if it exists.
    #[arg(long)]
    exist_ok: bool,
    /// Validate every N epochs (and after the last).
    #[arg(long)]
    val_interval: Option<u32>,
    /// Validate on this seed-determined fraction of the val split.
    #[arg(long)]
    val_fraction: Option<f64>,
    /// Stop on the first bad sample.
    #[arg(long)]
    strict: bool,
    /// Ultralytics' `deterministic` (default true): on a GPU, deterministic cuDNN algorithms only.
    #[arg(long, value_name = "BOOL")]
    deterministic: Option<bool>,
    /// Mixed precision, as Ultralytics' `amp`: `--amp` or `--amp fp16` (float16 convolutions with dynamic loss
    /// scaling), `--amp bf16` (bfloat16), `--amp false` (f32). CUDA only: the CPU trains in f32.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "MODE")]
    amp: Option<Amp>,
    /// Device paths not yet verified on a device, turned on for this run (off by default): a comma-separated list
    /// of fused_step, cudnn_search, device_nms, gpu_timer, fused_ciou, fused_bce, fused_pool (`none`: the verified paths).
    #[arg(long, value_name = "LIST", value_parser = parse_device_paths)]
    device_paths: Option<DevicePaths>,
    /// Run the device's loss path (the assigner and loss as tensor ops) on the CPU too, as a GPU runs it.
    #[arg(long)]
    dense_loss: bool,
    /// Continue a run: a checkpoint, a run folder, or (no value) the latest run under --project.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    resume: Option<PathBuf>,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn resolve(&self) -> Result<TrainConfig> {
        let mut c = match &self.config {
            Some(p) => TrainConfig::from_yaml(p)?,
            None => TrainConfig::default(),
        };
        macro_rules! set {
            ($($f:ident),*) => { $( if let Some(v) = self.$f.clone() { c.$f = v; } )* };
        }
        set!(
            data,
            model,
            epochs,
            imgsz,
            multi_scale,
            batch,
            workers,
            device,
            seed,
            project,
            name,
            val_interval,
            val_fraction
        );
        if let Some(w) = &self.weights {
            c.weights = Some(w.clone());
        }
        if let Some(cache) = self.cache {
            c.cache = cache;
        }
        if let Some(dir) = &self.cache_dir {
            c.cache_dir = Some(dir.clone());
        }
        if let Some(source) = self.source {
            c.source = source;
        }
        c.exist_ok |= self.exist_ok;
        c.strict |= self.strict;
        if let Some(d) = self.deterministic {
            c.deterministic = d;
        }
        if let Some(amp) = self.amp {
            c.amp = amp;
        }
        if let Some(paths) = self.device_paths {
            c.device_paths = paths;
        }
        c.dense_loss |= self.dense_loss;
        c.store_settings = super::store_settings_from_env()?;
        Ok(c)
    }
}

/// A progress bar for each long step of the set-up (a copy from object storage, a `cache: disk` build), drawn by
/// rank 0 only and cleared when the step ends (the trainer then prints a line saying what it did).
struct SetupBars {
    /// Whether this process draws (rank 0).
    draw: bool,
    /// The step being drawn, and its bar.
    bar: Option<(String, ProgressBar)>,
}

impl Observer for SetupBars {
    fn setup(&mut self, e: &SetupEvent<'_>) {
        if !self.draw {
            return;
        }
        let (label, template) = match e.task {
            SetupTask::Fetch { url } => {
                (format!("fetching {url}"), "{prefix} {bar:25} {bytes}/{total_bytes} {bytes_per_sec} [{elapsed}<{eta}]")
            }
            SetupTask::DiskCache { split, .. } => {
                (format!("cache=disk: decoding {split} images"), "{prefix} {bar:25} {pos}/{len} [{elapsed}<{eta}]")
            }
        };
        if self.bar.as_ref().is_none_or(|(drawn, _)| *drawn != label) {
            if let Some((_, old)) = self.bar.take() {
                old.finish_and_clear();
            }
            let bar = ProgressBar::new(e.total);
            bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()));
            bar.set_prefix(label.clone());
            self.bar = Some((label, bar));
        }
        if let Some((_, bar)) = &self.bar {
            bar.set_length(e.total);
            bar.set_position(e.done);
        }
        if e.done >= e.total
            && let Some((_, bar)) = self.bar.take()
        {
            bar.finish_and_clear();
        }
    }
}

/// Progress bar per epoch and a table after it; with `plots` on, the run's plots (Ultralytics' files).
struct Console {
    bar: Option<ProgressBar>,
    epochs: u32,
    plots: bool,
    /// The third loss term's name: `dfl`, or `l1` for a one-bin head (YOLO26), as Ultralytics labels it.
    third: &'static str,
}

impl Console {
    /// A plot that could not be drawn is a warning, never the end of the run.
    fn plotted(&mut self, out: &std::path::Path, r: Result<(), crate::plots::PlotError>) {
        if let Err(e) = r {
            self.warn(&format!("{}: {e}", out.display()));
        }
    }
}

impl Observer for Console {
    fn batch(&mut self, e: &BatchEvent) {
        let bar = self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::new(e.batches as u64);
            bar.set_style(
                ProgressStyle::with_template("{prefix:>9} {bar:25} {pos}/{len} {msg} [{elapsed}<{eta}]")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_prefix(format!("{}/{}", e.epoch + 1, self.epochs));
            bar.set_position(e.batch as u64);
            bar
        });
        bar.set_position(e.batch as u64 + 1);
        let [b, c, d] = e.mean_loss;
        bar.set_message(format!(
            "size {} · box {b:.3} cls {c:.3} {} {d:.3} · {:.1} img/s · data wait {:.0}%",
            e.side,
            self.third,
            e.images_per_s,
            e.data_wait_fraction * 100.0
        ));
    }

    fn epoch(&mut self, e: &EpochEvent) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let r = &e.row;
        eprintln!(
            "epoch {}/{} · loss box {:.3} cls {:.3} {} {:.3} · P {:.3} R {:.3} mAP50 {:.3} mAP50-95 {:.3}{}",
            r.epoch,
            self.epochs,
            r.train_loss[0],
            r.train_loss[1],
            self.third,
            r.train_loss[2],
            r.metrics[0],
            r.metrics[1],
            r.metrics[2],
            r.metrics[3],
            if e.best { " (best)" } else { "" }
        );
        eprintln!("{}", crate::epoch_table::epoch_table(&e.telemetry));
    }

    fn first_batch(&mut self, e: &FirstBatchEvent<'_>) {
        let out = e.run_dir.join("train_batch0.jpg");
        self.plotted(&out, plot_batch(e.batch, e.names, None, &out));
    }

    fn final_eval(&mut self, e: &FinalEvalEvent<'_>) {
        eprintln!("\nvalidating {} (epoch {}):", e.weights.display(), e.epoch);
        eprint!("{}", e.result.class_table(e.names));
        if let Some(line) = e.result.skipped.line("final validation") {
            eprintln!("warning: {line}");
        }
        if self.plots {
            let out = e.run_dir.join("PR_curve.png");
            self.plotted(&out, plot_pr_curve(&e.result.report, e.names, &out));
            if let Some(first) = &e.result.first_batch {
                for (file, dets) in
                    [("val_batch0_labels.jpg", None), ("val_batch0_pred.jpg", Some(&first.detections[..]))]
                {
                    let out = e.run_dir.join(file);
                    self.plotted(&out, plot_batch(&first.batch, e.names, dets, &out));
                }
            }
        }
    }

    fn finished(&mut self, summary: &TrainSummary) {
        if self.plots {
            let out = summary.run_dir.join("results.png");
            self.plotted(&out, plot_results(&summary.run_dir.join("results.csv"), &out));
        }
    }

    fn info(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("{message}")),
            None => eprintln!("{message}"),
        }
    }

    fn warn(&mut self, message: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("warning: {message}")),
            None => eprintln!("warning: {message}"),
        }
    }
}

/// Prints where everything went.
pub(crate) fn print_summary(s: &TrainSummary) {
    eprintln!(
        "\n{} epochs in {:.1} s ({:.1} s training, {:.1} img/s, data wait {:.1}%, bottleneck: {})",
        s.epochs,
        s.wall_s,
        s.train_s,
        s.mean_images_per_s,
        s.mean_data_wait_fraction * 100.0,
        s.bottleneck
    );
    let f = &s.final_metrics;
    eprintln!(
        "final: P {:.3} R {:.3} mAP50 {:.3} mAP50-95 {:.3} · best epoch {}: mAP50 {:.3} mAP50-95 {:.3}",
        f.precision, f.recall, f.map50, f.map50_95, s.best_epoch, s.best_metrics.map50, s.best_metrics.map50_95
    );
    if s.nonfinite_steps > 0 || s.skipped_samples > 0 {
        eprintln!("skipped: {} non-finite steps, {} bad samples", s.nonfinite_steps, s.skipped_samples);
    }
    eprintln!("results: {}", s.run_dir.display());
    eprintln!("  weights: {} and {}", s.last.display(), s.best.display());
    eprintln!("  results.csv, telemetry.jsonl, summary.json, args.yaml");
    let plots: Vec<&str> =
        ["results.png", "PR_curve.png", "train_batch0.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg"]
            .into_iter()
            .filter(|f| s.run_dir.join(f).exists())
            .collect();
    if !plots.is_empty() {
        eprintln!("  plots: {}", plots.join(", "));
    }
    if s.interrupted {
        eprintln!("interrupted: continue with `sluice train --resume {}`", s.run_dir.display());
    }
}

pub(crate) fn run(args: Args) -> Result<()> {
    let launch = sluice_dist::Launch::from_vars(|k| std::env::var(k).ok())?;
    // The checkpoint to resume and the configuration the run will have.
    let (resume, cfg) = match &args.resume {
        Some(p) => {
            let project = args.resolve()?.project;
            let given = (!p.as_os_str().is_empty()).then_some(p.as_path());
            let ck = find_resume(given, &project)?;
            let cfg = checkpoint_config(&ck)?;
            (Some(ck), cfg)
        }
        None => (None, args.resolve()?),
    };
    if launch.launcher == sluice_dist::Launcher::Single {
        let devices = sluice_infer::device_list(&cfg.device)?;
        let nproc = args.nproc.unwrap_or(1);
        if devices.len() > 1 {
            anyhow::ensure!(
                nproc == 1 || nproc == devices.len(),
                "--nproc {nproc} with {} devices: one process runs per device",
                devices.len()
            );
            return launch_local(&args, devices.len());
        }
        if nproc > 1 {
            anyhow::ensure!(cfg.device == "cpu", "--nproc is for CPU ranks; for GPUs list them: --device 0,1");
            return launch_mpi(nproc);
        }
    }
    let dist = rank_dist(&launch, &cfg.device)?;
    let main = dist.is_main();
    let mut setup_bars = SetupBars { draw: main, bar: None };
    let mut trainer = match &resume {
        Some(ck) => {
            if main {
                eprintln!("resuming {} ({} epochs, model {})", ck.display(), cfg.epochs, cfg.model);
            }
            Trainer::resume_with(ck, dist, &super::store_settings_from_env()?, &mut setup_bars)?
        }
        None => Trainer::new_with(cfg, dist, &mut setup_bars)?,
    };
    let stop = trainer.stop_flag();
    let distributed = trainer.dist().is_distributed();
    if distributed {
        sluice_dist::signals::stop_on_usr1(&stop)?;
    }
    ctrlc::set_handler(move || {
        let again = stop.swap(true, std::sync::atomic::Ordering::SeqCst);
        // A rank gets the terminal's Ctrl-C and its launcher's SIGTERM: only the launcher quits at once.
        if again && !distributed {
            std::process::exit(130);
        }
        if !again && main {
            eprintln!("\ninterrupt: saving last.safetensors after this batch (Ctrl-C again to quit now)");
        }
    })
    .context("installing the Ctrl-C handler")?;
    if !main {
        // The other ranks train silently; rank 0 prints, plots and writes the run's files.
        trainer.run(&mut sluice_train::train::Quiet)?;
        return finish_dist(trainer);
    }
    print_header(&trainer);
    let cfg = trainer.config();
    let one_bin = cfg.arch().is_ok_and(|a| a.family.reg_max() == 1);
    let mut console =
        Console { bar: None, epochs: cfg.epochs, plots: cfg.plots, third: if one_bin { "l1" } else { "dfl" } };
    let summary = trainer.run(&mut console)?;
    if let Some(bar) = console.bar.take() {
        bar.finish_and_clear();
    }
    print_summary(&summary);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    finish_dist(trainer)
}

/// This rank's collective when a launcher started the process (its device from `--device` and the local rank),
/// else the single-process one.
fn rank_dist(launch: &sluice_dist::Launch, device: &str) -> Result<Dist> {
    if launch.launcher == sluice_dist::Launcher::Single {
        return Ok(Dist::single());
    }
    let device = sluice_infer::rank_device(device, launch.local_rank)?;
    let device = sluice_infer::device_of(&device)?;
    let dist = Dist::from_vars(&device, &|k| std::env::var(k).ok())
        .with_context(|| format!("rank {} of {}", launch.rank, launch.world))?;
    // A rank blocked in a collective cannot return: the heartbeat's thread ends the process.
    let rank = launch.rank;
    dist.on_lost(Box::new(move |e| {
        eprintln!("error: rank {rank}: {e}; ending this rank");
        std::process::exit(1);
    }));
    Ok(dist)
}

/// The lines rank 0 prints before the first epoch: what trains on what, the ranks, the run folder.
fn print_header(trainer: &Trainer) {
    let cfg = trainer.config();
    let (n_train, n_val) = trainer.sizes();
    let sizes = if cfg.multi_scale > 0.0 {
        let (lo, hi) = sluice_augment::multiscale_bounds(cfg.imgsz, cfg.multi_scale, sluice_loader::STRIDE);
        format!("imgsz {} (multi-scale {lo}-{hi})", cfg.imgsz)
    } else {
        format!("imgsz {}", cfg.imgsz)
    };
    eprintln!(
        "training {} on {} ({} train / {} val images, {} classes) · {} epochs · {sizes} · batch {} · {}",
        cfg.model,
        cfg.data.display(),
        n_train,
        n_val,
        trainer.names().len(),
        cfg.epochs,
        cfg.batch,
        cfg.device
    );
    if trainer.dist().is_distributed() {
        let d = trainer.dist();
        eprintln!(
            "data-parallel: {} ranks ({}, {}), {} images per rank per batch",
            d.world(),
            d.comm().name(),
            d.launch().launcher.name(),
            cfg.batch / d.world()
        );
    }
    eprintln!("run folder: {}", trainer.paths().dir.display());
}

/// Ends a rank's connections in order, so the other ranks do not report it as lost.
fn finish_dist(trainer: Trainer) -> Result<()> {
    trainer.into_dist().finish()?;
    Ok(())
}

/// This command again with `--nproc` left out, for the worker processes.
fn worker_args() -> Vec<std::ffi::OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == "--nproc" {
            args.next();
        } else if !a.to_string_lossy().starts_with("--nproc=") {
            out.push(a);
        }
    }
    out
}

/// Starts `n` CPU ranks of this command under mpirun and waits for them.
fn launch_mpi(n: usize) -> Result<()> {
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let lookup = sluice_dist::mpirun::MpirunLookup::from_vars(|k| std::env::var_os(k));
    let mut cmd = sluice_dist::mpirun::mpirun_command(&lookup, n, &exe, &worker_args())?;
    // The ranks share the machine's cores (as torchrun sets OMP_NUM_THREADS): each one's compute pool gets its
    // share, unless the user set it.
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        cmd.env("RAYON_NUM_THREADS", (cores / n).max(1).to_string());
    }
    // mpirun in its own process group: Ctrl-C reaches only this launcher, which asks mpirun to forward SIGUSR1,
    // the ranks' stop request (mpirun itself would abort the job on SIGINT); a second Ctrl-C aborts the job.
    cmd.process_group(0);
    let child = cmd.spawn().context("running mpirun")?;
    let pid = child.id();
    let presses = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let count = std::sync::Arc::clone(&presses);
    ctrlc::set_handler(move || {
        let first = count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        if first {
            eprintln!("\ninterrupt: the ranks save last.safetensors after this batch (Ctrl-C again to abort them)");
        }
        if let Err(e) = sluice_dist::signals::signal_launcher(pid, first) {
            eprintln!("interrupt: {e}");
        }
    })
    .context("installing the Ctrl-C handler")?;
    eprintln!("starting {n} CPU ranks under mpirun");
    let status = child.wait_with_output().context("waiting for mpirun")?.status;
    if presses.load(std::sync::atomic::Ordering::SeqCst) > 0 && status.success() {
        eprintln!("interrupted: continue with `sluice train --resume` and the same --nproc");
        return Ok(());
    }
    anyhow::ensure!(status.success(), "the ranks failed ({status}); the first error is printed above");
    Ok(())
}

/// Starts one worker process per listed GPU (torchrun's variables, NCCL) and waits for them; with `--nnodes`, this
/// machine's share of the ranks.
fn launch_local(args: &Args, n: usize) -> Result<()> {
    let exe = std::env::current_exe().context("finding the sluice binary")?;
    let mut launch = sluice_dist::LocalLaunch::new(exe, n);
    launch.args = worker_args();
    launch.nnodes = args.nnodes.max(1);
    launch.node_rank = args.node_rank;
    launch.port = args.master_port;
    match &args.master_addr {
        Some(a) => launch.master_addr = a.clone(),
        None => anyhow::ensure!(args.nnodes <= 1, "--nnodes {} needs --master-addr: rank 0's host", args.nnodes),
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    eprintln!("starting {n} GPU ranks");
    sluice_dist::run_local(&launch, &stop)?;
    Ok(())
}
