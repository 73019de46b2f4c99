//! `sluice pack`: packs a split of a dataset into one shard file (encoded images + binary labels, a crc32 per
//! record), written atomically. Record `i` is sample `i` of the split's index. The logic lives in
//! `sluice_loader::split` (on `sluice-dataset`'s index and `sluice-storage`'s shard writer).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_dataset::{IndexOptions, Split};
use sluice_loader::split::{load_split_with, pack_index};

/// Arguments of `sluice pack`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The dataset YAML (Ultralytics format).
    #[arg(long)]
    data: PathBuf,
    /// The split: train, val or test.
    #[arg(long, default_value = "train")]
    split: String,
    /// The shard to write (e.g. train.sluice).
    #[arg(long)]
    out: PathBuf,
    /// Neither read nor write the label cache.
    #[arg(long)]
    no_cache: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Packed {
    out: PathBuf,
    records: u64,
    image_bytes: u64,
    label_bytes: u64,
    file_bytes: u64,
    images_found: usize,
    images_skipped: usize,
    problems: usize,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let split: Split = args.split.parse()?;
    let opts = IndexOptions { cache: !args.no_cache, ..IndexOptions::default() };
    let indexed = load_split_with(&args.data, split, &opts, false, &crate::cmd::remote_from_env()?)
        .with_context(|| format!("indexing {} of {}", args.split, args.data.display()))?
        .indexed;
    let summary =
        pack_index(&indexed.index, &args.out).with_context(|| format!("packing into {}", args.out.display()))?;
    let report = Packed {
        out: summary.path,
        records: summary.records,
        image_bytes: summary.image_bytes,
        label_bytes: summary.label_bytes,
        file_bytes: summary.file_bytes,
        images_found: indexed.found,
        images_skipped: indexed.found - indexed.index.len(),
        problems: indexed.problems.len(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "wrote {} ({} records, {:.1} MB of images; {} of {} images skipped, {} problems: see `sluice data check`)",
            report.out.display(),
            report.records,
            report.image_bytes as f64 / 1e6,
            report.images_skipped,
            report.images_found,
            report.problems
        );
    }
    Ok(())
}
