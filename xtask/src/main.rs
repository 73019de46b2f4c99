//! Developer tasks for the Sluice workspace, run as `cargo xtask <task>`.
//!
//! `ci` runs the checks CI runs, cheapest first: formatting, clippy with warnings denied, then the tests.
//! `train` trains the embedded default: it generates the synthetic shapes dataset when it is absent, builds the
//! `sluice` binary in release mode and runs `sluice train --config configs/quick.yaml`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Sluice developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Formatting check, clippy (-D warnings) and the whole test suite, cheapest first.
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
        Task::Ci { tests_only } => ci(&root, tests_only),
        Task::Train { config, rest } => train(&root, &config, &rest),
        Task::GenData { args } => {
            let mut cmd =
                vec!["run", "--release", "--quiet", "-p", "sluice-train", "--bin", "sluice", "--", "data", "gen"];
            cmd.extend(args.iter().map(String::as_str));
            cargo(&root, &cmd)
        }
    }
}

/// The workspace root: the parent of this crate's manifest directory.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn ci(root: &Path, tests_only: bool) -> Result<()> {
    if !tests_only {
        ensure_component("rustfmt", &["fmt", "--version"])?;
        ensure_component("clippy", &["clippy", "--version"])?;
        cargo(root, &["fmt", "--all", "--check"])?;
        cargo(root, &["clippy", "--workspace", "--all-targets", "--locked", "--", "-D", "warnings"])?;
    }
    cargo(root, &["test", "--workspace", "--locked"])?;
    Ok(())
}

fn train(root: &Path, config: &Path, rest: &[String]) -> Result<()> {
    let config = if config.is_absolute() { config.to_path_buf() } else { root.join(config) };
    let text = std::fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    let data = text
        .lines()
        .find_map(|l| l.strip_prefix("data:"))
        .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
        .unwrap_or_else(|| "datasets/synthetic/data.yaml".into());
    let synth = sluice_dataset::synth::SynthConfig::quick(root.join("datasets/synthetic"));
    // Generated when absent, and regenerated when it was made with other settings (an older generator).
    if root.join(&data) == synth.out.join("data.yaml") && !sluice_dataset::synth::is_generated_with(&synth) {
        let s = sluice_dataset::synth::generate(&synth)
            .with_context(|| format!("generating the synthetic dataset in {}", synth.out.display()))?;
        eprintln!(
            "xtask: generated {} ({} train + {} val images)",
            s.data_yaml.display(),
            s.train_images,
            s.val_images
        );
    }
    let config = config.to_string_lossy().into_owned();
    let mut args = vec!["run", "--release", "--quiet", "-p", "sluice-train", "--bin", "sluice", "--", "train"];
    args.extend(["--config", &config]);
    args.extend(rest.iter().map(String::as_str));
    cargo(root, &args)
}

/// Installs a rustup component when `cargo <probe>` fails (a fresh machine may lack rustfmt or clippy).
fn ensure_component(component: &str, probe: &[&str]) -> Result<()> {
    let ok = Command::new("cargo").args(probe).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        eprintln!("xtask: installing rustup component {component}");
        run(Command::new("rustup").args(["component", "add", component]))?;
    }
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("xtask: cargo {}", args.join(" "));
    run(Command::new("cargo").args(args).current_dir(root))
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}
