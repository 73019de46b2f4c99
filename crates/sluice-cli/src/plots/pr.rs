//! `PR_curve.png`: Ultralytics' `plot_pr_curve`: precision over recall at IoU 0.5 for every class that has
//! detections (the envelope `ApReport::pr_curve` interpolated on the 1000-point recall grid), each labelled with
//! its AP50, and their mean as a thick blue line labelled with the mAP50. With more than 20 classes the class
//! curves are grey and unlabelled.

use std::path::Path;

use plotters::prelude::*;
use sluice_eval::ApReport;

use super::{LINE_PALETTE, PlotError, Result, class_name, draw_err, ensure_font, hex, save_rgb};

/// Size of `PR_curve.png` in pixels `(width, height)`.
pub(super) const PR_SIZE: (u32, u32) = (1350, 900);

/// The mean of the class curves, point by point (all zeros when no class has detections).
fn mean_curve(report: &ApReport, n: usize) -> Vec<f64> {
    let k = report.pr_curve.len();
    (0..n)
        .map(|i| if k == 0 { 0.0 } else { report.pr_curve.iter().map(|(_, y)| y[i]).sum::<f64>() / k as f64 })
        .collect()
}

/// Draws the precision–recall curves of `report` (class names from `names`, index = class id) to `out_png`.
pub(crate) fn plot_pr_curve(report: &ApReport, names: &[String], out_png: &Path) -> Result<()> {
    let px = &report.conf_grid;
    if let Some((c, y)) = report.pr_curve.iter().find(|(_, y)| y.len() != px.len()) {
        return Err(PlotError::Invalid {
            what: "PR curve",
            reason: format!("class {c} has {} points, the recall grid {}", y.len(), px.len()),
        });
    }
    ensure_font()?;
    let (w, h) = PR_SIZE;
    let mut buf = vec![255u8; 3 * w as usize * h as usize];
    let err = draw_err(out_png);
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption("Precision-Recall Curve", ("sans-serif", 28))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..1.0f64, 0.0..1.0f64)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("Recall")
            .y_desc("Precision")
            .axis_desc_style(("sans-serif", 22))
            .label_style(("sans-serif", 18))
            .light_line_style(RGBColor(240, 240, 240))
            .bold_line_style(RGBColor(220, 220, 220))
            .x_label_formatter(&|v| format!("{v:.1}"))
            .y_label_formatter(&|v| format!("{v:.1}"))
            .draw()
            .map_err(|e| err(&e))?;
        let labelled = !names.is_empty() && names.len() < 21;
        for (i, (c, y)) in report.pr_curve.iter().enumerate() {
            let color = if labelled { hex(LINE_PALETTE[i % LINE_PALETTE.len()]) } else { RGBColor(128, 128, 128) };
            let series = chart
                .draw_series(LineSeries::new(px.iter().copied().zip(y.iter().copied()), color.stroke_width(1)))
                .map_err(|e| err(&e))?;
            if labelled {
                let ap50 = report.classes.iter().find(|m| m.class == *c).map_or(0.0, |m| m.ap50());
                series
                    .label(format!("{} {ap50:.3}", class_name(names, *c)))
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], color.stroke_width(2)));
            }
        }
        let mean = mean_curve(report, px.len());
        let blue = RGBColor(0, 0, 255);
        chart
            .draw_series(LineSeries::new(px.iter().copied().zip(mean), blue.stroke_width(4)))
            .map_err(|e| err(&e))?
            .label(format!("all classes {:.3} mAP@0.5", report.map50))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], blue.stroke_width(4)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(200, 200, 200))
            .label_font(("sans-serif", 18))
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    save_rgb(&buf, w, h, out_png)
}

#[cfg(test)]
mod tests {
    use sluice_eval::ApAccumulator;

    use super::*;

    /// A report from real matching: class 0 found perfectly, class 1 with a false positive ranked first.
    fn report() -> ApReport {
        let mut acc = ApAccumulator::default();
        for img in 0..4i64 {
            let gts = [(0, [0.0, 0.0, 10.0, 10.0]), (1, [20.0, 20.0, 40.0, 40.0])];
            let dets = [
                (0, [0.0, 0.0, 10.0, 10.0], 0.9),
                (1, [60.0, 60.0, 70.0, 70.0], 0.8),
                (1, [20.0, 20.0, 40.0, 40.0], 0.3 + img as f64 * 0.1),
            ];
            acc.add_image(img, &gts, &dets).expect("add");
        }
        acc.finalize()
    }

    #[test]
    fn mean_curve_averages_the_classes() {
        let r = report();
        assert_eq!(r.pr_curve.len(), 2);
        let m = mean_curve(&r, r.conf_grid.len());
        for i in [0, 500, 999] {
            assert!((m[i] - (r.pr_curve[0].1[i] + r.pr_curve[1].1[i]) / 2.0).abs() < 1e-15);
        }
    }

    #[test]
    fn plot_pr_curve_writes_a_png_of_the_expected_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let png = dir.path().join("PR_curve.png");
        let names = vec!["circle".to_string(), "square".to_string()];
        plot_pr_curve(&report(), &names, &png).expect("plot");
        let img = image::open(&png).expect("decode").to_rgb8();
        assert_eq!(img.dimensions(), PR_SIZE);
        assert!(img.pixels().any(|p| p.0 == [0, 0, 255]), "no mean curve");
        // No detections at all: axes and an all-zero mean, no error.
        plot_pr_curve(&ApAccumulator::default().finalize(), &names, &png).expect("empty report");
        assert_eq!(image::open(&png).expect("decode").to_rgb8().dimensions(), PR_SIZE);
    }
}
