//! Per-sample cost of the fused mosaic-4 + random perspective + HSV + flip sampler against a naive baseline that
//! does what Ultralytics does in separate full passes (resize each tile, paste into a `2 imgsz` canvas, warp the
//! canvas, HSV over the output, flip, HWC → CHW), measured in the same run; plus the validation letterbox.
//! The ratio `naive / fused` is the figure of merit.
//!
//! Per stage, each one sample at 640 (group `train_stage_640`), as far as the fused sampler has separable stages:
//! `mosaic_only` (Ultralytics with `degrees = translate = scale = shear = 0`: the centred 640 crop of the mosaic
//! canvas, sampled 1:1, no HSV), `affine_only` (no mosaic: one image letterboxed and warped by the drawn random
//! affine, no HSV), `mosaic_affine` (both, no HSV), and `hsv_only` ([`HsvLut::apply_planes`] over a rendered
//! sample's three planes: the colour stage the fused sampler runs on each span, compiled as the sampler runs it,
//! inside an AVX2 function where the CPU has AVX2 and as baseline x86-64 elsewhere; `hsv_only_baseline_x86_64`
//! is the baseline build on any CPU, what a machine without AVX2 runs). The flips have no case of their own: they
//! are folded into the inverse map, so they cost nothing separable.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_augment::resample::Sampler;
use sluice_augment::{
    FILL, Geometry, HsvLut, Hyp, Layout, Letterbox, LetterboxOpts, PerspectiveParams, RecipeSampler, TrainPlan,
    TrainRecipe, letterbox_into, load_size,
};
use sluice_core::{ImageLabels, ImageRgb8, SourceImage};

fn noise_image(w: u32, h: u32, seed: u64) -> SourceImage {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut image = ImageRgb8::new(w, h);
    // Smooth-ish content: a gradient plus noise, like a photo at this scale.
    for y in 0..h {
        for (x, px) in image.row_mut(y).chunks_exact_mut(3).enumerate() {
            let base = ((x as u32 + y) / 5) as u8;
            for (c, v) in px.iter_mut().enumerate() {
                *v = base.wrapping_mul(c as u8 + 1).wrapping_add(rng.random_range(0..16));
            }
        }
    }
    SourceImage { image, labels: ImageLabels { width: w, height: h, objects: Vec::new() } }
}

/// The separate-pass baseline, HWC intermediates allocated once and reused like a careful Python loader would.
struct Naive {
    tiles: Vec<Vec<u8>>,
    canvas: Vec<u8>,
    warped: Vec<u8>,
}

impl Naive {
    fn new() -> Self {
        Self { tiles: vec![Vec::new(); 4], canvas: Vec::new(), warped: Vec::new() }
    }

    fn run(&mut self, recipe: &TrainRecipe, images: &[&SourceImage], out: &mut [u8]) {
        let s = recipe.imgsz as usize;
        let Layout::Mosaic4 { centre: (xc, yc), .. } = recipe.geometry.layout else { panic!("mosaic recipe") };
        let (xc, yc, s2) = (xc as i64, yc as i64, 2 * s as i64);
        // 1. Resize each tile (load_image) and 2. paste it into the 2s canvas.
        self.canvas.clear();
        self.canvas.resize(4 * s * s * 3, FILL);
        for (i, img) in images.iter().enumerate() {
            let (tw, th) = load_size(img.image.width(), img.image.height(), recipe.imgsz);
            let (kx, ky) = (img.image.width() as f32 / tw as f32, img.image.height() as f32 / th as f32);
            let sampler = Sampler::new(&img.image).expect("image");
            let tile = &mut self.tiles[i];
            tile.clear();
            tile.resize(tw as usize * th as usize * 3, 0);
            for v in 0..th as usize {
                for u in 0..tw as usize {
                    let px = sampler.sample((u as f32 + 0.5) * kx - 0.5, (v as f32 + 0.5) * ky - 0.5);
                    tile[(v * tw as usize + u) * 3..][..3].copy_from_slice(&px);
                }
            }
            let (w, h) = (tw as i64, th as i64);
            let (x1a, y1a, x2a, y2a, x1b, y1b) = match i {
                0 => ((xc - w).max(0), (yc - h).max(0), xc, yc, w - (xc - (xc - w).max(0)), h - (yc - (yc - h).max(0))),
                1 => (xc, (yc - h).max(0), (xc + w).min(s2), yc, 0, h - (yc - (yc - h).max(0))),
                2 => ((xc - w).max(0), yc, xc, (yc + h).min(s2), w - (xc - (xc - w).max(0)), 0),
                _ => (xc, yc, (xc + w).min(s2), (yc + h).min(s2), 0, 0),
            };
            for y in y1a..y2a {
                let src = ((y - y1a + y1b) * w + x1b) as usize * 3;
                let dst = (y as usize * 2 * s + x1a as usize) * 3;
                let len = (x2a - x1a) as usize * 3;
                self.canvas[dst..dst + len].copy_from_slice(&tile[src..src + len]);
            }
        }
        // 3. Warp the canvas (bilinear, border 114).
        let m = recipe.geometry.perspective.matrix(s2 as f64, s2 as f64, s as f64, s as f64);
        let inv = m.inverse().expect("invertible");
        let canvas = ImageRgb8::from_raw(s2 as u32, s2 as u32, s2 as usize * 3, std::mem::take(&mut self.canvas))
            .expect("canvas");
        let sampler = Sampler::new(&canvas).expect("canvas");
        self.warped.clear();
        self.warped.resize(s * s * 3, 0);
        for y in 0..s {
            for x in 0..s {
                let (cx, cy) = inv.apply(x as f64, y as f64);
                let (cx, cy) = (cx as f32, cy as f32);
                let px = if cx >= -0.5 && cy >= -0.5 && cx < s2 as f32 - 0.5 && cy < s2 as f32 - 0.5 {
                    sampler.sample(cx, cy)
                } else {
                    [FILL; 3]
                };
                self.warped[(y * s + x) * 3..][..3].copy_from_slice(&px);
            }
        }
        self.canvas = canvas.into_raw();
        // 4. HSV over the output.
        if let Some(g) = recipe.hsv {
            let lut = HsvLut::new(g);
            for px in self.warped.chunks_exact_mut(3) {
                let o = lut.apply([px[0], px[1], px[2]]);
                px.copy_from_slice(&o);
            }
        }
        // 5. Flip.
        if recipe.flip_lr {
            for row in self.warped.chunks_exact_mut(s * 3) {
                for x in 0..s / 2 {
                    for c in 0..3 {
                        row.swap(x * 3 + c, (s - 1 - x) * 3 + c);
                    }
                }
            }
        }
        // 6. HWC -> CHW.
        let plane = s * s;
        for (i, px) in self.warped.chunks_exact(3).enumerate() {
            out[i] = px[0];
            out[plane + i] = px[1];
            out[2 * plane + i] = px[2];
        }
    }
}

/// The two coco128 photos of the test data (640x480 and 640x426), twice, as mosaic tiles; synthetic images when
/// they cannot be read.
fn photos() -> Vec<SourceImage> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let load = |name: &str| -> Option<SourceImage> {
        let img = image::open(dir.join(name)).ok()?.to_rgb8();
        let (w, h) = img.dimensions();
        let image = ImageRgb8::from_raw(w, h, w as usize * 3, img.into_raw()).ok()?;
        Some(SourceImage { image, labels: ImageLabels { width: w, height: h, objects: Vec::new() } })
    };
    match (load("000000000009.jpg"), load("000000000025.jpg")) {
        (Some(a), Some(b)) => vec![a.clone(), b.clone(), b, a],
        _ => (0..4).map(|i| noise_image(640, 480 - 40 * (i % 2) as u32, i)).collect(),
    }
}

fn bench_fused(c: &mut Criterion) {
    let images = photos();
    let refs: Vec<&SourceImage> = images.iter().collect();
    let sampler = RecipeSampler::new(Hyp::default(), 4).expect("sampler");
    let mut group = c.benchmark_group("train_sample_mosaic_perspective_hsv_flip");
    group.throughput(Throughput::Elements(1));
    for imgsz in [320u32, 640] {
        let mut recipe = sampler.draw(0, imgsz, true, &mut ChaCha8Rng::seed_from_u64(5));
        recipe.geometry.layout = Layout::Mosaic4 { ids: [0, 1, 2, 3], centre: (imgsz as i32, imgsz as i32 * 9 / 10) };
        recipe.flip_lr = true;
        let mut out = vec![0u8; 3 * imgsz as usize * imgsz as usize];
        group.bench_with_input(BenchmarkId::new("fused_cpu", imgsz), &recipe, |b, r| {
            b.iter(|| {
                let plan = TrainPlan::new(r, &refs, &[]).expect("plan");
                plan.render(&mut out).expect("render");
                black_box(&out);
            })
        });
        if imgsz == 640 {
            // The same sample without HSV: splits the render's cost into sampling and colour.
            let plain = TrainRecipe { hsv: None, ..recipe };
            group.bench_with_input(BenchmarkId::new("fused_no_hsv_cpu", imgsz), &plain, |b, r| {
                b.iter(|| {
                    let plan = TrainPlan::new(r, &refs, &[]).expect("plan");
                    plan.render(&mut out).expect("render");
                    black_box(&out);
                })
            });
        }
        let mut naive = Naive::new();
        group.bench_with_input(BenchmarkId::new("naive_separate_passes_cpu", imgsz), &recipe, |b, r| {
            b.iter(|| {
                naive.run(r, &refs, &mut out);
                black_box(&out);
            })
        });
    }
    group.finish();

    bench_stages(c, &refs, &sampler);

    let mut group = c.benchmark_group("val_letterbox");
    group.throughput(Throughput::Elements(1));
    let lb = Letterbox::new(640, 480, 672, 512, LetterboxOpts { scaleup: false, ..LetterboxOpts::default() });
    let mut out = vec![0u8; 3 * 672 * 512];
    group.bench_function("letterbox_640x480_into_672x512_cpu", |b| {
        b.iter(|| {
            letterbox_into(&images[0].image, &lb, &mut out);
            black_box(&out);
        })
    });
    let lb = Letterbox::new(640, 480, 320, 320, LetterboxOpts::default());
    let mut out = vec![0u8; 3 * 320 * 320];
    group.bench_function("letterbox_640x480_resize_to_320_cpu", |b| {
        b.iter(|| {
            letterbox_into(&images[0].image, &lb, &mut out);
            black_box(&out);
        })
    });
    group.finish();
}

/// The per-stage cases at 640 (see the header).
fn bench_stages(c: &mut Criterion, refs: &[&SourceImage], sampler: &RecipeSampler) {
    const S: u32 = 640;
    let mut group = c.benchmark_group("train_stage_640");
    group.throughput(Throughput::Elements(1));
    let drawn = sampler.draw(0, S, true, &mut ChaCha8Rng::seed_from_u64(5));
    let mosaic = Layout::Mosaic4 { ids: [0, 1, 2, 3], centre: (S as i32, S as i32 * 9 / 10) };
    let plain = TrainRecipe { hsv: None, flip_lr: false, flip_ud: false, mixup: None, ..drawn };
    let cases = [
        ("mosaic_only_cpu", Geometry { layout: mosaic, perspective: PerspectiveParams::CENTRED }),
        ("affine_only_cpu", Geometry { layout: Layout::Single { id: 0 }, ..drawn.geometry }),
        ("mosaic_affine_cpu", Geometry { layout: mosaic, ..drawn.geometry }),
    ];
    let mut out = vec![0u8; 3 * S as usize * S as usize];
    for (name, geometry) in cases {
        let recipe = TrainRecipe { geometry, ..plain };
        group.bench_function(name, |b| {
            b.iter(|| {
                let plan = TrainPlan::new(&recipe, &refs[..geometry.layout.ids().len()], &[]).expect("plan");
                plan.render(&mut out).expect("render");
                black_box(&out);
            })
        });
    }
    // HSV over the planes of the rendered mosaic + affine sample (photo colours), restored before each pass.
    let lut = HsvLut::new(drawn.hsv.expect("default hyp draws HSV gains"));
    let src = out.clone();
    let plane = (S * S) as usize;
    group.bench_function("hsv_only_cpu", |b| {
        b.iter(|| {
            out.copy_from_slice(&src);
            let (r, rest) = out.split_at_mut(plane);
            let (g, bl) = rest.split_at_mut(plane);
            apply_planes_as_sampler(&lut, r, g, bl);
            black_box(&out);
        })
    });
    group.bench_function("hsv_only_baseline_x86_64_cpu", |b| {
        b.iter(|| {
            out.copy_from_slice(&src);
            let (r, rest) = out.split_at_mut(plane);
            let (g, bl) = rest.split_at_mut(plane);
            lut.apply_planes(r, g, bl);
            black_box(&out);
        })
    });
    // The copy the HSV case includes, alone, to subtract.
    group.bench_function("hsv_only_copy_baseline_cpu", |b| {
        b.iter(|| {
            out.copy_from_slice(&src);
            black_box(&out);
        })
    });
    group.finish();
}

/// [`HsvLut::apply_planes`] as the fused sampler's row path runs it: inlined into an AVX2 function where the CPU
/// has AVX2 (the sampler's run-time dispatch), the baseline x86-64 build elsewhere.
fn apply_planes_as_sampler(lut: &HsvLut, r: &mut [u8], g: &mut [u8], b: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        unsafe { apply_planes_avx2(lut, r, g, b) };
        return;
    }
    lut.apply_planes(r, g, b);
}

/// `apply_planes` (always inlined) compiled for AVX2, like `TrainPlan`'s AVX2 row path.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn apply_planes_avx2(lut: &HsvLut, r: &mut [u8], g: &mut [u8], b: &mut [u8]) {
    lut.apply_planes(r, g, b);
}

criterion_group!(benches, bench_fused);
criterion_main!(benches);
