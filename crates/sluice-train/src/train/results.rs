//! Per-epoch records of a run: `results.csv` with Ultralytics' columns (so existing plotting scripts read it), and
//! `telemetry.jsonl` with where the time went.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use serde::{Deserialize, Serialize};

/// Ultralytics' `results.csv` header for detection with three parameter groups, then `val/skipped`: the val
/// images the last validation left out because they could not be read or decoded (Ultralytics' plotting reads its
/// columns by position, so one more at the end changes nothing for it). With MuSGD's eight groups the learning
/// rates run from `lr/pg0` to `lr/pg7`, as Ultralytics writes them.
pub const RESULTS_HEADER: [&str; 16] = [
    "epoch",
    "time",
    "train/box_loss",
    "train/cls_loss",
    "train/dfl_loss",
    "metrics/precision(B)",
    "metrics/recall(B)",
    "metrics/mAP50(B)",
    "metrics/mAP50-95(B)",
    "val/box_loss",
    "val/cls_loss",
    "val/dfl_loss",
    "lr/pg0",
    "lr/pg1",
    "lr/pg2",
    "val/skipped",
];

/// Columns of `results.csv` before the learning rates.
const BEFORE_LR: usize = 12;

/// One row of `results.csv`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRow {
    /// 1-based epoch.
    pub epoch: u32,
    /// Wall seconds since the start of training (cumulative, as Ultralytics writes it).
    pub time: f64,
    /// Mean training losses (box, cls, dfl) over the epoch.
    pub train_loss: [f64; 3],
    /// Precision, recall, mAP50, mAP50-95 of the last validation (NaN-free: 0 before the first).
    pub metrics: [f64; 4],
    /// Mean validation losses (box, cls, dfl).
    pub val_loss: [f64; 3],
    /// Learning rates of the parameter groups at the end of the epoch (three, or MuSGD's eight).
    pub lr: Vec<f64>,
    /// Val images the last validation skipped (unreadable or undecodable).
    pub val_skipped: u64,
}

impl EpochRow {
    fn to_csv(&self) -> String {
        let mut fields = vec![self.epoch.to_string(), format!("{:.3}", self.time)];
        let rest = self.train_loss.iter().chain(&self.metrics).chain(&self.val_loss).chain(&self.lr);
        fields.extend(rest.map(|v| format!("{v:.8}")));
        fields.push(self.val_skipped.to_string());
        fields.join(",")
    }

    /// A row of a file whose header has `n_lr` learning-rate columns, then `val/skipped` when `skipped`.
    fn from_csv(line: &str, n_lr: usize, skipped: bool) -> Option<Self> {
        let v: Vec<f64> = line.split(',').map(|s| s.trim().parse::<f64>()).collect::<Result<_, _>>().ok()?;
        if v.len() != BEFORE_LR + n_lr + usize::from(skipped) {
            return None;
        }
        Some(Self {
            epoch: v[0] as u32,
            time: v[1],
            train_loss: [v[2], v[3], v[4]],
            metrics: [v[5], v[6], v[7], v[8]],
            val_loss: [v[9], v[10], v[11]],
            lr: v[BEFORE_LR..BEFORE_LR + n_lr].to_vec(),
            val_skipped: if skipped { v[BEFORE_LR + n_lr] as u64 } else { 0 },
        })
    }
}

/// The header for `n_lr` parameter groups, with the one-bin head's loss names when `l1`.
fn header(n_lr: usize, l1: bool) -> String {
    let name = |h: &str| if l1 { h.replace("dfl_loss", "l1_loss") } else { h.to_string() };
    let mut cols: Vec<String> = RESULTS_HEADER[..BEFORE_LR].iter().map(|h| name(h)).collect();
    cols.extend((0..n_lr).map(|i| format!("lr/pg{i}")));
    cols.push(RESULTS_HEADER[RESULTS_HEADER.len() - 1].to_string());
    cols.join(",")
}

/// Appends rows to `results.csv`, flushing each one (a crash loses nothing already written).
#[derive(Debug)]
pub struct ResultsCsv {
    path: PathBuf,
}

impl ResultsCsv {
    /// Opens `path`: a new file gets the header; an existing one (resume) keeps the rows of epochs before
    /// `keep_epochs` and drops later ones, so a resumed run never duplicates an epoch.
    pub fn open(path: &Path, keep_epochs: u32) -> Result<Self> {
        Self::open_named(path, keep_epochs, false, 3)
    }

    /// [`Self::open`] for a model whose third loss term is the L1 box-distance term when `l1` (a one-bin head,
    /// YOLO26: its columns are `train/l1_loss` and `val/l1_loss`, as Ultralytics names them), with `n_lr`
    /// learning-rate columns (3, or MuSGD's 8).
    pub fn open_named(path: &Path, keep_epochs: u32, l1: bool, n_lr: usize) -> Result<Self> {
        let kept: Vec<EpochRow> = if path.exists() {
            Self::read(path)?.into_iter().filter(|r| r.epoch <= keep_epochs).collect()
        } else {
            Vec::new()
        };
        let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        writeln!(f, "{}", header(n_lr, l1))?;
        for r in kept {
            writeln!(f, "{}", r.to_csv())?;
        }
        f.sync_all()?;
        Ok(Self { path: path.to_path_buf() })
    }

    /// Appends one row.
    pub fn append(&self, row: &EpochRow) -> Result<()> {
        let mut f = OpenOptions::new()
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        writeln!(f, "{}", row.to_csv())?;
        f.flush()?;
        Ok(())
    }

    /// Every row of a `results.csv`; a malformed line is an error naming the file and line.
    pub fn read(path: &Path) -> Result<Vec<EpochRow>> {
        let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut rows = Vec::new();
        // Files written before the `val/skipped` column have Ultralytics' columns only.
        let (mut n_lr, mut skipped) = (3, false);
        for (i, line) in BufReader::new(f).lines().enumerate() {
            let line = line?;
            if i == 0 {
                let cols: Vec<&str> = line.split(',').map(str::trim).collect();
                n_lr = cols.iter().filter(|c| c.starts_with("lr/pg")).count();
                skipped = cols.contains(&"val/skipped");
                if n_lr == 0 && !skipped {
                    (n_lr, skipped) = (3, cols.len() == RESULTS_HEADER.len());
                }
                continue;
            }
            if line.trim().is_empty() {
                continue;
            }
            let row = EpochRow::from_csv(&line, n_lr, skipped)
                .with_context(|| format!("{}:{}: not a results row: '{line}'", path.display(), i + 1))?;
            rows.push(row);
        }
        Ok(rows)
    }
}

/// Appends one JSON object per line.
#[derive(Debug)]
pub struct JsonLines {
    path: PathBuf,
}

impl JsonLines {
    /// Opens (creating) `path` for appending.
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf() }
    }

    /// Appends `value` as one line.
    pub fn append<T: Serialize>(&self, value: &T) -> Result<()> {
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        writeln!(f, "{}", serde_json::to_string(value)?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(epoch: u32) -> EpochRow {
        EpochRow {
            epoch,
            time: 1.5 * epoch as f64,
            train_loss: [1.0, 2.0, 3.0],
            metrics: [0.1, 0.2, 0.3, 0.4],
            val_loss: [4.0, 5.0, 6.0],
            lr: vec![0.01, 0.01, 0.02],
            val_skipped: u64::from(epoch == 2),
        }
    }

    #[test]
    fn rows_round_trip_and_resume_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("results.csv");
        let csv = ResultsCsv::open(&p, 0).unwrap();
        for e in 1..=3 {
            csv.append(&row(e)).unwrap();
        }
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.starts_with("epoch,time,train/box_loss,"));
        assert_eq!(ResultsCsv::read(&p).unwrap(), vec![row(1), row(2), row(3)]);
        // Resuming after epoch 2 drops the row of epoch 3.
        let csv = ResultsCsv::open(&p, 2).unwrap();
        csv.append(&row(3)).unwrap();
        assert_eq!(ResultsCsv::read(&p).unwrap(), vec![row(1), row(2), row(3)]);
        // A file with Ultralytics' 15 columns reads with no skipped images.
        std::fs::write(&p, "h\n1,1.5,1,2,3,0.1,0.2,0.3,0.4,4,5,6,0.01,0.01,0.02\n").unwrap();
        assert_eq!(ResultsCsv::read(&p).unwrap(), vec![EpochRow { val_skipped: 0, ..row(1) }]);
        // MuSGD's eight groups: lr/pg0 … lr/pg7, and the one-bin head's loss names.
        let csv = ResultsCsv::open_named(&p, 0, true, 8).unwrap();
        let r8 = EpochRow { lr: (0..8).map(|i| 0.01 * f64::from(i)).collect(), ..row(1) };
        csv.append(&r8).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("val/l1_loss,lr/pg0,lr/pg1,lr/pg2,lr/pg3,lr/pg4,lr/pg5,lr/pg6,lr/pg7,val/skipped\n"));
        assert_eq!(ResultsCsv::read(&p).unwrap(), vec![r8]);
        std::fs::write(&p, "h\n1,2,x\n").unwrap();
        let e = ResultsCsv::read(&p).unwrap_err();
        assert!(format!("{e:#}").contains("results.csv:2"), "{e:#}");
    }
}
