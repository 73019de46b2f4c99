//! `sluice eval-coco`: COCO bbox evaluation of a results file against a ground-truth file, with the exact
//! pycocotools algorithm (`sluice-eval`); prints the 12 `summarize()` lines, or one JSON object with `--json`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use sluice_eval::coco::STAT_NAMES;
use sluice_eval::{CocoDataset, CocoParams, Detections, coco_evaluate};

/// Arguments of `sluice eval-coco`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// COCO ground-truth JSON (`images`, `annotations` with `area`, `categories`).
    #[arg(long)]
    gt: PathBuf,
    /// COCO results JSON: a list of `{image_id, category_id, bbox: [x, y, w, h], score}`.
    #[arg(long)]
    dt: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Worker threads (1: on the calling thread; 0: one per core).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[derive(Serialize)]
struct Report<'a> {
    stats: &'a [f64],
    stat_names: [&'static str; 12],
    images: usize,
    annotations: usize,
    detections: usize,
    skipped_unknown_category: usize,
    threads: usize,
    load_s: f64,
    eval_s: f64,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    let gt = CocoDataset::from_path(&args.gt).context("reading the ground truth")?;
    let dt = Detections::from_path(&args.dt, &gt).context("reading the detections")?;
    let t1 = Instant::now();
    let ev = coco_evaluate(&gt, &dt, &CocoParams::default(), args.threads).context("evaluating")?;
    let eval_s = t1.elapsed().as_secs_f64();
    if args.json {
        let report = Report {
            stats: &ev.stats,
            stat_names: STAT_NAMES,
            images: gt.images.len(),
            annotations: gt.annotations.len(),
            detections: dt.dets.len(),
            skipped_unknown_category: dt.skipped_unknown_category,
            threads: args.threads,
            load_s: (t1 - t0).as_secs_f64(),
            eval_s,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        for line in ev.summary_lines() {
            println!("{line}");
        }
        if dt.skipped_unknown_category > 0 {
            eprintln!(
                "note: {} detections of categories not in the ground truth were skipped",
                dt.skipped_unknown_category
            );
        }
    }
    Ok(())
}
