//! A composed canvas before the perspective transform, described instead of drawn: where each source image
//! (tile) lies on it and how a canvas position maps back into that image's pixels. Ultralytics builds this canvas
//! in memory (a `2 imgsz` square for a mosaic, an `imgsz` letterbox otherwise); the fused sampler only looks
//! positions up in it.

use std::ops::Range;

use sluice_core::{BoxXyxy, Label, SampleId, SourceImage};

use crate::error::{AugmentError, Result};
use crate::letterbox::{FILL, Letterbox, LetterboxOpts, load_size};
use crate::recipe::Layout;
use crate::resample::{RUN, RUN_MAX_WIDTH, RunScratch, Sampler};

/// One source image on the canvas.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tile<'a> {
    id: SampleId,
    sampler: Sampler<'a>,
    /// Visible region in continuous canvas coordinates, `[x_min, x_max) x [y_min, y_max)` (pixel centres are at
    /// integers, so pixel columns `x0..x1` cover `[x0 - 0.5, x1 - 0.5)`).
    x_min: f32,
    x_max: f32,
    y_min: f32,
    y_max: f32,
    /// Canvas → source: `sx = cx * kx + ox` (OpenCV's half-pixel resize mapping composed with the placement).
    kx: f32,
    ox: f32,
    ky: f32,
    oy: f32,
    /// Source positions are clamped to the visible part of the resized tile (edge pixels replicate).
    sx_lo: f32,
    sx_hi: f32,
    sy_lo: f32,
    sy_hi: f32,
    /// The tile's labels and their source → canvas mapping `x * bx + dx`.
    labels: &'a [Label],
    bx: f32,
    dx: f32,
    by: f32,
    dy: f32,
}

impl Tile<'_> {
    /// Canvas x → clamped source x.
    #[inline(always)]
    fn sx(&self, cx: f32) -> f32 {
        (cx * self.kx + self.ox).max(self.sx_lo).min(self.sx_hi)
    }

    /// [`Self::sx`] as compare-and-select, which vectorises to one `maxps` and one `minps` (`f32::max` adds NaN
    /// handling): the same value for a position that is not NaN (row positions never are), up to the sign of a
    /// zero, which the source column and weight do not see.
    #[inline(always)]
    fn sx_select(&self, cx: f32) -> f32 {
        let v = cx * self.kx + self.ox;
        let v = if v < self.sx_lo { self.sx_lo } else { v };
        if v > self.sx_hi { self.sx_hi } else { v }
    }

    /// Canvas y → clamped source y.
    #[inline(always)]
    fn sy(&self, cy: f32) -> f32 {
        (cy * self.ky + self.oy).max(self.sy_lo).min(self.sy_hi)
    }
}

/// Most spans [`Canvas::spans`] returns for one row: the six comparisons of two splits and four tiles' edges
/// change at most 18 times along a row.
pub(crate) const MAX_SPANS: usize = 19;

/// An affine output → canvas map restricted to one output row `y`: pixel `x` lands at `(ax x + bx + cx,
/// ay x + by + cy)` with `bx = m01 y`, `by = m11 y`, the per-pixel map's operations in its order (so the same
/// values, bit for bit).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowMap {
    pub(crate) ax: f32,
    pub(crate) bx: f32,
    pub(crate) cx: f32,
    pub(crate) ay: f32,
    pub(crate) by: f32,
    pub(crate) cy: f32,
}

impl RowMap {
    /// The row `y` of the affine map `m` (output pixel → canvas position).
    pub(crate) fn new(m: &[[f32; 3]; 3], y: f32) -> Self {
        Self { ax: m[0][0], bx: m[0][1] * y, cx: m[0][2], ay: m[1][0], by: m[1][1] * y, cy: m[1][2] }
    }

    /// Canvas x of output pixel `x`, as [`Self::at`] gives it (a signed `x` converts exactly as a `usize` does for
    /// `x < 2^31`, in one instruction, also in vector form).
    #[inline(always)]
    pub(crate) fn x_at(&self, x: i32) -> f32 {
        self.ax * x as f32 + self.bx + self.cx
    }

    /// Canvas position of output pixel `x`.
    #[inline(always)]
    pub(crate) fn at(&self, x: usize) -> (f32, f32) {
        let xf = x as f32;
        (self.ax * xf + self.bx + self.cx, self.ay * xf + self.by + self.cy)
    }
}

/// The first `x` in `1..n` where the monotonic predicate `p` differs from `p(0)`, given that `p(n - 1)` does;
/// `guess` is an estimate of it (any value: a bad one only costs evaluations).
fn first_change(p: &dyn Fn(usize) -> bool, n: usize, guess: f32) -> usize {
    let p0 = p(0);
    // Saturating conversion (NaN gives 0), then into 1..n.
    let g = (guess as i64).clamp(1, n as i64 - 1) as usize;
    // Bracket lo < hi with p(lo) == p0 and p(hi) != p0, galloping out from the guess.
    let (mut lo, mut hi);
    if p(g) != p0 {
        hi = g;
        let mut step = 1;
        loop {
            let c = hi.saturating_sub(step);
            if c == 0 || p(c) == p0 {
                lo = c;
                break;
            }
            hi = c;
            step *= 2;
        }
    } else {
        lo = g;
        let mut step = 1;
        loop {
            let c = (lo + step).min(n - 1);
            if p(c) != p0 {
                hi = c;
                break;
            }
            lo = c;
            step *= 2;
        }
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if p(mid) == p0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// The canvas of one [`Layout`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Canvas<'a> {
    /// Canvas size in pixels.
    pub(crate) width: u32,
    pub(crate) height: u32,
    /// Quadrant split: tile index = `(cx >= split_x) + 2 (cy >= split_y)`.
    split_x: f32,
    split_y: f32,
    tiles: [Option<Tile<'a>>; 4],
    /// Mosaic labels are clipped to the canvas and zero-area boxes dropped (Ultralytics' `_cat_labels`).
    clip_labels: bool,
}

/// Places a `tw x th` resized copy of `img` with its pixel `(0, 0)` at canvas `(padw, padh)`, visible over canvas
/// pixels `x0..x1, y0..y1`.
#[allow(clippy::too_many_arguments)]
fn tile<'a>(
    id: SampleId,
    img: &'a SourceImage,
    tw: u32,
    th: u32,
    padw: i64,
    padh: i64,
    (x0, y0, x1, y1): (i64, i64, i64, i64),
    box_scale: (f64, f64),
) -> Result<Option<Tile<'a>>> {
    let (w0, h0) = (img.image.width(), img.image.height());
    let sampler = Sampler::new(&img.image).ok_or(AugmentError::EmptyImage { id, width: w0, height: h0 })?;
    if x1 <= x0 || y1 <= y0 || tw == 0 || th == 0 {
        return Ok(None);
    }
    let kx = f64::from(w0) / f64::from(tw);
    let ky = f64::from(h0) / f64::from(th);
    // Source coordinate of tile pixel t: (t + 0.5) k - 0.5, tile pixel = canvas pixel - pad.
    let src = |t: f64, k: f64| (t + 0.5) * k - 0.5;
    let bounds = |lo: f64, hi: f64, max: f32| {
        let lo = (lo as f32).max(0.0).min(max);
        (lo, (hi as f32).min(max).max(lo))
    };
    let (sx_lo, sx_hi) = bounds(src((x0 - padw) as f64, kx), src((x1 - 1 - padw) as f64, kx), sampler.max_x());
    let (sy_lo, sy_hi) = bounds(src((y0 - padh) as f64, ky), src((y1 - 1 - padh) as f64, ky), sampler.max_y());
    Ok(Some(Tile {
        id,
        sampler,
        x_min: x0 as f32 - 0.5,
        x_max: x1 as f32 - 0.5,
        y_min: y0 as f32 - 0.5,
        y_max: y1 as f32 - 0.5,
        kx: kx as f32,
        ox: ((0.5 - padw as f64) * kx - 0.5) as f32,
        ky: ky as f32,
        oy: ((0.5 - padh as f64) * ky - 0.5) as f32,
        sx_lo,
        sx_hi,
        sy_lo,
        sy_hi,
        labels: &img.labels.objects,
        bx: box_scale.0 as f32,
        dx: padw as f32,
        by: box_scale.1 as f32,
        dy: padh as f32,
    }))
}

impl<'a> Canvas<'a> {
    /// The canvas of `layout` at output size `imgsz`; `images` are the layout's source images in tile order.
    pub(crate) fn new(layout: &Layout, imgsz: u32, images: &[&'a SourceImage]) -> Result<Self> {
        let ids = layout.ids();
        let image = |i: usize| {
            images.get(i).copied().ok_or_else(|| AugmentError::Config {
                what: "recipe images",
                reason: format!("sample {}: layout needs {} images, got {}", ids[0], ids.len(), images.len()),
            })
        };
        match *layout {
            Layout::Single { id } => {
                let img = image(0)?;
                let (w0, h0) = (img.image.width(), img.image.height());
                // load_image (long side -> imgsz), then LetterBox(imgsz x imgsz) of that.
                let (w1, h1) = load_size(w0, h0, imgsz);
                let lb = Letterbox::new(w1, h1, imgsz, imgsz, LetterboxOpts::default());
                let (uw, uh) = lb.new_unpad;
                let (left, top) = (i64::from(lb.pad[0]), i64::from(lb.pad[1]));
                let rect = (left, top, left + i64::from(uw), top + i64::from(uh));
                // Labels: normalised by the source, denormalised by the loaded size, times the letterbox ratio.
                let bs = (
                    f64::from(w1) * lb.ratio.0 / f64::from(w0.max(1)),
                    f64::from(h1) * lb.ratio.1 / f64::from(h0.max(1)),
                );
                let t = tile(id, img, uw, uh, left, top, rect, bs)?;
                Ok(Self {
                    width: lb.canvas.0,
                    height: lb.canvas.1,
                    split_x: f32::INFINITY,
                    split_y: f32::INFINITY,
                    tiles: [t, None, None, None],
                    clip_labels: false,
                })
            }
            Layout::Mosaic4 { ids, centre: (xc, yc) } => {
                let s2 = 2 * i64::from(imgsz);
                let (xc, yc) = (i64::from(xc), i64::from(yc));
                let mut tiles = [None; 4];
                for (i, slot) in tiles.iter_mut().enumerate() {
                    let img = image(i)?;
                    let (w0, h0) = (img.image.width(), img.image.height());
                    let (tw, th) = load_size(w0, h0, imgsz);
                    let (w, h) = (i64::from(tw), i64::from(th));
                    // Ultralytics' _mosaic4 placement: canvas rect (a) and the crop of the tile (b).
                    let (x1a, y1a, x2a, y2a, x1b, y1b) = match i {
                        0 => {
                            let (x1a, y1a) = ((xc - w).max(0), (yc - h).max(0));
                            (x1a, y1a, xc, yc, w - (xc - x1a), h - (yc - y1a))
                        }
                        1 => {
                            let (y1a, x2a) = ((yc - h).max(0), (xc + w).min(s2));
                            (xc, y1a, x2a, yc, 0, h - (yc - y1a))
                        }
                        2 => {
                            let (x1a, y2a) = ((xc - w).max(0), (yc + h).min(s2));
                            (x1a, yc, xc, y2a, w - (xc - x1a), 0)
                        }
                        _ => (xc, yc, (xc + w).min(s2), (yc + h).min(s2), 0, 0),
                    };
                    let bs = (f64::from(tw) / f64::from(w0.max(1)), f64::from(th) / f64::from(h0.max(1)));
                    *slot = tile(ids[i], img, tw, th, x1a - x1b, y1a - y1b, (x1a, y1a, x2a, y2a), bs)?;
                }
                Ok(Self {
                    width: s2 as u32,
                    height: s2 as u32,
                    split_x: xc as f32 - 0.5,
                    split_y: yc as f32 - 0.5,
                    tiles,
                    clip_labels: true,
                })
            }
        }
    }

    /// Reports `(id, rows)` for each tile: the source rows [`Self::gather`] reads for output pixels `0..n` x
    /// `0..n` mapped onto the canvas by `m` (output pixel -> canvas position; `affine` when its last row is
    /// `(0, 0, 1)`). For an affine map the output square's preimage is the parallelogram of its four corners, so
    /// the rows under its bounding box (widened by a canvas pixel against rounding), each with the row below for
    /// the bilinear tap, hold every row read; a tile outside that box reads nothing. For a perspective map every
    /// row of the tile's visible part is reported.
    pub(crate) fn source_rows(&self, m: &[[f32; 3]; 3], affine: bool, n: u32, f: &mut dyn FnMut(SampleId, Range<u32>)) {
        let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) =
            (f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY);
        if affine && n > 0 {
            let at = |r: usize, x: f64, y: f64| f64::from(m[r][0]) * x + f64::from(m[r][1]) * y + f64::from(m[r][2]);
            let last = f64::from(n - 1);
            let corners = [(0.0, 0.0), (last, 0.0), (0.0, last), (last, last)];
            let span = |r: usize| {
                corners
                    .iter()
                    .map(|&(x, y)| at(r, x, y))
                    .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
            };
            ((x_lo, x_hi), (y_lo, y_hi)) = (span(0), span(1));
            (x_lo, x_hi, y_lo, y_hi) = (x_lo - 1.0, x_hi + 1.0, y_lo - 1.0, y_hi + 1.0);
        }
        for t in self.tiles.iter().flatten() {
            let (tx_lo, tx_hi) = (x_lo.max(f64::from(t.x_min)), x_hi.min(f64::from(t.x_max)));
            let (ty_lo, ty_hi) = (y_lo.max(f64::from(t.y_min)), y_hi.min(f64::from(t.y_max)));
            // `f64::max`/`min` pass over a NaN bound (a degenerate map): the tile's whole visible part is reported.
            if tx_lo >= tx_hi || ty_lo >= ty_hi {
                continue;
            }
            // `sy` clamps into the tile's visible source rows, and is increasing in `cy`.
            let (a, b) = (t.sy(ty_lo as f32), t.sy(ty_hi as f32));
            let height = t.sampler.max_y() as u32 + 1;
            let first = (a.floor() as u32).min(height);
            let end = (b.floor() as u32).saturating_add(2).min(height);
            if first < end {
                f(t.id, first..end);
            }
        }
    }

    /// The tile that owns continuous canvas position `(cx, cy)` (its index and itself), `None` for the grey.
    #[inline(always)]
    fn owner(&self, cx: f32, cy: f32) -> Option<(usize, &Tile<'a>)> {
        let q = usize::from(cx >= self.split_x) + 2 * usize::from(cy >= self.split_y);
        let t = self.tiles[q].as_ref()?;
        (cx >= t.x_min && cx < t.x_max && cy >= t.y_min && cy < t.y_max).then_some((q, t))
    }

    /// The colour at continuous canvas position `(cx, cy)`: bilinear from the tile that owns it, grey outside.
    #[inline(always)]
    pub(crate) fn gather(&self, cx: f32, cy: f32) -> [u8; 3] {
        match self.owner(cx, cy) {
            Some((_, t)) => t.sampler.sample_clamped(t.sx(cx), t.sy(cy)),
            None => [FILL; 3],
        }
    }

    /// Splits output row `0..n`, mapped onto the canvas by `map`, into spans `(start, end, owner)` of pixels that
    /// [`Self::gather`] resolves to the same tile (`owner`, the index [`Self::render_span`] takes) or to the grey
    /// (`None`); returns how many of `out` it filled, in order, covering `0..n`.
    ///
    /// Exact, not approximate: `gather`'s decision is a function of six comparisons (`cx` against the quadrant
    /// split, `cy` against its split, and the owning tile's four edges), and along a row `cx` and `cy` are each
    /// monotonic in `x` (a product and two sums of the exactly converted `x`, each rounded monotonically), so each
    /// comparison with a fixed threshold changes at most once along the row. Each change is located by evaluating
    /// that very comparison on the pixels (from an analytic guess, then galloping and bisecting), so the spans
    /// pick exactly the pixels the per-pixel test would, whatever the rounding.
    pub(crate) fn spans(&self, map: &RowMap, n: usize, out: &mut [(usize, usize, Option<usize>); MAX_SPANS]) -> usize {
        if n == 0 {
            return 0;
        }
        let mut cuts = [0usize; MAX_SPANS + 1];
        let mut k = 1; // cuts[0] = 0
        let mut cut = |p: &dyn Fn(usize) -> bool, guess: f32| {
            if p(0) != p(n - 1) && k < cuts.len() {
                cuts[k] = first_change(p, n, guess);
                k += 1;
            }
        };
        let on_x = |t: f32| move |x: usize| map.at(x).0 >= t;
        let on_y = |t: f32| move |x: usize| map.at(x).1 >= t;
        let guess_x = |t: f32| (t - map.bx - map.cx) / map.ax;
        let guess_y = |t: f32| (t - map.by - map.cy) / map.ay;
        cut(&on_x(self.split_x), guess_x(self.split_x));
        cut(&on_y(self.split_y), guess_y(self.split_y));
        for t in self.tiles.iter().flatten() {
            for e in [t.x_min, t.x_max] {
                cut(&on_x(e), guess_x(e));
            }
            for e in [t.y_min, t.y_max] {
                cut(&on_y(e), guess_y(e));
            }
        }
        let cuts = &mut cuts[..k];
        cuts.sort_unstable();
        let mut m = 0;
        for (i, &a) in cuts.iter().enumerate() {
            let end = cuts.get(i + 1).copied().unwrap_or(n);
            if a == end {
                continue;
            }
            let (cx, cy) = map.at(a);
            let owner = self.owner(cx, cy).map(|(q, _)| q);
            match out[..m].last_mut() {
                Some(last) if last.2 == owner => last.1 = end,
                _ => {
                    out[m] = (a, end, owner);
                    m += 1;
                }
            }
        }
        m
    }

    /// Writes `gather` of output pixels `x0..x0 + r.len()` of the row `map` (a span [`Self::spans`] gave tile
    /// `q`) into the three channel rows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn render_span(
        &self,
        q: usize,
        map: &RowMap,
        x0: usize,
        scratch: &mut RunScratch,
        r: &mut [u8],
        g: &mut [u8],
        b: &mut [u8],
    ) {
        let Some(t) = self.tiles.get(q).and_then(Option::as_ref) else {
            return;
        };
        // No rotation or shear (Ultralytics' default): `cy` is the same value on the whole row (`0 x` is a zero,
        // so only the sign of a zero `cy` can differ from pixel to pixel, and the clamp and floor of `sy` make
        // both signs give the same source row and weight), so the two source rows are fetched once.
        if map.ay == 0.0
            && t.sampler.max_x() < RUN_MAX_WIDTH
            && let Some(rows) = t.sampler.rows(t.sy(map.at(x0).1))
        {
            // In runs: the source positions first (a loop of plain float arithmetic), then the samples.
            let chunks = r.chunks_mut(RUN).zip(g.chunks_mut(RUN)).zip(b.chunks_mut(RUN));
            for (((r, g), b), x) in chunks.zip((x0..).step_by(RUN)) {
                // `x + r.len() <= n < 2^24` (`TrainPlan` takes the row path only then): exact as `i32`.
                for (s, x) in scratch.xs.iter_mut().zip(x as i32..).take(r.len()) {
                    *s = t.sx_select(map.x_at(x));
                }
                rows.sample_run(scratch, r.len(), r, g, b);
            }
        } else {
            for (((r, g), b), x) in r.iter_mut().zip(g.iter_mut()).zip(b.iter_mut()).zip(x0..) {
                let (cx, cy) = map.at(x);
                let [pr, pg, pb] = t.sampler.sample_clamped(t.sx(cx), t.sy(cy));
                (*r, *g, *b) = (pr, pg, pb);
            }
        }
    }

    /// Every label on the canvas, in tile order then label order (mosaic: clipped to the canvas, zero-area
    /// boxes dropped).
    pub(crate) fn labels(&self, mut f: impl FnMut(Label)) {
        let (w, h) = (self.width as f32, self.height as f32);
        for t in self.tiles.iter().flatten() {
            for l in t.labels {
                let mut b = l.bbox.scale_shift(t.bx, t.by, t.dx, t.dy);
                if self.clip_labels {
                    b = b.clip(w, h);
                    if !(b.width() > 0.0 && b.height() > 0.0) {
                        continue;
                    }
                }
                f(Label { class: l.class, bbox: b });
            }
        }
    }
}

/// Flips a box on a `w x h` canvas.
pub(crate) fn flip_box(b: &BoxXyxy, w: f32, h: f32, lr: bool, ud: bool) -> BoxXyxy {
    let (mut x1, mut y1, mut x2, mut y2) = (b.x1, b.y1, b.x2, b.y2);
    if lr {
        (x1, x2) = (w - x2, w - x1);
    }
    if ud {
        (y1, y2) = (h - y2, h - y1);
    }
    BoxXyxy::new(x1, y1, x2, y2)
}
