//! Developer tasks for the Sluice workspace, run as `cargo xtask <task>`.
//!
//! `ci` runs the checks CI runs, listed in [`ci`]: formatting, clippy with warnings denied and the tests of the
//! workspace, of `sluice-decode`'s `nvjpeg` and `turbojpeg` backends, of `fuzz/` and of the vendored candle-core,
//! and clippy of the `cuda` and `cudnn` features with the CUDA compiler from PyPI (no GPU).
//! `train` trains the embedded default: it builds the `sluice` binary in release mode, has it generate the
//! synthetic shapes dataset when it is absent and runs `sluice train --config configs/quick.yaml`, saying which of
//! these it is doing. xtask itself depends on `sluice-testkit` alone, so it builds in seconds.
//! `tidy` checks the crate graph against ARCHITECTURE.md's dependency rule ([`tidy`]).
//! `gpu-build` / `gpu-check`: the CUDA build on a machine without a GPU, and the device check ([`gpu`]).
//! `bench` builds the release `sluice` once and runs the peer-comparison scripts of `benches/` with it (`SLUICE`
//! set, so they do not build it again), writing their combined output to stdout and to a results file under the
//! target directory's `bench/`.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

mod ci;
mod gpu;
mod tidy;

/// The package of the `sluice` binary.
const CLI_PACKAGE: &str = "sluice-cli";

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Sluice developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Everything CI checks: formatting, clippy (-D warnings) and the tests of the workspace, its decode backends,
    /// `fuzz/` (corpus replay) and the vendored candle-core, and clippy of the `cuda`/`cudnn` features (no GPU).
    Ci {
        /// Skip `cargo fmt --check` and clippy; run only the tests.
        #[arg(long)]
        tests_only: bool,
    },
    /// Train the embedded default (configs/quick.yaml on the synthetic dataset, generated when absent) on the CPU.
    Train {
        /// Settings file.
        #[arg(long, default_value = "configs/quick.yaml")]
        config: PathBuf,
        /// More `sluice train` flags, after `--` (e.g. `-- --epochs 3`).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Build the release `sluice` once, then run the peer-comparison scripts of `benches/` with it (they need the
    /// peers' venv, found through `PEERS_DIR`, see `sluice_testkit::locations`) and write their output to stdout and to
    /// `<target dir>/bench/<UTC date-time>-<case>.txt`. The scripts read their settings from the environment
    /// (e.g. `PEERS_REPEATS=1`; see each script's header).
    Bench {
        /// Which comparison: loader (benches/loader_vs_ultralytics.sh), model (benches/model_vs_pytorch.sh),
        /// decode (benches/decode_vs_peers.sh) or all three (decode, model, loader).
        #[arg(value_enum, default_value_t = BenchCase::All)]
        case: BenchCase,
        /// Cargo features of the `sluice` build, e.g. `turbojpeg` (for `BACKEND=turbojpeg` in the decode script).
        #[arg(long, conflicts_with = "sluice")]
        features: Option<String>,
        /// Use this prebuilt `sluice` binary instead of building one.
        #[arg(long)]
        sluice: Option<PathBuf>,
        /// The script's own arguments, after `--`: its cases, e.g. `-- train320 infer1` (not with `all`).
        #[arg(last = true)]
        rest: Vec<String>,
    },
    /// Build the release `sluice` with CUDA on a machine without a GPU: installs NVIDIA's CUDA 13.0 wheels into a
    /// cache folder (`SLUICE_CUDA_SDK`, default ~/.cache/sluice/cuda-13.0), generates a link-time driver stub and
    /// builds into `<target>/cuda/release/sluice` (stripped).
    GpuBuild {
        /// Cargo features of the build: `cuda`, or `cuda,cudnn` (installs the cuDNN 9 wheel too, about 900 MB).
        #[arg(long, default_value = "cuda")]
        features: String,
    },
    /// Prepare the device check: `gpu-build`, then the binary, the script and a slice of coco128 under
    /// `<target>/gpu-check/`, and print how to run it on any CUDA machine.
    GpuCheck {
        /// Use this CUDA `sluice` instead of building one.
        #[arg(long)]
        sluice: Option<PathBuf>,
        /// Features of the build when it builds one: `cuda` (default: needs only the CUDA libraries the device's
        /// PyTorch carries), or `cuda,cudnn` (Sluice's cuDNN convolutions; the binary then needs libcudnn.so.9 on
        /// the device, from PyTorch's cu13 cuDNN wheel, or it does not start); `nccl` adds the one-rank NCCL
        /// training step (libnccl is loaded at run time, from PyTorch's NCCL wheel on the device).
        #[arg(long, default_value = "cuda")]
        features: String,
        /// Keep the prepared folder and the repository's tracked files together under this many MiB, leaving
        /// behind the coco128 slice, then the nvJPEG steps, when they do not fit.
        #[arg(long, value_name = "MIB")]
        max_mib: Option<u64>,
    },
    /// Check the crate graph against the dependency rule of ARCHITECTURE.md (`cargo metadata`).
    Tidy,
    /// Compile every CUDA C kernel source of the crates (`crates/*/src/**/*.cu`, which the binary compiles with
    /// NVRTC at run time) for sm_90 with nvcc and ptxas from the CUDA 13.0 compiler wheels (installed into
    /// `<target>/cuda-sdk` when missing; no GPU needed), warnings as errors. `cargo xtask ci` runs it too.
    Kernels,
    /// Generate the synthetic shapes dataset (JPEGs + YOLO labels + data.yaml), deterministic from the seed:
    /// runs `sluice data gen` with these flags (see `sluice data gen --help`; default: the embedded default set
    /// in datasets/synthetic).
    GenData {
        /// `sluice data gen` flags, e.g. `--preset default --train 256 --out datasets/other`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.task {
        Task::Ci { tests_only } => ci::ci(&root, tests_only),
        Task::Train { config, rest } => train(&root, &config, &rest),
        Task::Bench { case, features, sluice, rest } => bench(&root, case, features.as_deref(), sluice, &rest),
        Task::GpuBuild { features } => gpu::gpu_build(&root, &features).map(|_| ()),
        Task::GpuCheck { sluice, features, max_mib } => gpu::gpu_check(&root, sluice, &features, max_mib),
        Task::Tidy => tidy::tidy(&root),
        Task::Kernels => gpu::compile_kernels(&root, &gpu::ci_sdk_root(&root)).map(|_| ()),
        Task::GenData { args } => {
            let mut cmd =
                vec!["run", "--release", "--quiet", "-p", CLI_PACKAGE, "--bin", "sluice", "--", "data", "gen"];
            cmd.extend(args.iter().map(String::as_str));
            cargo(&root, &cmd)
        }
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn train(root: &Path, config: &Path, rest: &[String]) -> Result<()> {
    let config = if config.is_absolute() { config.to_path_buf() } else { root.join(config) };
    let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
        .unwrap_or_else(|| "datasets/synthetic/data.yaml".into());
    let bin = target_dir(root).join("release").join("sluice");
    if bin.is_file() {
        eprintln!("xtask: bringing the release sluice binary up to date ...");
    } else {
        eprintln!("xtask: building the release sluice binary (first time: several minutes) ...");
    }
    cargo(root, &["build", "--release", "-p", CLI_PACKAGE, "--bin", "sluice"])?;
    // The embedded default's dataset is generated by the binary itself, when absent or made with other settings
    // (xtask stays free of the dataset crate and its image codecs, so it builds in seconds).
    let synth = root.join("datasets/synthetic");
    if root.join(&data) == synth.join("data.yaml") {
        let mut generate = Command::new(&bin);
        generate.args(["data", "gen", "--preset", "quick", "--unless-current", "--out"]).arg(&synth).current_dir(root);
        run(&mut generate).with_context(|| format!("generating the synthetic dataset in {}", synth.display()))?;
    }
    let mut cmd = Command::new(&bin);
    cmd.arg("train").arg("--config").arg(&config).args(rest).current_dir(root);
    eprintln!("xtask: running {} train --config {}{}", bin.display(), config.display(), shell_tail(rest));
    run(&mut cmd)
}

/// ` a b c` for a non-empty argument list, else nothing.
fn shell_tail(args: &[String]) -> String {
    args.iter().map(|a| format!(" {a}")).collect()
}

/// The comparisons `cargo xtask bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BenchCase {
    Loader,
    Model,
    Decode,
    All,
}

impl BenchCase {
    fn name(self) -> &'static str {
        match self {
            Self::Loader => "loader",
            Self::Model => "model",
            Self::Decode => "decode",
            Self::All => "all",
        }
    }

    /// The scripts, relative to the workspace root, cheapest first.
    fn scripts(self) -> &'static [&'static str] {
        const DECODE: &str = "benches/decode_vs_peers.sh";
        const MODEL: &str = "benches/model_vs_pytorch.sh";
        const LOADER: &str = "benches/loader_vs_ultralytics.sh";
        match self {
            Self::Loader => &[LOADER],
            Self::Model => &[MODEL],
            Self::Decode => &[DECODE],
            Self::All => &[DECODE, MODEL, LOADER],
        }
    }
}

fn bench(
    root: &Path,
    case: BenchCase,
    features: Option<&str>,
    prebuilt: Option<PathBuf>,
    rest: &[String],
) -> Result<()> {
    if case == BenchCase::All && !rest.is_empty() {
        bail!("script arguments after `--` need one case (loader, model or decode): each script has its own cases");
    }
    let target = target_dir(root);
    let sluice = match prebuilt {
        Some(p) => std::path::absolute(&p).with_context(|| format!("resolving {}", p.display()))?,
        None => {
            let mut build = vec!["build", "--release", "--quiet", "-p", CLI_PACKAGE, "--bin", "sluice"];
            if let Some(f) = features {
                build.extend(["--features", f]);
            }
            cargo(root, &build)?;
            target.join("release").join("sluice")
        }
    };
    if !sluice.is_file() {
        bail!("no sluice binary at {} (set CARGO_TARGET_DIR to cargo's target directory)", sluice.display());
    }
    let dir = target.join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let (stamp, iso) = utc_now();
    let path = dir.join(format!("{stamp}-{}.txt", case.name()));
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let mut header = format!("# cargo xtask bench {}", case.name());
    if let Some(f) = features {
        header.push_str(&format!(" --features {f}"));
    }
    if !rest.is_empty() {
        header.push_str(&format!(" -- {}", rest.join(" ")));
    }
    header.push_str(&format!(
        "\n# {iso} UTC, commit {}, {}, sluice {}\n",
        git_commit(root),
        machine(),
        sluice.display()
    ));
    tee(&mut file, header.as_bytes())?;
    let mut failed = Vec::new();
    for script in case.scripts() {
        tee(&mut file, format!("==== {script} {}\n", rest.join(" ")).as_bytes())?;
        let mut cmd = Command::new("bash");
        cmd.arg(root.join(script)).args(rest).env("SLUICE", &sluice).current_dir(root);
        let status = run_tee(cmd, &mut file).with_context(|| format!("running {script}"))?;
        if !status.success() {
            tee(&mut file, format!("!! {script} failed with {status}\n").as_bytes())?;
            failed.push(*script);
        }
    }
    eprintln!("xtask: results in {}", path.display());
    if !failed.is_empty() {
        bail!("{} failed (see {})", failed.join(", "), path.display());
    }
    Ok(())
}

/// Cargo's target directory: `CARGO_TARGET_DIR` (relative to the workspace root) or `<root>/target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => root.join(d),
        _ => root.join("target"),
    }
}

/// Writes `bytes` to stdout and to `file`.
fn tee(file: &mut File, bytes: &[u8]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes).and_then(|()| out.flush()).context("writing to stdout")?;
    file.write_all(bytes).context("writing the results file")
}

/// Runs `cmd` with its stdout and stderr joined into one pipe, copied to stdout and to `file` as it comes.
fn run_tee(mut cmd: Command, file: &mut File) -> Result<std::process::ExitStatus> {
    let (mut reader, writer) = std::io::pipe().context("creating a pipe")?;
    cmd.stdout(writer.try_clone().context("cloning the pipe")?).stderr(writer);
    let mut child = cmd.spawn().with_context(|| format!("cannot start {cmd:?}"))?;
    // The command holds the pipe's write ends: drop it so the reader sees the end when the child exits.
    drop(cmd);
    let mut buf = [0u8; 8192];
    loop {
        let n = reader.read(&mut buf).context("reading the script's output")?;
        if n == 0 {
            break;
        }
        tee(file, &buf[..n])?;
    }
    child.wait().context("waiting for the script")
}

/// `git rev-parse --short HEAD`, with `-dirty` when the tree has changes; `unknown` without git.
fn git_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        Some(c) if git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty()) => format!("{c}-dirty"),
        Some(c) => c,
        None => "unknown".into(),
    }
}

/// Cores and load average, for the results header.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into());
    format!("{cores} cores, load {load}")
}

/// The current UTC time as `YYYYmmdd-HHMMSS` (for file names) and `YYYY-mm-ddTHH:MM:SS`.
fn utc_now() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let (hh, mm, ss) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    (format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}"), format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}"))
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Installs a rustup component when `cargo <probe>` fails (a fresh machine may lack rustfmt or clippy).
pub(crate) fn ensure_component(component: &str, probe: &[&str]) -> Result<()> {
    let ok = Command::new("cargo").args(probe).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("xtask: installing rustup component {component}");
        run(Command::new("rustup").args(["component", "add", component]))?;
    }
    Ok(())
}

pub(crate) fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    run(Command::new("cargo").args(args).current_dir(root))
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_of_known_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    #[test]
    fn all_runs_every_script_cheapest_first() {
        let all = BenchCase::All.scripts();
        assert_eq!(all.len(), 3);
        for one in [BenchCase::Decode, BenchCase::Model, BenchCase::Loader] {
            assert!(all.contains(&one.scripts()[0]));
        }
        assert_eq!(all[0], BenchCase::Decode.scripts()[0]);
    }
}
