//! YOLO label files (`class cx cy w h` per row, normalised) parsed and validated with Ultralytics' rules
//! (`verify_image_label`): exactly 5 columns (or polygon rows of more than 6, turned into their bounding box),
//! numbers only, coordinates at most 1.01 and no value below -0.01, class below the class count; duplicate rows
//! removed (the survivors then come in `np.unique`'s sorted order, as in Ultralytics). Every error names the file
//! and line. [`to_pixel_labels`] turns rows into pixel `xyxy` boxes clipped to the image, dropping zero-area boxes.

use std::path::Path;

use sluice_core::{BoxXyxy, ClassId, Label};

use crate::error::{DatasetError, Result};
use crate::problem::{Problem, ProblemKind};

/// Ultralytics' tolerance: coordinates up to `1 + TOL` and values down to `-TOL` are accepted (then clipped).
pub const COORD_TOLERANCE: f32 = 0.01;

/// One validated label row: class and normalised centre/size, as float32 like Ultralytics reads them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct YoloRow {
    /// Class index.
    pub class: ClassId,
    /// Normalised centre x.
    pub cx: f32,
    /// Normalised centre y.
    pub cy: f32,
    /// Normalised width.
    pub w: f32,
    /// Normalised height.
    pub h: f32,
    /// 1-based line in the label file.
    pub line: usize,
}

/// A parsed label file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedLabels {
    /// The rows, deduplicated.
    pub rows: Vec<YoloRow>,
    /// How many duplicate rows were removed.
    pub duplicates: usize,
    /// Whether the file held polygon (segment) rows, converted to boxes.
    pub segments: bool,
}

/// The lines Ultralytics looks at: `text.strip().splitlines()` without the empty ones, with 1-based numbers.
fn label_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let lines: Vec<(usize, &str)> =
        text.split('\n').enumerate().map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l))).collect();
    let first = lines.iter().position(|(_, l)| !l.trim().is_empty());
    let last = lines.iter().rposition(|(_, l)| !l.trim().is_empty());
    let range = match (first, last) {
        (Some(a), Some(b)) => a..b + 1,
        _ => 0..0,
    };
    lines.into_iter().take(range.end).skip(range.start).filter(|(_, l)| !l.is_empty())
}

fn parse_value(tok: &str, col: usize, path: &Path, line: usize) -> Result<f32> {
    let v: f32 = tok.parse().map_err(|_| DatasetError::Label {
        path: path.to_path_buf(),
        line,
        reason: format!("column {col}: '{tok}' is not a number"),
    })?;
    if !v.is_finite() {
        return Err(DatasetError::Label {
            path: path.to_path_buf(),
            line,
            reason: format!("column {col}: '{tok}' is not a finite number"),
        });
    }
    Ok(v)
}

/// Parses and validates a YOLO label file's text for a dataset of `nc` classes. `path` only names the file in
/// errors. An error means Ultralytics would ignore the image and its labels ("ignoring corrupt image/label").
pub fn parse_yolo_labels(text: &str, path: &Path, nc: usize) -> Result<ParsedLabels> {
    let err = |line: usize, reason: String| DatasetError::Label { path: path.to_path_buf(), line, reason };
    let lines: Vec<(usize, &str)> = label_lines(text).collect();
    let segments = lines.iter().any(|(_, l)| l.split_whitespace().nth(6).is_some());
    let mut rows = Vec::with_capacity(lines.len());
    let mut vals: Vec<f32> = Vec::with_capacity(8);
    for &(line, l) in &lines {
        vals.clear();
        for (c, t) in l.split_whitespace().enumerate() {
            vals.push(parse_value(t, c + 1, path, line)?);
        }
        let (class, [cx, cy, w, h]) = if segments {
            // Polygon row: class x1 y1 x2 y2 ...; the box is the points' min/max (`segments2boxes`).
            let pts = &vals[1.min(vals.len())..];
            if vals.is_empty() || pts.is_empty() || !pts.len().is_multiple_of(2) {
                return Err(err(
                    line,
                    format!(
                        "polygon row needs a class and an even, non-zero number of coordinates, got {} values",
                        vals.len()
                    ),
                ));
            }
            let (mut x1, mut y1, mut x2, mut y2) = (f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY);
            for p in pts.chunks_exact(2) {
                x1 = x1.min(p[0]);
                x2 = x2.max(p[0]);
                y1 = y1.min(p[1]);
                y2 = y2.max(p[1]);
            }
            (vals[0], [(x1 + x2) / 2.0, (y1 + y2) / 2.0, x2 - x1, y2 - y1])
        } else {
            if vals.len() != 5 {
                return Err(err(line, format!("labels require 5 columns, {} columns detected", vals.len())));
            }
            (vals[0], [vals[1], vals[2], vals[3], vals[4]])
        };
        let coords = [cx, cy, w, h];
        if let Some(v) = coords.iter().find(|&&v| v > 1.0 + COORD_TOLERANCE) {
            return Err(err(line, format!("non-normalized or out of bounds coordinates [{v}]")));
        }
        if let Some(v) = std::iter::once(&class).chain(coords.iter()).find(|&&v| v < -COORD_TOLERANCE) {
            return Err(err(line, format!("negative class labels or coordinate [{v}]")));
        }
        if class >= nc as f32 {
            return Err(err(
                line,
                format!(
                    "Label class {} exceeds dataset class count {nc}. Possible class labels are 0-{}",
                    class as i64,
                    nc as i64 - 1
                ),
            ));
        }
        if class.fract() != 0.0 || class < 0.0 {
            return Err(err(line, format!("class {class} is not a non-negative integer")));
        }
        rows.push(YoloRow { class: class as ClassId, cx, cy, w, h, line });
    }
    let n = rows.len();
    if n < 2 {
        return Ok(ParsedLabels { rows, duplicates: 0, segments });
    }
    let mut sorted = rows.clone();
    // Compared by value as `np.unique` does: -0.0 equals 0.0 (total_cmp alone would order -0.0 first and let a
    // row in between keep the two copies apart).
    let zero = |v: f32| if v == 0.0 { 0.0 } else { v };
    let key = |r: &YoloRow| [r.class as f32, zero(r.cx), zero(r.cy), zero(r.w), zero(r.h)];
    sorted.sort_by(|a, b| {
        key(a).iter().zip(key(b).iter()).map(|(x, y)| x.total_cmp(y)).find(|o| o.is_ne()).unwrap_or(a.line.cmp(&b.line))
    });
    sorted.dedup_by(|b, a| key(a) == key(b));
    let duplicates = n - sorted.len();
    // Like Ultralytics, rows keep the file order unless duplicates were removed (then `np.unique`'s order).
    let rows = if duplicates > 0 { sorted } else { rows };
    Ok(ParsedLabels { rows, duplicates, segments })
}

/// Rows → pixel `xyxy` labels for a `width x height` image: boxes clipped to the image; zero-area boxes dropped.
/// Returns the labels and the problems (clipped overshoot, dropped boxes) naming `path` and the row's line.
pub fn to_pixel_labels(rows: &[YoloRow], width: u32, height: u32, path: &Path) -> (Vec<Label>, Vec<Problem>) {
    let (wf, hf) = (width as f32, height as f32);
    let mut out = Vec::with_capacity(rows.len());
    let mut problems = Vec::new();
    for r in rows {
        let raw = BoxXyxy::from_cxcywh(r.cx * wf, r.cy * hf, r.w * wf, r.h * hf);
        let bbox = raw.clip(wf, hf);
        if [r.cx, r.cy, r.w, r.h].iter().any(|v| !(0.0..=1.0).contains(v)) {
            problems.push(Problem::line(
                ProblemKind::Clipped,
                path,
                r.line,
                format!("coordinates [{} {} {} {}] slightly outside [0, 1] clipped", r.cx, r.cy, r.w, r.h),
            ));
        }
        if bbox.width() <= 0.0 || bbox.height() <= 0.0 {
            problems.push(Problem::line(
                ProblemKind::ZeroArea,
                path,
                r.line,
                format!("zero-area box (w {} h {}) dropped", r.w, r.h),
            ));
            continue;
        }
        out.push(Label { class: r.class, bbox });
    }
    (out, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("l.txt")
    }

    #[test]
    fn parses_rows_and_skips_blank_edges() {
        let t = "\n0 0.5 0.5 0.2 0.4\n\n3 0.1 0.2 0.05 0.1\r\n  \n";
        let r = parse_yolo_labels(t, p(), 4).unwrap();
        assert_eq!(r.rows.len(), 2);
        assert_eq!(r.rows[0], YoloRow { class: 0, cx: 0.5, cy: 0.5, w: 0.2, h: 0.4, line: 2 });
        assert_eq!(r.rows[1].line, 4);
        assert_eq!(r.duplicates, 0);
        assert!(parse_yolo_labels("", p(), 1).unwrap().rows.is_empty());
    }

    #[test]
    fn errors_name_file_and_line() {
        let e = parse_yolo_labels("0 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.2\n", p(), 1).unwrap_err();
        assert_eq!(e.to_string(), "l.txt:2: labels require 5 columns, 4 columns detected");
        let e = parse_yolo_labels("0 0.5 x 0.2 0.2", p(), 1).unwrap_err();
        assert_eq!(e.to_string(), "l.txt:1: column 3: 'x' is not a number");
        let e = parse_yolo_labels("0 0.5 nan 0.2 0.2", p(), 1).unwrap_err();
        assert!(e.to_string().contains("not a finite number"), "{e}");
        let e = parse_yolo_labels("5 0.5 0.5 0.2 0.2", p(), 5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "l.txt:1: Label class 5 exceeds dataset class count 5. Possible class labels are 0-4"
        );
        let e = parse_yolo_labels("0 0.5 0.5 1.02 0.2", p(), 1).unwrap_err();
        assert!(e.to_string().starts_with("l.txt:1: non-normalized or out of bounds coordinates"), "{e}");
        let e = parse_yolo_labels("0 -0.02 0.5 0.1 0.2", p(), 1).unwrap_err();
        assert!(e.to_string().contains("negative class labels or coordinate"), "{e}");
        let e = parse_yolo_labels("1.5 0.5 0.5 0.1 0.2", p(), 3).unwrap_err();
        assert!(e.to_string().contains("not a non-negative integer"), "{e}");
        // A whitespace-only line between rows is a row of 0 columns (Ultralytics rejects the file too).
        assert!(parse_yolo_labels("0 0.5 0.5 0.1 0.1\n   \n0 0.5 0.5 0.1 0.1", p(), 1).is_err());
    }

    #[test]
    fn small_overshoot_is_accepted_then_clipped() {
        let r = parse_yolo_labels("0 0.5 0.5 1.005 0.5", p(), 1).unwrap();
        let (labels, probs) = to_pixel_labels(&r.rows, 100, 50, p());
        assert_eq!(labels[0].bbox, BoxXyxy::new(0.0, 12.5, 100.0, 37.5));
        assert_eq!(probs.len(), 1);
        assert_eq!(probs[0].kind, ProblemKind::Clipped);
        assert_eq!(probs[0].line, Some(1));
    }

    #[test]
    fn zero_area_boxes_are_dropped_with_a_problem() {
        let r = parse_yolo_labels("0 0.5 0.5 0 0.5\n1 0.5 0.5 0.5 0.5", p(), 2).unwrap();
        let (labels, probs) = to_pixel_labels(&r.rows, 10, 10, p());
        assert_eq!(labels.len(), 1);
        assert_eq!(labels[0].class, 1);
        assert_eq!(probs[0].kind, ProblemKind::ZeroArea);
        assert_eq!(probs[0].line, Some(1));
    }

    #[test]
    fn duplicates_removed_in_numpy_unique_order() {
        let t = "2 0.5 0.5 0.1 0.1\n1 0.3 0.3 0.1 0.1\n2 0.5 0.5 0.1 0.1\n0 0.9 0.9 0.1 0.1";
        let r = parse_yolo_labels(t, p(), 3).unwrap();
        assert_eq!(r.duplicates, 1);
        let classes: Vec<u32> = r.rows.iter().map(|r| r.class).collect();
        assert_eq!(classes, vec![0, 1, 2]);
        assert_eq!(r.rows[2].line, 1);
    }

    #[test]
    fn negative_zero_rows_are_duplicates() {
        // Found while writing the `yolo_labels` fuzz target's duplicate check (fuzz/): -0 and 0 sorted apart with
        // a row between them, so the third row survived as a duplicate of the first; `np.unique` removes it.
        let t = "0 -0 0.5 0.1 0.1\n0 -0 0.6 0.1 0.1\n0 0 0.5 0.1 0.1";
        let r = parse_yolo_labels(t, p(), 1).unwrap();
        assert_eq!(r.duplicates, 1);
        let lines: Vec<usize> = r.rows.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![1, 2]);
    }

    #[test]
    fn polygon_rows_become_boxes() {
        let t = "1 0.1 0.2 0.5 0.2 0.5 0.6 0.1 0.6\n0 0.3 0.3 0.4 0.4";
        let r = parse_yolo_labels(t, p(), 2).unwrap();
        assert!(r.segments);
        let a = r.rows[0];
        assert!((a.cx - 0.3).abs() < 1e-6 && (a.cy - 0.4).abs() < 1e-6);
        assert!((a.w - 0.4).abs() < 1e-6 && (a.h - 0.4).abs() < 1e-6);
        // In polygon mode a 5-value row is two points, as in Ultralytics.
        let b = r.rows[1];
        assert!((b.cx - 0.35).abs() < 1e-6 && (b.w - 0.1).abs() < 1e-6);
        assert!(parse_yolo_labels("0 0.1 0.2 0.3 0.4 0.5 0.6 0.7", p(), 1).is_err());
    }
}
