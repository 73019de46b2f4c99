//! The synthetic shapes dataset, Sluice's embedded default: real JPEG files, YOLO labels and a `data.yaml`,
//! deterministic from a seed (image `i` of a split is a pure function of `(seed, split, i)`, whatever the thread
//! count). Six shape classes (circle, square, triangle, star, ring, cross) in varied colours, sizes (4%–60% of
//! the image side), aspect ratios and rotations, 1–8 per image with limited partial overlaps, on gradient +
//! value-noise + pixel-noise backgrounds with distractor lines. Drawn by a small anti-aliased rasteriser
//! (3x3 supersampling of exact inside tests). Each box is centred on its shape's centre: the exact extent of the
//! point-symmetric shapes (circle, square, ring, cross), and for the triangle and the star, whose extents are not
//! symmetric about their centres, the symmetric extent, which is loose on one side when they are rotated. The
//! default's figures are measured on these labels.
//!
//! A second kit ([`Kit::Signs`]) is another task for fine-tuning a model trained on the first: four other classes
//! (hexagon, diamond, arrow, half-disc) on the same backgrounds overlaid with stripes or a checkerboard, each boxed
//! by its exact extent.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use image::RgbImage;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use sluice_core::{BoxXyxy, Label};

use crate::error::{DatasetError, Result};

/// The class names of [`Kit::Shapes`], index = class id.
pub const CLASSES: [&str; 6] = ["circle", "square", "triangle", "star", "ring", "cross"];

/// The class names of [`Kit::Signs`], index = class id.
pub const SIGN_CLASSES: [&str; 4] = ["hexagon", "diamond", "arrow", "half-disc"];

/// Which objects and backgrounds a dataset holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kit {
    /// Six shape classes ([`CLASSES`]) on gradient and noise backgrounds: the embedded default's.
    #[default]
    Shapes,
    /// Four other classes ([`SIGN_CLASSES`]) on those backgrounds overlaid with stripes or a checkerboard.
    Signs,
}

impl Kit {
    /// The class names, index = class id.
    pub fn classes(self) -> &'static [&'static str] {
        match self {
            Kit::Shapes => &CLASSES,
            Kit::Signs => &SIGN_CLASSES,
        }
    }

    fn shapes(self) -> &'static [Shape] {
        match self {
            Kit::Shapes => &SHAPES,
            Kit::Signs => &SIGNS,
        }
    }
}

/// The first line of a generated `data.yaml` (marks a folder the generator may overwrite).
const MARKER: &str = "# Sluice synthetic shapes dataset";

/// How many objects an image holds and how large they are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objects {
    /// Smallest object side as a fraction of the image side (sizes are log-uniform between the two bounds).
    pub min_size: f32,
    /// Largest object side as a fraction of the image side.
    pub max_size: f32,
    /// Objects per image are drawn uniformly from `1..=max_count` (fewer when no free place is found).
    pub max_count: usize,
}

impl Default for Objects {
    /// 4%–60% of the side, 1–8 per image.
    fn default() -> Self {
        Self { min_size: 0.04, max_size: 0.6, max_count: 8 }
    }
}

impl Objects {
    fn validate(&self) -> Result<()> {
        let ok = self.min_size > 0.0 && self.min_size <= self.max_size && self.max_size < 1.0 && self.max_count >= 1;
        if ok {
            Ok(())
        } else {
            Err(DatasetError::Invalid {
                what: "synthetic dataset",
                reason: format!("objects {self:?}: need 0 < min_size <= max_size < 1 and max_count >= 1"),
            })
        }
    }
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthConfig {
    /// Output folder (gets `data.yaml`, `images/{train,val}`, `labels/{train,val}`).
    pub out: PathBuf,
    /// Seed: the same seed gives byte-identical files.
    pub seed: u64,
    /// Train images.
    pub train: usize,
    /// Val images (0: `val` points at the train images).
    pub val: usize,
    /// Image side in pixels (images are square).
    pub imgsz: u32,
    /// JPEG quality, 1–100.
    pub quality: u8,
    /// Object count and size range.
    pub objects: Objects,
    /// The classes and backgrounds.
    pub kit: Kit,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            out: PathBuf::from("datasets/synthetic"),
            seed: 0,
            train: 256,
            val: 64,
            imgsz: 320,
            quality: 90,
            objects: Objects::default(),
            kit: Kit::Shapes,
        }
    }
}

impl SynthConfig {
    /// The embedded default of `cargo xtask train`: 400 train / 100 val images at 256 px with 1–6 objects of
    /// 8%–50% of the side: the object counts and sizes of the shapes set on which the reference training figures
    /// of Ultralytics were measured, with six classes instead of its five.
    pub fn quick(out: impl Into<PathBuf>) -> Self {
        Self {
            out: out.into(),
            seed: 0,
            train: 400,
            val: 100,
            imgsz: 256,
            quality: 90,
            objects: Objects { min_size: 0.08, max_size: 0.5, max_count: 6 },
            kit: Kit::Shapes,
        }
    }

    /// A fine-tuning task for a model trained on [`SynthConfig::quick`]: [`Kit::Signs`], 200 train / 100 val
    /// images at 256 px with 1–8 objects of 6%–40% of the side.
    pub fn signs(out: impl Into<PathBuf>) -> Self {
        Self {
            out: out.into(),
            seed: 0,
            train: 200,
            val: 100,
            imgsz: 256,
            quality: 90,
            objects: Objects { min_size: 0.06, max_size: 0.4, max_count: 8 },
            kit: Kit::Signs,
        }
    }

    /// The comment line a generated `data.yaml` carries with every setting that shapes the pixels, so a caller
    /// can tell whether a folder on disk was made with this configuration (see [`is_generated_with`]).
    pub fn provenance(&self) -> String {
        let o = &self.objects;
        let kit = match self.kit {
            Kit::Shapes => "",
            Kit::Signs => ", kit signs",
        };
        format!(
            "# seed {}, {} train + {} val images of {} px, JPEG quality {}, 1-{} objects of {}-{} of the side{kit}",
            self.seed, self.train, self.val, self.imgsz, self.quality, o.max_count, o.min_size, o.max_size
        )
    }
}

/// Whether `cfg.out` holds a dataset generated with exactly `cfg` (its `data.yaml` carries the provenance line).
pub fn is_generated_with(cfg: &SynthConfig) -> bool {
    std::fs::read_to_string(cfg.out.join("data.yaml"))
        .is_ok_and(|t| t.starts_with(MARKER) && t.lines().any(|l| l == cfg.provenance()))
}

/// What was generated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SynthSummary {
    /// The dataset YAML written.
    pub data_yaml: PathBuf,
    /// Train images written.
    pub train_images: usize,
    /// Val images written.
    pub val_images: usize,
    /// Boxes written (both splits).
    pub boxes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Circle,
    Square,
    Triangle,
    Star,
    Ring,
    Cross,
    Hexagon,
    Diamond,
    Arrow,
    HalfDisc,
}

const SHAPES: [Shape; 6] = [Shape::Circle, Shape::Square, Shape::Triangle, Shape::Star, Shape::Ring, Shape::Cross];
const SIGNS: [Shape; 4] = [Shape::Hexagon, Shape::Diamond, Shape::Arrow, Shape::HalfDisc];

/// The unit-frame polygons and outlines of the shapes that need them, made once per image.
struct Outlines {
    star: [(f32, f32); 10],
    hexagon: [(f32, f32); 6],
    arrow: [(f32, f32); 7],
    /// The half-disc's arc, densely sampled (its extent is that of these points within 0.1% of the radius).
    arc: [(f32, f32); 65],
}

impl Outlines {
    fn new() -> Self {
        let mut hexagon = [(0.0, 0.0); 6];
        for (k, p) in hexagon.iter_mut().enumerate() {
            let a = k as f32 * std::f32::consts::PI / 3.0;
            *p = (a.cos(), a.sin());
        }
        let mut arc = [(0.0, 0.0); 65];
        for (k, p) in arc.iter_mut().enumerate() {
            let a = k as f32 * std::f32::consts::PI / 64.0;
            *p = (a.cos(), a.sin());
        }
        let arrow = [(-1.0, -0.3), (0.2, -0.3), (0.2, -0.8), (1.0, 0.0), (0.2, 0.8), (0.2, 0.3), (-1.0, 0.3)];
        Self { star: star_vertices(), hexagon, arrow, arc }
    }
}

fn star_vertices() -> [(f32, f32); 10] {
    let mut v = [(0.0, 0.0); 10];
    for (k, p) in v.iter_mut().enumerate() {
        let r = if k % 2 == 0 { 1.0 } else { 0.42 };
        let a = -std::f32::consts::FRAC_PI_2 + k as f32 * std::f32::consts::PI / 5.0;
        *p = (r * a.cos(), r * a.sin());
    }
    v
}

fn in_polygon(u: f32, v: f32, poly: &[(f32, f32)]) -> bool {
    let mut inside = false;
    let mut j = poly.len() - 1;
    for i in 0..poly.len() {
        let (xi, yi) = poly[i];
        let (xj, yj) = poly[j];
        if (yi > v) != (yj > v) && u < (xj - xi) * (v - yi) / (yj - yi) + xi {
            inside = !inside;
        }
        j = i;
    }
    inside
}

impl Shape {
    /// Whether the unit-frame point `(u, v)` is inside the shape (unit frame: `[-1, 1]²`).
    fn inside(self, u: f32, v: f32, o: &Outlines) -> bool {
        match self {
            Self::Circle => u * u + v * v <= 1.0,
            Self::Ring => (0.36..=1.0).contains(&(u * u + v * v)),
            Self::Square => u.abs() <= 1.0 && v.abs() <= 1.0,
            Self::Cross => (u.abs() <= 0.3 && v.abs() <= 1.0) || (v.abs() <= 0.3 && u.abs() <= 1.0),
            Self::Triangle => v <= 1.0 && u.abs() <= (v + 1.0) / 2.0,
            Self::Star => in_polygon(u, v, &o.star),
            Self::Hexagon => in_polygon(u, v, &o.hexagon),
            Self::Diamond => u.abs() + v.abs() <= 1.0,
            Self::Arrow => in_polygon(u, v, &o.arrow),
            Self::HalfDisc => v >= 0.0 && u * u + v * v <= 1.0,
        }
    }

    /// The unit-frame points whose images bound the shape (polygonal shapes).
    fn extremes(self, o: &Outlines) -> Vec<(f32, f32)> {
        match self {
            Self::Square => vec![(-1.0, -1.0), (1.0, -1.0), (1.0, 1.0), (-1.0, 1.0)],
            Self::Cross => {
                vec![
                    (1.0, 0.3),
                    (1.0, -0.3),
                    (-1.0, 0.3),
                    (-1.0, -0.3),
                    (0.3, 1.0),
                    (-0.3, 1.0),
                    (0.3, -1.0),
                    (-0.3, -1.0),
                ]
            }
            Self::Triangle => vec![(0.0, -1.0), (1.0, 1.0), (-1.0, 1.0)],
            Self::Star => o.star.iter().step_by(2).copied().collect(),
            Self::Hexagon => o.hexagon.to_vec(),
            Self::Diamond => vec![(1.0, 0.0), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)],
            Self::Arrow => o.arrow.to_vec(),
            Self::HalfDisc => o.arc.to_vec(),
            Self::Circle | Self::Ring => Vec::new(),
        }
    }
}

/// A placed shape: centre, half-extents of the unit frame, rotation.
#[derive(Debug, Clone, Copy)]
struct Placed {
    shape: Shape,
    cx: f32,
    cy: f32,
    rx: f32,
    ry: f32,
    theta: f32,
}

impl Placed {
    /// Half width and half height of the axis-aligned extent.
    fn half_extent(&self, o: &Outlines) -> (f32, f32) {
        let (c, s) = (self.theta.cos(), self.theta.sin());
        match self.shape {
            Shape::Circle | Shape::Ring => (
                ((self.rx * c).powi(2) + (self.ry * s).powi(2)).sqrt(),
                ((self.rx * s).powi(2) + (self.ry * c).powi(2)).sqrt(),
            ),
            _ => self.shape.extremes(o).iter().fold((0.0f32, 0.0f32), |(hx, hy), &(u, v)| {
                let (x, y) = (c * u * self.rx - s * v * self.ry, s * u * self.rx + c * v * self.ry);
                (hx.max(x.abs()), hy.max(y.abs()))
            }),
        }
    }

    /// The box centred on the shape's centre with its [`half_extent`](Self::half_extent)s.
    fn bbox(&self, o: &Outlines) -> BoxXyxy {
        let (hx, hy) = self.half_extent(o);
        BoxXyxy::new(self.cx - hx, self.cy - hy, self.cx + hx, self.cy + hy)
    }

    /// The exact axis-aligned extent relative to the centre: `[x_lo, y_lo, x_hi, y_hi]` (polygonal shapes and the
    /// half-disc, from their extreme points).
    fn bounds(&self, o: &Outlines) -> [f32; 4] {
        let (c, s) = (self.theta.cos(), self.theta.sin());
        let init = [f32::INFINITY, f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY];
        self.shape.extremes(o).iter().fold(init, |[x0, y0, x1, y1], &(u, v)| {
            let (x, y) = (c * u * self.rx - s * v * self.ry, s * u * self.rx + c * v * self.ry);
            [x0.min(x), y0.min(y), x1.max(x), y1.max(y)]
        })
    }
}

fn hsv(h: f32, s: f32, v: f32) -> [f32; 3] {
    let i = (h * 6.0).floor();
    let f = h * 6.0 - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - f * s), v * (1.0 - (1.0 - f) * s));
    let rgb = match (i as i32).rem_euclid(6) {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    };
    rgb.map(|x| x * 255.0)
}

fn luma(c: [f32; 3]) -> f32 {
    0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
}

/// Renders image `index` of split `split` (0 train, 1 val) for `seed` with the default [`Objects`]: pixels and
/// pixel-`xyxy` labels.
pub fn render(seed: u64, split: u64, index: u64, imgsz: u32) -> (RgbImage, Vec<Label>) {
    render_with(seed, split, index, imgsz, &Objects::default())
}

/// [`render`] with an object count and size range.
pub fn render_with(seed: u64, split: u64, index: u64, imgsz: u32, objects: &Objects) -> (RgbImage, Vec<Label>) {
    render_kit(seed, split, index, imgsz, objects, Kit::Shapes)
}

/// [`render_with`] from a kit's classes and backgrounds.
pub fn render_kit(
    seed: u64,
    split: u64,
    index: u64,
    imgsz: u32,
    objects: &Objects,
    kit: Kit,
) -> (RgbImage, Vec<Label>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream((split << 48) | index);
    let n = imgsz.max(16);
    let outlines = Outlines::new();
    // One stream in this order: the background, the shapes' places, their colours.
    let mut buf = background(&mut rng, n, kit);
    let placed = place(&mut rng, n as f32, objects, kit, &outlines);
    let labels = draw(&mut rng, &mut buf, n, &placed, kit, &outlines);
    let pixels: Vec<u8> = buf.iter().map(|v| v.round().clamp(0.0, 255.0) as u8).collect();
    let img = RgbImage::from_raw(n, n, pixels).unwrap_or_else(|| RgbImage::new(n, n));
    (img, labels)
}

/// An `n × n` background as interleaved RGB floats: a gradient between two muted colours, low-frequency value
/// noise, the kit's texture, pixel noise and distractor lines.
fn background(rng: &mut ChaCha8Rng, n: u32, kit: Kit) -> Vec<f32> {
    let nf = n as f32;
    let c0 = hsv(rng.random(), rng.random_range(0.0..0.35), rng.random_range(0.2..0.9));
    let c1 = hsv(rng.random(), rng.random_range(0.0..0.35), rng.random_range(0.2..0.9));
    let ang: f32 = rng.random_range(0.0..std::f32::consts::TAU);
    let (ga, gb) = (ang.cos(), ang.sin());
    const G: usize = 6;
    let grid: Vec<f32> = (0..(G + 1) * (G + 1)).map(|_| rng.random_range(-30.0..30.0)).collect();
    let noise_amp: f32 = rng.random_range(4.0..16.0);
    // The signs' texture: stripes or a checkerboard of a random period, angle and contrast (no draws for the
    // shapes kit, whose images stay as they are).
    let texture = match kit {
        Kit::Shapes => None,
        Kit::Signs => Some(Texture {
            checker: rng.random_bool(0.5),
            period: rng.random_range(0.03..0.12) * nf,
            angle: rng.random_range(0.0..std::f32::consts::PI),
            amp: rng.random_range(12.0..40.0),
        }),
    };
    let mut buf = vec![0f32; (n * n * 3) as usize];
    for y in 0..n {
        for x in 0..n {
            let (fx, fy) = (x as f32 / nf, y as f32 / nf);
            let t = (((fx - 0.5) * ga + (fy - 0.5) * gb) + 0.75) / 1.5;
            let (gx, gy) = (fx * G as f32, fy * G as f32);
            let (ix, iy) = ((gx as usize).min(G - 1), (gy as usize).min(G - 1));
            let (tx, ty) = (gx - ix as f32, gy - iy as f32);
            let g = |i: usize, j: usize| grid[j * (G + 1) + i];
            let vn = (g(ix, iy) * (1.0 - tx) + g(ix + 1, iy) * tx) * (1.0 - ty)
                + (g(ix, iy + 1) * (1.0 - tx) + g(ix + 1, iy + 1) * tx) * ty
                + texture.as_ref().map_or(0.0, |t| t.at(x as f32, y as f32));
            let i = ((y * n + x) * 3) as usize;
            for c in 0..3 {
                let px = c0[c] * (1.0 - t) + c1[c] * t + vn + rng.random_range(-noise_amp..noise_amp);
                buf[i + c] = px;
            }
        }
    }
    // Distractor lines.
    for _ in 0..rng.random_range(2..7) {
        let col = hsv(rng.random(), rng.random_range(0.0..0.6), rng.random_range(0.1..1.0));
        let (x0, y0, x1, y1): (f32, f32, f32, f32) = (
            rng.random_range(0.0..nf),
            rng.random_range(0.0..nf),
            rng.random_range(0.0..nf),
            rng.random_range(0.0..nf),
        );
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()) as usize).max(1);
        for k in 0..=steps {
            let t = k as f32 / steps as f32;
            let (x, y) = ((x0 + (x1 - x0) * t) as u32, (y0 + (y1 - y0) * t) as u32);
            if x < n && y < n {
                let i = ((y * n + x) * 3) as usize;
                for c in 0..3 {
                    buf[i + c] = 0.6 * buf[i + c] + 0.4 * col[c];
                }
            }
        }
    }

    buf
}

/// Up to `objects.max_count` shapes of the kit with their boxes, placed with limited overlaps.
fn place(rng: &mut ChaCha8Rng, nf: f32, objects: &Objects, kit: Kit, outlines: &Outlines) -> Vec<(Placed, BoxXyxy)> {
    let count = rng.random_range(1..=objects.max_count.max(1));
    let mut placed: Vec<(Placed, BoxXyxy)> = Vec::with_capacity(count);
    for _ in 0..count {
        for _attempt in 0..30 {
            let shapes = kit.shapes();
            let shape = shapes[rng.random_range(0..shapes.len())];
            let (lo, hi) = (objects.min_size.ln(), objects.max_size.ln());
            let size = nf * if hi > lo { rng.random_range(lo..hi).exp() } else { objects.min_size };
            let aspect = match shape {
                Shape::Triangle | Shape::Star | Shape::Hexagon | Shape::HalfDisc => {
                    rng.random_range(0.8f32.ln()..1.25f32.ln()).exp()
                }
                _ => rng.random_range(0.6f32.ln()..1.6f32.ln()).exp(),
            };
            let theta = match shape {
                Shape::Square | Shape::Cross => rng.random_range(-0.3..0.3),
                _ => rng.random_range(0.0..std::f32::consts::TAU),
            };
            let mut p = Placed { shape, cx: 0.0, cy: 0.0, rx: aspect.sqrt(), ry: 1.0 / aspect.sqrt(), theta };
            let b = match kit {
                Kit::Shapes => {
                    let (hx, hy) = p.half_extent(outlines);
                    let k = size / (2.0 * hx.max(hy));
                    p.rx *= k;
                    p.ry *= k;
                    let (hx, hy) = p.half_extent(outlines);
                    if 2.0 * hx >= nf - 2.0 || 2.0 * hy >= nf - 2.0 {
                        continue;
                    }
                    p.cx = rng.random_range(hx + 1.0..nf - hx - 1.0);
                    p.cy = rng.random_range(hy + 1.0..nf - hy - 1.0);
                    p.bbox(outlines)
                }
                Kit::Signs => {
                    let [x0, y0, x1, y1] = p.bounds(outlines);
                    let k = size / (x1 - x0).max(y1 - y0);
                    p.rx *= k;
                    p.ry *= k;
                    let [x0, y0, x1, y1] = p.bounds(outlines);
                    if x1 - x0 >= nf - 2.0 || y1 - y0 >= nf - 2.0 {
                        continue;
                    }
                    p.cx = rng.random_range(1.0 - x0..nf - 1.0 - x1);
                    p.cy = rng.random_range(1.0 - y0..nf - 1.0 - y1);
                    BoxXyxy::new(p.cx + x0, p.cy + y0, p.cx + x1, p.cy + y1)
                }
            };
            let ok = placed.iter().all(|(_, q)| b.iou(q) < 0.3 && b.intersection(q) < 0.45 * q.area());
            if ok {
                placed.push((p, b));
                break;
            }
        }
    }
    placed
}

/// Draws the placed shapes into `buf` in colours that stand out from the background under them; their labels.
fn draw(
    rng: &mut ChaCha8Rng,
    buf: &mut [f32],
    n: u32,
    placed: &[(Placed, BoxXyxy)],
    kit: Kit,
    outlines: &Outlines,
) -> Vec<Label> {
    let nf = n as f32;
    let mut labels = Vec::with_capacity(placed.len());
    for (class, (p, b)) in placed.iter().map(|(p, b)| (kit.shapes().iter().position(|s| *s == p.shape), (p, b))) {
        let bg = {
            let (x, y) = ((p.cx as u32).min(n - 1), (p.cy as u32).min(n - 1));
            let i = ((y * n + x) * 3) as usize;
            luma([buf[i], buf[i + 1], buf[i + 2]])
        };
        let mut col = hsv(rng.random(), rng.random_range(0.5..1.0), rng.random_range(0.45..1.0));
        if (luma(col) - bg).abs() < 45.0 {
            let target = if bg > 128.0 { rng.random_range(0.1..0.35) } else { rng.random_range(0.8..1.0) };
            let s = target * 255.0 / luma(col).max(1.0);
            col = col.map(|c| (c * s).min(255.0));
        }
        let shade: f32 = rng.random_range(-0.2..0.2);
        let (c, s) = (p.theta.cos(), p.theta.sin());
        let (x0, y0) = (b.x1.floor().max(0.0) as u32, b.y1.floor().max(0.0) as u32);
        let (x1, y1) = ((b.x2.ceil() as u32).min(n), (b.y2.ceil() as u32).min(n));
        for y in y0..y1 {
            for x in x0..x1 {
                let mut cover = 0u32;
                for sy in [1.0 / 6.0, 0.5, 5.0 / 6.0] {
                    for sx in [1.0 / 6.0, 0.5, 5.0 / 6.0] {
                        let (dx, dy) = (x as f32 + sx - p.cx, y as f32 + sy - p.cy);
                        let (u, v) = ((c * dx + s * dy) / p.rx, (-s * dx + c * dy) / p.ry);
                        cover += u32::from(p.shape.inside(u, v, outlines));
                    }
                }
                if cover == 0 {
                    continue;
                }
                let a = cover as f32 / 9.0;
                let light = 1.0 + shade * ((y as f32 - p.cy) / (b.height() * 0.5).max(1.0));
                let i = ((y * n + x) * 3) as usize;
                for ch in 0..3 {
                    buf[i + ch] = buf[i + ch] * (1.0 - a) + (col[ch] * light) * a;
                }
            }
        }
        if let Some(class) = class {
            labels.push(Label { class: class as u32, bbox: b.clip(nf, nf) });
        }
    }
    labels
}

/// A periodic overlay of a background: stripes across `angle`, or a checkerboard along it.
struct Texture {
    checker: bool,
    /// Pixels per period.
    period: f32,
    angle: f32,
    /// Half the peak-to-peak change of the pixel value.
    amp: f32,
}

impl Texture {
    fn at(&self, x: f32, y: f32) -> f32 {
        let (c, s) = (self.angle.cos(), self.angle.sin());
        let w = std::f32::consts::TAU / self.period;
        let a = ((c * x + s * y) * w).sin();
        let v = if self.checker { a * ((c * y - s * x) * w).sin() } else { a };
        self.amp * v.signum()
    }
}

/// YOLO label text for pixel labels of a `w x h` image.
pub fn yolo_text(labels: &[Label], w: u32, h: u32) -> String {
    let (wf, hf) = (w as f32, h as f32);
    labels
        .iter()
        .map(|l| {
            let [cx, cy, bw, bh] = l.bbox.to_cxcywh();
            format!("{} {:.6} {:.6} {:.6} {:.6}\n", l.class, cx / wf, cy / hf, bw / wf, bh / hf)
        })
        .collect()
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = BufWriter::new(std::fs::File::create(path).map_err(|e| DatasetError::io(path, e))?);
    f.write_all(bytes).and_then(|()| f.flush()).map_err(|e| DatasetError::io(path, e))
}

/// Encodes an RGB image as JPEG.
pub fn encode_jpeg(img: &RgbImage, quality: u8) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality.clamp(1, 100))
        .encode(img.as_raw(), img.width(), img.height(), image::ExtendedColorType::Rgb8)
        .map_err(|e| DatasetError::Invalid { what: "JPEG encoding", reason: e.to_string() })?;
    Ok(out)
}

/// Generates the dataset described by `cfg` (replacing an earlier generated one in the same folder).
pub fn generate(cfg: &SynthConfig) -> Result<SynthSummary> {
    if cfg.train == 0 {
        return Err(DatasetError::Invalid { what: "synthetic dataset", reason: "at least one train image".into() });
    }
    cfg.objects.validate()?;
    let out = &cfg.out;
    let yaml = out.join("data.yaml");
    if out.join("images").exists() || out.join("labels").exists() {
        let ours = std::fs::read_to_string(&yaml).is_ok_and(|t| t.starts_with(MARKER));
        if !ours {
            return Err(DatasetError::Invalid {
                what: "output folder",
                reason: format!(
                    "{} holds images/ or labels/ but no generated data.yaml: not overwriting",
                    out.display()
                ),
            });
        }
        for d in ["images", "labels"] {
            let p = out.join(d);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| DatasetError::io(&p, e))?;
            }
        }
    }
    let mut boxes = 0;
    for (split, name, count) in [(0u64, "train", cfg.train), (1, "val", cfg.val)] {
        if count == 0 {
            continue;
        }
        let (idir, ldir) = (out.join("images").join(name), out.join("labels").join(name));
        for d in [&idir, &ldir] {
            std::fs::create_dir_all(d).map_err(|e| DatasetError::io(d, e))?;
        }
        let per: Vec<usize> = (0..count)
            .into_par_iter()
            .map(|i| -> Result<usize> {
                let (img, labels) = render_kit(cfg.seed, split, i as u64, cfg.imgsz, &cfg.objects, cfg.kit);
                write_file(&idir.join(format!("{i:06}.jpg")), &encode_jpeg(&img, cfg.quality)?)?;
                let text = yolo_text(&labels, img.width(), img.height());
                write_file(&ldir.join(format!("{i:06}.txt")), text.as_bytes())?;
                Ok(labels.len())
            })
            .collect::<Result<_>>()?;
        boxes += per.iter().sum::<usize>();
    }
    let mut y = format!(
        "{MARKER} (seed {}, {} train + {} val images at {} px).\n# Generated by `cargo xtask gen-data`: deterministic, do not edit.\n",
        cfg.seed, cfg.train, cfg.val, cfg.imgsz
    );
    y.push_str(&cfg.provenance());
    y.push('\n');
    y.push_str("train: images/train\n");
    y.push_str(if cfg.val > 0 { "val: images/val\n" } else { "val: images/train\n" });
    y.push_str("names:\n");
    for (i, c) in cfg.kit.classes().iter().enumerate() {
        y.push_str(&format!("  {i}: {c}\n"));
    }
    write_file(&yaml, y.as_bytes())?;
    Ok(SynthSummary { data_yaml: yaml, train_images: cfg.train, val_images: cfg.val, boxes })
}

#[cfg(test)]
mod tests;
