//! The plots a training run leaves behind, drawn with `plotters` on a bitmap and encoded with `image`, the way
//! Ultralytics draws them: [`plot_results`] (`results.png`, losses and metrics per epoch from `results.csv`),
//! [`plot_pr_curve`] (`PR_curve.png`, precision over recall per class at IoU 0.5 and the mean),
//! [`plot_batch`] (`train_batch0.jpg`, `val_batch0_labels.jpg`, `val_batch0_pred.jpg`: a mosaic of a batch with
//! its target boxes or its detections) and [`annotate`] (boxes and labels drawn onto one image, for
//! `sluice predict --save`).
//!
//! Text is rendered by `ab_glyph` from a DejaVu Sans subset embedded in the binary (`assets/fonts`), so plotting
//! needs no system fonts, no fontconfig and no FreeType: through plotters on the charts, directly (module
//! `raster`, which keeps glyph side bearings) for box labels. The output format follows the file extension: `.png`,
//! or `.jpg` / `.jpeg` (quality 90).

mod batch;
mod pr;
mod raster;
mod results;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::style::{FontStyle, RGBColor};

pub(crate) use batch::{Annotation, annotate, plot_batch};
pub(crate) use pr::plot_pr_curve;
pub(crate) use results::plot_results;

/// The embedded font (see `assets/fonts/README.md` for its origin and licence).
const FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans-Latin1.ttf");

/// What can go wrong while reading plot inputs or writing a plot.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlotError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of a CSV file is malformed.
    #[error("{}:{line}: {reason}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The inputs cannot be plotted.
    #[error("{what}: {reason}")]
    Invalid {
        /// What was checked.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// Drawing failed (a plotters error).
    #[error("drawing {}: {reason}", path.display())]
    Draw {
        /// The plot being drawn.
        path: PathBuf,
        /// The plotters error.
        reason: String,
    },
    /// The image could not be encoded or written.
    #[error("writing {}: {reason}", path.display())]
    Encode {
        /// The output file.
        path: PathBuf,
        /// The cause.
        reason: String,
    },
}

/// This module's result type.
pub(crate) type Result<T> = std::result::Result<T, PlotError>;

/// Registers the embedded font as plotters' `sans-serif` family (once per process).
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok());
    if ok {
        Ok(())
    } else {
        Err(PlotError::Invalid { what: "embedded font", reason: "DejaVuSans-Latin1.ttf does not parse".into() })
    }
}

/// A plotters error as a [`PlotError::Draw`] for the plot written to `path`.
fn draw_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> PlotError + '_ {
    move |e| PlotError::Draw { path: path.to_path_buf(), reason: e.to_string() }
}

/// Encodes a packed RGB8 buffer (`3 * width * height` bytes) as PNG or JPEG, by the extension of `path`.
pub(crate) fn save_rgb(rgb: &[u8], width: u32, height: u32, path: &Path) -> Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).unwrap_or_default();
    let bad = |reason: String| PlotError::Encode { path: path.to_path_buf(), reason };
    if rgb.len() != 3 * width as usize * height as usize {
        return Err(bad(format!("{} bytes for a {width}x{height} RGB image", rgb.len())));
    }
    let file = std::fs::File::create(path).map_err(|source| PlotError::Io { path: path.to_path_buf(), source })?;
    let mut out = std::io::BufWriter::new(file);
    let color = image::ExtendedColorType::Rgb8;
    let encoded = match ext.as_str() {
        "png" => {
            image::ImageEncoder::write_image(image::codecs::png::PngEncoder::new(&mut out), rgb, width, height, color)
        }
        "jpg" | "jpeg" => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90).encode(rgb, width, height, color)
        }
        other => return Err(bad(format!("unsupported extension '{other}' (png, jpg or jpeg)"))),
    };
    encoded.map_err(|e| bad(e.to_string()))?;
    std::io::Write::flush(&mut out).map_err(|source| PlotError::Io { path: path.to_path_buf(), source })
}

/// Ultralytics' `Colors` palette (boxes and labels are coloured by class index modulo 20).
const BOX_PALETTE: [u32; 20] = [
    0xFF3838, 0xFF9D97, 0xFF701F, 0xFFB21D, 0xCFD231, 0x48F90A, 0x92CC17, 0x3DDB86, 0x1A9334, 0x00D4BB, 0x2C99A8,
    0x00C2FF, 0x344593, 0x6473FF, 0x0018EC, 0x8438FF, 0x520085, 0xCB38FF, 0xFF95C8, 0xFF37C7,
];

/// Matplotlib's `tab10` cycle (the line colours of Ultralytics' curves).
const LINE_PALETTE: [u32; 10] =
    [0x1F77B4, 0xFF7F0E, 0x2CA02C, 0xD62728, 0x9467BD, 0x8C564B, 0xE377C2, 0x7F7F7F, 0xBCBD22, 0x17BECF];

fn hex(c: u32) -> RGBColor {
    RGBColor((c >> 16) as u8, (c >> 8) as u8, c as u8)
}

/// The box colour of class `class`.
pub(crate) fn class_color(class: u32) -> [u8; 3] {
    let RGBColor(r, g, b) = hex(BOX_PALETTE[class as usize % BOX_PALETTE.len()]);
    [r, g, b]
}

/// The name of class `class`, or its number when `names` has no entry for it.
fn class_name(names: &[String], class: u32) -> String {
    names.get(class as usize).cloned().unwrap_or_else(|| class.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_rgb_round_trips_png_and_rejects_bad_input() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rgb: Vec<u8> = (0..3 * 5 * 4).map(|i| (i * 7) as u8).collect();
        let png = dir.path().join("a.png");
        save_rgb(&rgb, 5, 4, &png).expect("png");
        let back = image::open(&png).expect("decode").to_rgb8();
        assert_eq!((back.width(), back.height()), (5, 4));
        assert_eq!(back.as_raw(), &rgb);
        let jpg = dir.path().join("a.JPG");
        save_rgb(&rgb, 5, 4, &jpg).expect("jpg");
        assert_eq!(image::open(&jpg).expect("decode").to_rgb8().dimensions(), (5, 4));
        assert!(matches!(save_rgb(&rgb, 5, 4, &dir.path().join("a.gif")), Err(PlotError::Encode { .. })));
        assert!(matches!(save_rgb(&rgb[1..], 5, 4, &png), Err(PlotError::Encode { .. })));
    }

    #[test]
    fn embedded_font_registers() {
        ensure_font().expect("font");
        ensure_font().expect("font again");
    }
}
