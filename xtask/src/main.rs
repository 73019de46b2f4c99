//! Developer tasks for the Sluice workspace, run as `cargo xtask <task>`.
//!
//! `ci` runs the checks CI runs, cheapest first: formatting, clippy with warnings denied, then the tests.

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
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.task {
        Task::Ci { tests_only } => ci(&root, tests_only),
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
