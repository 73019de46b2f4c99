//! `results.png`: Ultralytics' 2 x 5 grid of the losses and metrics in `results.csv`, one panel per column over
//! the epochs, the values with markers plus a Gaussian-smoothed dotted line (`gaussian_filter1d`, sigma 3).
//! The CSV is read by header name, so the column order does not matter and extra columns are ignored.

use std::ops::Range;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::{LINE_PALETTE, PlotError, Result, draw_err, ensure_font, hex, save_rgb};

/// The columns [`plot_results`] draws, in panel order (row 1: train losses, precision, recall; row 2: val
/// losses, mAP50, mAP50-95), as Ultralytics' `plot_results` lays them out.
pub(super) const RESULT_COLUMNS: [&str; 10] = [
    "train/box_loss",
    "train/cls_loss",
    "train/dfl_loss",
    "metrics/precision(B)",
    "metrics/recall(B)",
    "val/box_loss",
    "val/cls_loss",
    "val/dfl_loss",
    "metrics/mAP50(B)",
    "metrics/mAP50-95(B)",
];

/// Size of `results.png` in pixels `(width, height)`.
pub(super) const RESULTS_SIZE: (u32, u32) = (2000, 1000);

/// A numeric CSV table: the header's column names and one row of numbers per data line.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ResultsTable {
    /// The file it was read from.
    pub path: PathBuf,
    /// Column names (trimmed).
    pub columns: Vec<String>,
    /// Data rows, each with one value per column (`nan` / `inf` parse as such).
    pub rows: Vec<Vec<f64>>,
}

impl ResultsTable {
    /// Reads a CSV file whose first non-empty line is the header and every other non-empty line holds one number
    /// per column. Errors name the file and the 1-based line.
    pub(super) fn read(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| PlotError::Io { path: path.to_path_buf(), source })?;
        Self::parse(&text, path)
    }

    /// Parses CSV text (`path` only names the file in errors).
    pub(super) fn parse(text: &str, path: &Path) -> Result<Self> {
        let csv_err = |line: usize, reason: String| PlotError::Csv { path: path.to_path_buf(), line, reason };
        let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.trim_end_matches('\r')));
        let (header_line, header) = lines
            .by_ref()
            .find(|(_, l)| !l.trim().is_empty())
            .ok_or_else(|| csv_err(1, "empty file: no header line".into()))?;
        let columns: Vec<String> = header.split(',').map(|c| c.trim().to_string()).collect();
        if let Some(i) = columns.iter().position(String::is_empty) {
            return Err(csv_err(header_line, format!("header column {} has no name", i + 1)));
        }
        let mut rows = Vec::new();
        for (n, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != columns.len() {
                return Err(csv_err(n, format!("{} fields, the header has {}", fields.len(), columns.len())));
            }
            let row = fields
                .iter()
                .zip(&columns)
                .map(|(f, c)| {
                    f.trim()
                        .parse::<f64>()
                        .map_err(|_| csv_err(n, format!("column '{c}': '{}' is not a number", f.trim())))
                })
                .collect::<Result<Vec<f64>>>()?;
            rows.push(row);
        }
        Ok(Self { path: path.to_path_buf(), columns, rows })
    }

    /// The values of column `name`, one per row, or an error naming the file and the missing column.
    pub(super) fn column(&self, name: &str) -> Result<Vec<f64>> {
        let i = self.columns.iter().position(|c| c == name).ok_or_else(|| PlotError::Invalid {
            what: "results table",
            reason: format!("{} has no column '{name}' (columns: {})", self.path.display(), self.columns.join(", ")),
        })?;
        Ok(self.rows.iter().map(|r| r[i]).collect())
    }
}

/// SciPy's `gaussian_filter1d(y, sigma)` with its defaults (`mode='reflect'`, `truncate=4.0`).
pub(super) fn gaussian_filter1d(y: &[f64], sigma: f64) -> Vec<f64> {
    let n = y.len();
    if n == 0 || sigma <= 0.0 {
        return y.to_vec();
    }
    let radius = (4.0 * sigma + 0.5) as i64;
    let weights: Vec<f64> = (-radius..=radius).map(|k| (-0.5 * (k as f64 / sigma).powi(2)).exp()).collect();
    let total: f64 = weights.iter().sum();
    // 'reflect' extends (d c b a | a b c d | d c b a): period 2n, mirrored in the second half.
    let reflect = |i: i64| -> usize {
        let period = 2 * n as i64;
        let m = i.rem_euclid(period);
        (if m >= n as i64 { period - 1 - m } else { m }) as usize
    };
    (0..n as i64)
        .map(|i| (-radius..=radius).zip(&weights).map(|(k, w)| w * y[reflect(i + k)]).sum::<f64>() / total)
        .collect()
}

/// A padded axis range covering `values` (finite ones only); `[0, 1]` when there is none.
fn axis_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) =
        values.filter(|v| v.is_finite()).fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let span = hi - lo;
    let pad = if span > 0.0 { span * 0.05 } else { (lo.abs() * 0.05).max(1e-3) };
    lo - pad..hi + pad
}

/// Draws `results.png` from `results.csv`: a 2 x 5 grid of the [`RESULT_COLUMNS`] over the `epoch` column.
/// Errors name the file and line of a malformed row, or the missing column.
pub(crate) fn plot_results(results_csv: &Path, out_png: &Path) -> Result<()> {
    let table = ResultsTable::read(results_csv)?;
    if table.rows.is_empty() {
        return Err(PlotError::Invalid {
            what: "results table",
            reason: format!("{} has a header but no epoch rows", results_csv.display()),
        });
    }
    let epochs = table.column("epoch")?;
    // A one-bin head (YOLO26) has `l1_loss` columns where DFL heads have `dfl_loss`, as Ultralytics names them.
    let series: Vec<(String, Vec<f64>)> = RESULT_COLUMNS
        .iter()
        .map(|&c| {
            let l1 = c.replace("dfl_loss", "l1_loss");
            let name = if l1 != c && table.columns.contains(&l1) { l1 } else { c.to_string() };
            table.column(&name).map(|v| (name, v))
        })
        .collect::<Result<_>>()?;
    ensure_font()?;
    let (w, h) = RESULTS_SIZE;
    let mut buf = vec![255u8; 3 * w as usize * h as usize];
    let err = draw_err(out_png);
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let panels = root.split_evenly((2, 5));
        for (k, (area, (name, ys))) in panels.iter().zip(&series).enumerate() {
            let points: Vec<(f64, f64)> =
                epochs.iter().zip(ys).filter(|(x, y)| x.is_finite() && y.is_finite()).map(|(&x, &y)| (x, y)).collect();
            let ys_finite: Vec<f64> = points.iter().map(|p| p.1).collect();
            let smooth: Vec<(f64, f64)> =
                points.iter().zip(gaussian_filter1d(&ys_finite, 3.0)).map(|(p, s)| (p.0, s)).collect();
            let xr = axis_range(points.iter().map(|p| p.0));
            let yr = axis_range(points.iter().map(|p| p.1).chain(smooth.iter().map(|p| p.1)));
            let mut chart = ChartBuilder::on(area)
                .caption(name.as_str(), ("sans-serif", 22))
                .margin(10)
                .x_label_area_size(30)
                .y_label_area_size(60)
                .build_cartesian_2d(xr, yr)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_labels(6)
                .y_labels(6)
                .label_style(("sans-serif", 15))
                .light_line_style(RGBColor(240, 240, 240))
                .bold_line_style(RGBColor(220, 220, 220))
                .x_label_formatter(&|v| format!("{v:.0}"))
                .y_label_formatter(&|v| format!("{v:.3}"))
                .draw()
                .map_err(|e| err(&e))?;
            let blue = hex(LINE_PALETTE[0]);
            let orange = hex(LINE_PALETTE[1]);
            chart
                .draw_series(LineSeries::new(points.iter().copied(), blue.stroke_width(2)).point_size(3))
                .map_err(|e| err(&e))?
                .label("results")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], blue.stroke_width(2)));
            chart
                .draw_series(DashedLineSeries::new(smooth.iter().copied(), 3, 4, orange.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label("smooth")
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], orange.stroke_width(2)));
            if k == 1 {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.8))
                    .border_style(RGBColor(200, 200, 200))
                    .label_font(("sans-serif", 15))
                    .draw()
                    .map_err(|e| err(&e))?;
            }
        }
        root.present().map_err(|e| err(&e))?;
    }
    save_rgb(&buf, w, h, out_png)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "epoch,time,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),\
metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2";

    fn csv(epochs: usize) -> String {
        let mut s = format!("{HEADER}\n");
        for e in 1..=epochs {
            let f = e as f64;
            s.push_str(&format!(
                "{e},{},{},{},{},{},{},{},{},{},{},{},0.01,0.01,0.01\n",
                10.0 * f,
                2.0 / f,
                3.0 / f,
                1.5 / f,
                0.1 * f,
                0.08 * f,
                0.07 * f,
                0.05 * f,
                2.1 / f,
                3.1 / f,
                1.6 / f
            ));
        }
        s
    }

    #[test]
    fn columns_are_found_by_name_whatever_the_order() {
        let text = "  b , epoch,a\n1, 0, 2.5\n\n3,1,nan\n";
        let t = ResultsTable::parse(text, Path::new("r.csv")).expect("parse");
        assert_eq!(t.column("epoch").expect("epoch"), vec![0.0, 1.0]);
        assert_eq!(t.column("b").expect("b"), vec![1.0, 3.0]);
        assert!(t.column("a").expect("a")[1].is_nan());
        let e = t.column("metrics/mAP50(B)").expect_err("missing");
        assert!(e.to_string().contains("r.csv") && e.to_string().contains("mAP50(B)"), "{e}");
    }

    #[test]
    fn malformed_lines_are_errors_naming_file_and_line() {
        let short = format!("{HEADER}\n1,2,3\n");
        let e = ResultsTable::parse(&short, Path::new("runs/x/results.csv")).expect_err("short row");
        assert!(matches!(e, PlotError::Csv { line: 2, .. }), "{e:?}");
        assert!(e.to_string().starts_with("runs/x/results.csv:2:"), "{e}");
        let mut bad = csv(3);
        bad = bad.replacen("0.01,0.01,0.01\n3,", "0.01,0.01,0.01\n3x,", 1);
        let e = ResultsTable::parse(&bad, Path::new("r.csv")).expect_err("not a number");
        assert!(matches!(e, PlotError::Csv { line: 4, .. }), "{e:?}");
        assert!(e.to_string().contains("'3x'") && e.to_string().contains("column 'epoch'"), "{e}");
        assert!(ResultsTable::parse("\n\n", Path::new("r.csv")).is_err());
    }

    #[test]
    fn gaussian_filter_matches_scipy() {
        // scipy 1.x: gaussian_filter1d([1, 2, 4, 8, 16], 1.0) and gaussian_filter1d([1, 5, 2], 3.0) (a kernel wider
        // than the series: 'reflect' mirrors repeatedly).
        let cases: [(&[f64], f64, &[f64]); 2] = [
            (
                &[1.0, 2.0, 4.0, 8.0, 16.0],
                1.0,
                &[1.5051988452812555, 2.5761144354343966, 5.010017453929052, 9.043372869256832, 12.865296396098467],
            ),
            (&[1.0, 5.0, 2.0], 3.0, &[2.6630595772285512, 2.666696338403487, 2.670244084367962]),
        ];
        for (y, sigma, want) in cases {
            let got = gaussian_filter1d(y, sigma);
            for (g, w) in got.iter().zip(want) {
                assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        }
        // A constant stays constant even when the kernel is wider than the series.
        assert!(gaussian_filter1d(&[0.5; 3], 3.0).iter().all(|v| (v - 0.5).abs() < 1e-12));
    }

    #[test]
    fn plot_results_writes_a_png_of_the_expected_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (csv_path, png) = (dir.path().join("results.csv"), dir.path().join("results.png"));
        for epochs in [1, 5] {
            std::fs::write(&csv_path, csv(epochs)).expect("write");
            plot_results(&csv_path, &png).expect("plot");
            let img = image::open(&png).expect("decode").to_rgb8();
            assert_eq!(img.dimensions(), RESULTS_SIZE);
            // Something besides the white background was drawn: the curves in their colours.
            let blue = LINE_PALETTE[0].to_be_bytes();
            assert!(img.pixels().any(|p| p.0 == [blue[1], blue[2], blue[3]]), "no results line ({epochs} epochs)");
        }
        std::fs::write(&csv_path, format!("{HEADER}\n")).expect("write");
        assert!(plot_results(&csv_path, &png).is_err());
        // A YOLO26 run's `l1_loss` columns, and MuSGD's eight learning rates, plot too.
        let l1 = csv(3).replace("dfl_loss", "l1_loss").replace("lr/pg2", "lr/pg2,lr/pg3,lr/pg4,lr/pg5,lr/pg6,lr/pg7");
        let l1 = l1.replace(",0.01,0.01,0.01\n", ",0.01,0.01,0.01,0.03,0.01,0.03,0.01,0.03\n");
        std::fs::write(&csv_path, l1).expect("write");
        plot_results(&csv_path, &png).expect("plot a one-bin head's results");
    }
}
