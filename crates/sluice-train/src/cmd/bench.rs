//! `sluice bench <stage>`: one entry point for the stage benchmarks that run from the binary. Each prints medians,
//! or one JSON object with `--json`. Today: `model` (the same as `sluice model bench`).

use anyhow::Result;

/// Arguments of `sluice bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, clap::Subcommand)]
enum BenchCommand {
    /// YOLOv8 eval forward, fused forward and training step (JSON keys `eval_forward_ms`, `fused_forward_ms`,
    /// `train_step_ms`).
    Model(super::model::BenchArgs),
}

pub(crate) fn run(args: Args) -> Result<()> {
    match args.command {
        BenchCommand::Model(a) => super::model::run_bench(a),
    }
}
