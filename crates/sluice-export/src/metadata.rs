//! The metadata properties Ultralytics writes into its ONNX exports (`ultralytics/engine/exporter.py`), with the
//! values in Python's literal syntax, because Ultralytics' `AutoBackend` reads `imgsz`, `names`, `args` and
//! `end2end` back with `ast.literal_eval` and `stride`, `batch`, `channels` with `int`.

use std::time::{SystemTime, UNIX_EPOCH};

/// What an export records about its model.
#[derive(Debug, Clone, PartialEq)]
pub struct Metadata {
    /// A sentence naming the model.
    pub description: String,
    /// Who made the file.
    pub author: String,
    /// ISO 8601 time of the export.
    pub date: String,
    /// The exporting software's version.
    pub version: String,
    /// The licence of the file.
    pub license: String,
    /// Where the documentation is.
    pub docs: String,
    /// The largest stride of the model.
    pub stride: usize,
    /// `detect`.
    pub task: String,
    /// The head's class name (`Detect`).
    pub head: String,
    /// Batch size of the export.
    pub batch: usize,
    /// `(height, width)` of the export.
    pub imgsz: (usize, usize),
    /// Class names by index.
    pub names: Vec<String>,
    /// The export's own arguments (Ultralytics' `args` for the ONNX format).
    pub args: ExportArgs,
    /// Input channels.
    pub channels: usize,
    /// Whether the model needs no NMS.
    pub end2end: bool,
}

/// The export arguments Ultralytics records for ONNX (its `fmt_keys`), in its `default.yaml` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportArgs {
    /// Batch size.
    pub batch: usize,
    /// Half precision (Ultralytics' `quantize=16`).
    pub half: bool,
    /// NMS inside the graph.
    pub nms: bool,
    /// Symbolic shapes.
    pub dynamic: bool,
    /// The opset.
    pub opset: i64,
}

impl Metadata {
    /// The properties in Ultralytics' order, each value as Python's `str()` of its Ultralytics counterpart.
    pub fn props(&self) -> Vec<(&'static str, String)> {
        let names: Vec<String> = self.names.iter().enumerate().map(|(i, n)| format!("{i}: {}", py_str(n))).collect();
        let a = &self.args;
        let args = format!(
            "{{'data': None, 'batch': {}, 'fraction': 1.0, 'quantize': {}, 'nms': {}, 'dynamic': {}, 'simplify': \
             False, 'opset': {}}}",
            a.batch,
            if a.half { "16" } else { "None" },
            py_bool(a.nms),
            py_bool(a.dynamic),
            a.opset
        );
        vec![
            ("description", self.description.clone()),
            ("author", self.author.clone()),
            ("date", self.date.clone()),
            ("version", self.version.clone()),
            ("license", self.license.clone()),
            ("docs", self.docs.clone()),
            ("stride", self.stride.to_string()),
            ("task", self.task.clone()),
            ("head", self.head.clone()),
            ("batch", self.batch.to_string()),
            ("imgsz", format!("[{}, {}]", self.imgsz.0, self.imgsz.1)),
            ("names", format!("{{{}}}", names.join(", "))),
            ("args", args),
            ("channels", self.channels.to_string()),
            ("end2end", py_bool(self.end2end).into()),
        ]
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Python's `repr()` of a string: single quotes unless the text holds a single quote and no double quote, with
/// backslashes, the chosen quote and control characters escaped.
pub fn py_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// The current UTC time as ISO 8601 with an offset (`2026-12-05T01:02:03+00:00`), the form of Python's
/// `datetime.isoformat()` that Ultralytics writes.
pub fn utc_now_iso() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    iso_from_unix(secs)
}

/// ISO 8601 UTC time of a Unix timestamp (the proleptic Gregorian calendar: days to civil date after
/// H. Hinnant's `civil_from_days`).
pub fn iso_from_unix(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}+00:00", rem / 3600, (rem % 3600) / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_follow_python_repr() {
        assert_eq!(py_str("person"), "'person'");
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_str("back\\slash\n"), "'back\\\\slash\\n'");
    }

    #[test]
    fn dates_are_iso_8601() {
        assert_eq!(iso_from_unix(0), "1970-01-01T00:00:00+00:00");
        // 2024-02-29 12:34:56 UTC: a leap day.
        assert_eq!(iso_from_unix(1_709_210_096), "2024-02-29T12:34:56+00:00");
        assert_eq!(iso_from_unix(951_782_400), "2000-02-29T00:00:00+00:00");
    }

    #[test]
    fn props_are_python_literals_in_ultralytics_order() {
        let m = Metadata {
            description: "d".into(),
            author: "a".into(),
            date: "t".into(),
            version: "v".into(),
            license: "l".into(),
            docs: "u".into(),
            stride: 32,
            task: "detect".into(),
            head: "Detect".into(),
            batch: 4,
            imgsz: (640, 480),
            names: vec!["cat".into(), "it's".into()],
            args: ExportArgs { batch: 4, half: true, nms: false, dynamic: true, opset: 17 },
            channels: 3,
            end2end: false,
        };
        let p = m.props();
        let keys: Vec<&str> = p.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "description",
                "author",
                "date",
                "version",
                "license",
                "docs",
                "stride",
                "task",
                "head",
                "batch",
                "imgsz",
                "names",
                "args",
                "channels",
                "end2end"
            ]
        );
        let get = |k: &str| p.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone()).unwrap_or_default();
        assert_eq!(get("names"), "{0: 'cat', 1: \"it's\"}");
        assert_eq!(get("imgsz"), "[640, 480]");
        assert_eq!(
            get("args"),
            "{'data': None, 'batch': 4, 'fraction': 1.0, 'quantize': 16, 'nms': False, 'dynamic': True, \
             'simplify': False, 'opset': 17}"
        );
        assert_eq!(get("end2end"), "False");
    }
}
