//! Drawing straight into a packed RGB8 buffer: filled and stroked axis-aligned rectangles, and text rendered with
//! `ab_glyph` from the embedded font (anti-aliased, with side bearings and kerning). Everything is clipped to the
//! buffer, so boxes partly outside the image are safe.

use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, PxScale, ScaleFont, point};

use super::{FONT, PlotError, Result};

/// A packed RGB8 image being drawn on.
#[derive(Debug)]
pub(super) struct Canvas<'a> {
    pub(super) rgb: &'a mut [u8],
    pub(super) width: usize,
    pub(super) height: usize,
}

fn font() -> Result<&'static FontRef<'static>> {
    static PARSED: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    PARSED.get_or_init(|| FontRef::try_from_slice(FONT).ok()).as_ref().ok_or_else(|| PlotError::Invalid {
        what: "embedded font",
        reason: "DejaVuSans-Latin1.ttf does not parse".into(),
    })
}

/// Width in pixels of `text` at `px` pixels per em (advances plus kerning).
pub(super) fn text_width(text: &str, px: f32) -> Result<f32> {
    let f = font()?.as_scaled(PxScale::from(px));
    let mut width = 0.0;
    let mut prev = None;
    for c in text.chars() {
        let id = f.glyph_id(c);
        if let Some(p) = prev {
            width += f.kern(p, id);
        }
        width += f.h_advance(id);
        prev = Some(id);
    }
    Ok(width)
}

impl Canvas<'_> {
    /// Fills `[x0, x1) x [y0, y1)` (clipped) with `color`.
    pub(super) fn fill_rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, color: [u8; 3]) {
        let (x0, x1) = (x0.clamp(0, self.width as i64) as usize, x1.clamp(0, self.width as i64) as usize);
        let (y0, y1) = (y0.clamp(0, self.height as i64) as usize, y1.clamp(0, self.height as i64) as usize);
        if x0 >= x1 {
            return;
        }
        for y in y0..y1 {
            let row = &mut self.rgb[3 * (y * self.width + x0)..3 * (y * self.width + x1)];
            for px in row.chunks_exact_mut(3) {
                px.copy_from_slice(&color);
            }
        }
    }

    /// The outline of the box with corners `(x1, y1)`, `(x2, y2)` (inclusive pixel coordinates), each edge `lw`
    /// pixels wide and centred on the box's edge line, as OpenCV's `rectangle` draws it.
    pub(super) fn stroke_rect(&mut self, x1: i64, y1: i64, x2: i64, y2: i64, lw: u32, color: [u8; 3]) {
        let lw = i64::from(lw.max(1));
        let lo = lw / 2;
        let hi = lw - lo;
        self.fill_rect(x1 - lo, y1 - lo, x2 + hi, y1 + hi, color);
        self.fill_rect(x1 - lo, y2 - lo, x2 + hi, y2 + hi, color);
        self.fill_rect(x1 - lo, y1 - lo, x1 + hi, y2 + hi, color);
        self.fill_rect(x2 - lo, y1 - lo, x2 + hi, y2 + hi, color);
    }

    /// Draws `text` at `px` pixels per em with its top (the font's ascent) at `y` and its pen start at `x`,
    /// blending the glyph coverage over the pixels below.
    pub(super) fn text(&mut self, x: f32, y: f32, px: f32, text: &str, color: [u8; 3]) -> Result<()> {
        let f = font()?.as_scaled(PxScale::from(px));
        let baseline = y + f.ascent();
        let mut caret = x;
        let mut prev = None;
        for c in text.chars() {
            let id = f.glyph_id(c);
            if let Some(p) = prev {
                caret += f.kern(p, id);
            }
            let glyph = id.with_scale_and_position(PxScale::from(px), point(caret, baseline));
            caret += f.h_advance(id);
            prev = Some(id);
            let Some(outline) = f.outline_glyph(glyph) else { continue };
            let b = outline.px_bounds();
            let (ox, oy) = (b.min.x as i64, b.min.y as i64);
            outline.draw(|gx, gy, cov| {
                let (xx, yy) = (ox + i64::from(gx), oy + i64::from(gy));
                if xx < 0 || yy < 0 || xx >= self.width as i64 || yy >= self.height as i64 {
                    return;
                }
                let i = 3 * (yy as usize * self.width + xx as usize);
                let a = cov.clamp(0.0, 1.0);
                for (dst, &src) in self.rgb[i..i + 3].iter_mut().zip(&color) {
                    *dst = (f32::from(*dst) * (1.0 - a) + f32::from(src) * a).round() as u8;
                }
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rectangles_are_clipped_and_centred_on_the_edge() {
        let mut rgb = vec![0u8; 3 * 10 * 8];
        let mut c = Canvas { rgb: &mut rgb, width: 10, height: 8 };
        c.stroke_rect(2, 1, 7, 5, 2, [9, 9, 9]);
        c.fill_rect(-5, 7, 100, 100, [1, 2, 3]);
        let at = |x: usize, y: usize| [rgb[3 * (y * 10 + x)], rgb[3 * (y * 10 + x) + 1], rgb[3 * (y * 10 + x) + 2]];
        // lw 2 covers the edge line and the pixel before it: rows 0-1 and 4-5, columns 1-2 and 6-7.
        for (x, y) in [(1, 0), (2, 1), (7, 5), (6, 4), (4, 0), (1, 3)] {
            assert_eq!(at(x, y), [9, 9, 9], "({x}, {y})");
        }
        for (x, y) in [(4, 3), (0, 3), (8, 3), (4, 6)] {
            assert_eq!(at(x, y), [0, 0, 0], "({x}, {y})");
        }
        assert_eq!(at(0, 7), [1, 2, 3]);
        assert_eq!(at(9, 7), [1, 2, 3]);
    }

    #[test]
    fn text_has_the_measured_width_and_keeps_letters_apart() {
        let (w, h) = (120usize, 30usize);
        let mut rgb = vec![0u8; 3 * w * h];
        let mut c = Canvas { rgb: &mut rgb, width: w, height: h };
        c.text(2.0, 2.0, 20.0, "circle", [255, 255, 255]).expect("text");
        let inked: Vec<usize> = (0..w).filter(|&x| (0..h).any(|y| rgb[3 * (y * w + x)] > 64)).collect();
        let width = text_width("circle", 20.0).expect("width");
        let (first, last) = (inked[0], inked[inked.len() - 1]);
        assert!(first >= 2 && (last as f32) <= 2.0 + width, "ink {first}..{last}, advance {width}");
        // Six letters: with their side bearings kept, the columns without ink split the run into several pieces
        // (c | i | r | c | l | e touch at most pairwise at this size).
        let gaps = inked.windows(2).filter(|p| p[1] > p[0] + 1).count();
        assert!(gaps >= 3, "{gaps} gaps in {inked:?}");
        assert!(text_width("", 20.0).expect("empty") == 0.0);
    }
}
