//! `sluice info`: what this binary was built with and what the machine offers.

use anyhow::Result;
use serde::Serialize;

/// Arguments of `sluice info`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Info {
    version: &'static str,
    threads: usize,
    profile: &'static str,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let info = Info {
        version: env!("CARGO_PKG_VERSION"),
        threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        profile: if cfg!(debug_assertions) { "debug" } else { "release" },
    };
    if args.json {
        println!("{}", serde_json::to_string(&info)?);
    } else {
        println!("sluice {} ({} build), {} threads available", info.version, info.profile, info.threads);
    }
    Ok(())
}
