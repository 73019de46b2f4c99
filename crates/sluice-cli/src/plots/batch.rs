//! Boxes on images: [`plot_batch`] (Ultralytics' `plot_images`: up to 16 images of a batch in a square grid,
//! column by column, at most 1920 px a side, each with its target boxes and class names or its detections above
//! 0.25 confidence with their scores) and [`annotate`] (one image with boxes and labels, for
//! `sluice predict --save`). Boxes are coloured by class with Ultralytics' palette; labels sit on a filled tag at
//! the box's top-left corner.

use std::path::Path;

use sluice_core::{Batch, BoxXyxy, Detection, ImageRgb8};

use super::raster::{Canvas, text_width};
use super::{PlotError, Result, class_color, class_name, save_rgb};

/// Longest side of a batch mosaic (Ultralytics' `max_size`).
pub(super) const MOSAIC_MAX_SIDE: u32 = 1920;
/// Most images in a batch mosaic (Ultralytics' `max_subplots`).
pub(super) const MOSAIC_MAX_IMAGES: usize = 16;
/// Only detections above this confidence are drawn on a batch mosaic (Ultralytics' `conf_thres`, compared with `>`).
pub(super) const MOSAIC_CONF: f32 = 0.25;

/// One box to draw: where, which class, and the score of a prediction (`None` for ground truth).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Annotation {
    /// The box in pixels of the image drawn on.
    pub bbox: BoxXyxy,
    /// Class index (colour and name).
    pub class: u32,
    /// Confidence of a detection, shown after the name.
    pub score: Option<f32>,
}

impl From<&Detection> for Annotation {
    fn from(d: &Detection) -> Self {
        Self { bbox: d.bbox, class: d.class, score: Some(d.score) }
    }
}

/// Black text on light tags, white on dark ones.
fn text_color([r, g, b]: [u8; 3]) -> [u8; 3] {
    let luma = 0.299 * f64::from(r) + 0.587 * f64::from(g) + 0.114 * f64::from(b);
    if luma > 170.0 { [0, 0, 0] } else { [255, 255, 255] }
}

/// Draws every box with its label tag onto `canvas`, lines `lw` wide, text `font_px` pixels per em.
fn draw_boxes(canvas: &mut Canvas<'_>, items: &[(Annotation, String)], lw: u32, font_px: u32) -> Result<()> {
    let (wf, hf) = (canvas.width as f32 - 1.0, canvas.height as f32 - 1.0);
    let px = font_px as f32;
    for (a, label) in items {
        let b = a.bbox;
        if !b.is_finite() {
            continue;
        }
        let color = class_color(a.class);
        let (x1, y1) = (b.x1.clamp(0.0, wf).round() as i64, b.y1.clamp(0.0, hf).round() as i64);
        let (x2, y2) = (b.x2.clamp(0.0, wf).round() as i64, b.y2.clamp(0.0, hf).round() as i64);
        canvas.stroke_rect(x1, y1, x2, y2, lw, color);
        if label.is_empty() {
            continue;
        }
        let tw = text_width(label, px)?.ceil() as i64;
        let th = (px * 1.2).ceil() as i64;
        // The tag sits on the box's top edge, or inside the box when there is no room above.
        let x0 = x1 - i64::from(lw / 2);
        let top = if y1 - th >= 0 { y1 - th } else { y1 };
        canvas.fill_rect(x0, top, x0 + tw + 4, top + th, color);
        canvas.text(x0 as f32 + 2.0, top as f32 + 0.1 * px, px, label, text_color(color))?;
    }
    Ok(())
}

/// The label of a box: the class name, with the score to `decimals` places for a detection.
fn label_of(a: &Annotation, names: &[String], decimals: usize) -> String {
    let name = class_name(names, a.class);
    match a.score {
        Some(s) => format!("{name} {s:.decimals$}"),
        None => name,
    }
}

/// Draws `boxes` with class names (and scores) onto `image`, in place. Line width and text size follow the
/// image size as in Ultralytics' `Annotator` (`lw = max(round((h + w) / 2 * 0.003), 2)`).
pub(crate) fn annotate(image: &mut ImageRgb8, boxes: &[Annotation], names: &[String]) -> Result<()> {
    let (w, h) = (image.width(), image.height());
    if w == 0 || h == 0 {
        return Err(PlotError::Invalid { what: "annotate", reason: format!("empty {w}x{h} image") });
    }
    let lw = (((w + h) as f64 / 2.0 * 0.003).round() as u32).max(2);
    let font_px = (7 * lw).max(12);
    let items: Vec<(Annotation, String)> = boxes.iter().map(|a| (*a, label_of(a, names, 2))).collect();
    let row = 3 * w as usize;
    let mut packed: Vec<u8> = (0..h).flat_map(|y| image.row(y).iter().copied()).collect();
    let mut canvas = Canvas { rgb: &mut packed, width: w as usize, height: h as usize };
    draw_boxes(&mut canvas, &items, lw, font_px)?;
    for (y, src) in packed.chunks_exact(row).enumerate() {
        image.row_mut(y as u32).copy_from_slice(src);
    }
    Ok(())
}

/// Draws a batch as a mosaic (Ultralytics' `train_batch0.jpg` / `val_batch0_labels.jpg` with `detections:
/// None`, `val_batch0_pred.jpg` with the detections of each filled slot) and writes it to `out` (`.jpg` or
/// `.png`). Each tile is marked with its sample id.
pub(crate) fn plot_batch(
    batch: &Batch,
    names: &[String],
    detections: Option<&[Vec<Detection>]>,
    out: &Path,
) -> Result<()> {
    let shape = batch.shape();
    let n = batch.len().min(MOSAIC_MAX_IMAGES);
    if n == 0 || shape.channels != 3 || shape.width == 0 || shape.height == 0 {
        return Err(PlotError::Invalid {
            what: "batch plot",
            reason: format!(
                "{} filled slots of {}x{}x{} (need RGB images)",
                batch.len(),
                shape.channels,
                shape.height,
                shape.width
            ),
        });
    }
    if let Some(d) = detections
        && d.len() != batch.len()
    {
        return Err(PlotError::Invalid {
            what: "batch plot",
            reason: format!("{} detection lists for {} images", d.len(), batch.len()),
        });
    }
    let ns = (n as f64).sqrt().ceil() as usize;
    let (h0, w0) = (shape.height, shape.width);
    let scale = f64::from(MOSAIC_MAX_SIDE) / ns as f64 / h0.max(w0) as f64;
    let (scale, th, tw) = if scale < 1.0 {
        (scale, (scale * h0 as f64).ceil() as usize, (scale * w0 as f64).ceil() as usize)
    } else {
        (1.0, h0, w0)
    };
    let (mw, mh) = (ns * tw, ns * th);
    let mut mosaic = vec![255u8; 3 * mw * mh];
    let plane = h0 * w0;
    // Nearest-neighbour source index of each output column / row.
    let src_x: Vec<usize> = (0..tw).map(|x| (((x as f64 + 0.5) / scale) as usize).min(w0 - 1)).collect();
    let src_y: Vec<usize> = (0..th).map(|y| (((y as f64 + 0.5) / scale) as usize).min(h0 - 1)).collect();
    let origin = |i: usize| (tw * (i / ns), th * (i % ns));
    for i in 0..n {
        let chw = batch.slot(i);
        let (ox, oy) = origin(i);
        for (y, &sy) in src_y.iter().enumerate() {
            let dst = &mut mosaic[3 * ((oy + y) * mw + ox)..3 * ((oy + y) * mw + ox + tw)];
            for (px, &sx) in dst.chunks_exact_mut(3).zip(&src_x) {
                let s = sy * w0 + sx;
                px.copy_from_slice(&[chw[s], chw[plane + s], chw[2 * plane + s]]);
            }
        }
    }
    let s = scale as f32;
    let mut items = Vec::new();
    for i in 0..n {
        let (ox, oy) = origin(i);
        let place = |a: Annotation| Annotation { bbox: a.bbox.scale_shift(s, s, ox as f32, oy as f32), ..a };
        match detections {
            Some(d) => items.extend(
                d[i].iter()
                    .filter(|d| d.score > MOSAIC_CONF)
                    .map(|d| place(Annotation::from(d)))
                    .map(|a| (a, label_of(&a, names, 1))),
            ),
            None => items.extend(
                batch
                    .targets_of(i as u32)
                    .iter()
                    .map(|t| place(Annotation { bbox: t.bbox, class: t.class, score: None }))
                    .map(|a| (a, label_of(&a, names, 1))),
            ),
        }
    }
    let font_px = ((((th + tw) * ns) as f64 * 0.01) as u32).max(10);
    let lw = ((f64::from(font_px) / 10.0).round() as u32).max(1);
    let mut canvas = Canvas { rgb: &mut mosaic, width: mw, height: mh };
    draw_boxes(&mut canvas, &items, lw, font_px)?;
    for i in 0..n {
        let (ox, oy) = origin(i);
        let (x, y) = (ox as i64, oy as i64);
        canvas.stroke_rect(x, y, x + tw as i64, y + th as i64, 2, [255, 255, 255]);
        if let Some(id) = batch.sample_ids.get(i) {
            canvas.text(x as f32 + 5.0, y as f32 + 5.0, font_px as f32, &format!("#{id}"), [220, 220, 220])?;
        }
    }
    save_rgb(&mosaic, mw as u32, mh as u32, out)
}

#[cfg(test)]
mod tests {
    use sluice_core::{BatchShape, Target};

    use super::*;

    /// A batch of `n` mid-grey 64x48 images, image `i` with one box of class `i`.
    fn grey_batch(n: usize) -> Batch {
        let mut b = Batch::new(BatchShape::rgb(n, 48, 64), n);
        for i in 0..n {
            let (slot, px) = b.push_slot(100 + i as u64).expect("slot");
            px.fill(128);
            b.targets.push(Target { image: slot, class: i as u32, bbox: BoxXyxy::new(20.0, 24.0, 50.0, 44.0) });
        }
        b
    }

    fn names() -> Vec<String> {
        ["circle", "square", "triangle"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn batch_mosaic_has_the_grid_size_and_draws_the_boxes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = grey_batch(3);
        let png = dir.path().join("train_batch0.png");
        plot_batch(&batch, &names(), None, &png).expect("plot");
        let img = image::open(&png).expect("decode").to_rgb8();
        // 3 images -> a 2 x 2 grid of 64x48 tiles, filled column by column; the fourth tile stays white.
        assert_eq!(img.dimensions(), (128, 96));
        assert_eq!(img.get_pixel(100, 70).0, [255, 255, 255]);
        // Inside image 0 away from its box the pixels are the input's; on the box's bottom and right edges
        // they carry the class colour, not the input grey.
        assert_eq!(img.get_pixel(8, 40).0, [128, 128, 128]);
        for (x, y) in [(35, 44), (50, 34)] {
            assert_eq!(img.get_pixel(x, y).0, class_color(0), "edge pixel ({x}, {y})");
        }
        // Image 1 is below image 0 (column-major), its box in class 1's colour.
        assert_eq!(img.get_pixel(35, 48 + 44).0, class_color(1));
        // The JPEG variant decodes to the same size.
        let jpg = dir.path().join("train_batch0.jpg");
        plot_batch(&batch, &names(), None, &jpg).expect("plot jpg");
        assert_eq!(image::open(&jpg).expect("decode").to_rgb8().dimensions(), (128, 96));
    }

    #[test]
    fn batch_with_detections_draws_only_confident_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let batch = grey_batch(1);
        let png = dir.path().join("val_batch0_pred.png");
        let det = |score| Detection { bbox: BoxXyxy::new(10.0, 20.0, 40.0, 40.0), score, class: 2 };
        for score in [0.1, MOSAIC_CONF] {
            plot_batch(&batch, &names(), Some(&[vec![det(score)]]), &png).expect("plot");
            let img = image::open(&png).expect("decode").to_rgb8();
            assert_eq!(img.dimensions(), (64, 48));
            assert_eq!(img.get_pixel(25, 40).0, [128, 128, 128], "a {score} detection is not drawn");
        }
        plot_batch(&batch, &names(), Some(&[vec![det(0.9)]]), &png).expect("plot");
        let img = image::open(&png).expect("decode").to_rgb8();
        assert_eq!(img.get_pixel(25, 40).0, class_color(2));
        assert!(plot_batch(&batch, &names(), Some(&[]), &png).is_err(), "one list per image");
        assert!(plot_batch(&Batch::new(BatchShape::rgb(2, 8, 8), 0), &names(), None, &png).is_err());
    }

    #[test]
    fn big_batches_are_scaled_to_the_mosaic_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut b = Batch::new(BatchShape::rgb(17, 640, 512), 0);
        for i in 0..17 {
            b.push_slot(i).expect("slot").1.fill(90);
        }
        let jpg = dir.path().join("m.jpg");
        plot_batch(&b, &[], None, &jpg).expect("plot");
        // 16 images -> 4 x 4, scale 1920 / 4 / 640 = 0.75 -> 480 x 384 tiles.
        assert_eq!(image::open(&jpg).expect("decode").to_rgb8().dimensions(), (4 * 384, 4 * 480));
    }

    #[test]
    fn annotate_draws_boxes_and_labels_in_place() {
        let mut img = ImageRgb8::new(200, 100);
        img.as_bytes_mut().fill(30);
        let before = img.clone();
        let a = Annotation { bbox: BoxXyxy::new(50.0, 40.0, 150.0, 90.0), class: 5, score: Some(0.87) };
        annotate(&mut img, &[a], &names()).expect("annotate");
        assert_eq!(img.pixel(100, 90), class_color(5), "bottom edge");
        assert_eq!(img.pixel(100, 65), before.pixel(100, 65), "inside the box");
        // The label tag above the box changed pixels there (class 5 has no name: its number is shown).
        assert!((0..40).any(|y| (50..80).any(|x| img.pixel(x, y) != [30, 30, 30])));
        assert_eq!(img.pixel(5, 5), [30, 30, 30]);
    }
}
