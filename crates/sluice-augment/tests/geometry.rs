//! Geometry of the fused sampler: after mosaic + perspective + flips, every box lies inside the image and
//! tightly encloses the pixels of its object (filled rectangles of unique colours), and every object that is
//! visible in the output (beyond what Ultralytics' box-candidate filter may drop) has a box. The same holds at every
//! multi-scale output size, and a sample rendered at another size is the `imgsz` sample resized.

mod common;

use common::{COLOURS, chw_pixel, is_colour, rect_dataset};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sluice_augment::{Hyp, Layout, RecipeSampler, TrainPlan, TrainRecipe, multiscale_bounds};
use sluice_core::{Label, SourceImage};

const TOL: f32 = 2.5;

/// Renders a recipe (no HSV, no mixup) and returns the slot and labels.
fn render(recipe: &TrainRecipe, data: &[SourceImage]) -> (Vec<u8>, Vec<Label>) {
    let images: Vec<&SourceImage> = recipe.geometry.layout.ids().iter().map(|&i| &data[i as usize]).collect();
    let plan = TrainPlan::new(recipe, &images, &[]).expect("plan");
    let mut slot = vec![0u8; plan.slot_len()];
    plan.render(&mut slot).expect("render");
    let mut labels = Vec::new();
    plan.labels(|l| labels.push(l));
    (slot, labels)
}

/// Checks one rendered sample; `source_area[class]` is the object's area in its tile's pixels (scaled to the
/// output by the perspective scale), for the completeness bound.
fn check(recipe: &TrainRecipe, slot: &[u8], labels: &[Label], data: &[SourceImage]) {
    let n = recipe.size as usize;
    // Output pixels per `imgsz` pixel (multi-scale); the tolerance is `TOL` pixels of the coarser of the two frames.
    let zoom = recipe.size as f32 / recipe.imgsz as f32;
    let tol = TOL * zoom.max(1.0);
    let s = recipe.geometry.perspective.scale as f32;
    for l in labels {
        let b = l.bbox;
        assert!(b.x1 >= 0.0 && b.y1 >= 0.0 && b.x2 <= n as f32 && b.y2 <= n as f32, "box outside: {b:?}");
        // Ultralytics' candidate filter keeps boxes wider and taller than 2 `imgsz` pixels.
        let min_side = 2.0 * zoom - 1e-3;
        assert!(b.x2 - b.x1 > min_side && b.y2 - b.y1 > min_side, "degenerate box {b:?}");
        // Pixels of this colour near the box: their extent must match the box.
        let (x_lo, x_hi) = (((b.x1 - 3.0).max(0.0)) as usize, ((b.x2 + 3.0).min(n as f32)) as usize);
        let (y_lo, y_hi) = (((b.y1 - 3.0).max(0.0)) as usize, ((b.y2 + 3.0).min(n as f32)) as usize);
        let (mut px1, mut py1, mut px2, mut py2) = (f32::MAX, f32::MAX, f32::MIN, f32::MIN);
        for y in y_lo..y_hi {
            for x in x_lo..x_hi {
                if is_colour(chw_pixel(slot, n, n, x, y), l.class) {
                    px1 = px1.min(x as f32);
                    py1 = py1.min(y as f32);
                    px2 = px2.max(x as f32 + 1.0);
                    py2 = py2.max(y as f32 + 1.0);
                }
            }
        }
        assert!(px1 < px2, "class {} box {b:?} holds none of its pixels (recipe {recipe:?})", l.class);
        // Enclosure: the object's pixels lie inside its box.
        let inside = px1 >= b.x1 - tol && py1 >= b.y1 - tol && px2 <= b.x2 + tol && py2 <= b.y2 + tol;
        assert!(inside, "class {} pixels ({px1}, {py1}, {px2}, {py2}) outside box {b:?} (recipe {recipe:?})", l.class);
        // Tightness, for boxes away from the image border: a box clipped at the border comes from corners that
        // left the image, and Ultralytics' min/max of the rotated corners is then looser than the visible part.
        let interior = b.x1 >= 1.0 && b.y1 >= 1.0 && b.x2 <= n as f32 - 1.0 && b.y2 <= n as f32 - 1.0;
        if interior {
            for (edge, want, got) in [("x1", b.x1, px1), ("y1", b.y1, py1), ("x2", b.x2, px2), ("y2", b.y2, py2)] {
                assert!((want - got).abs() <= tol, "class {} {edge}: box {want} vs pixels {got} ({recipe:?})", l.class);
            }
        }
    }
    // Completeness: pixels of a colour outside every box of that class may only come from objects the candidate
    // filter dropped (under 10% of the scaled area) or slivers (<= 2 px wide along the edges).
    for class in 0..COLOURS.len() as u32 {
        let mut uncovered = 0usize;
        for y in 0..n {
            for x in 0..n {
                if !is_colour(chw_pixel(slot, n, n, x, y), class) {
                    continue;
                }
                let (xf, yf) = (x as f32 + 0.5, y as f32 + 0.5);
                let covered = labels.iter().any(|l| {
                    l.class == class
                        && xf >= l.bbox.x1 - tol
                        && xf <= l.bbox.x2 + tol
                        && yf >= l.bbox.y1 - tol
                        && yf <= l.bbox.y2 + tol
                });
                uncovered += usize::from(!covered);
            }
        }
        if uncovered == 0 {
            continue;
        }
        let (img, obj) = data
            .iter()
            .find_map(|d| d.labels.objects.iter().find(|o| o.class == class).map(|o| (d, o)))
            .expect("class exists");
        // The object's size in the output: tiles are the image resized to a long side of imgsz, then zoomed.
        let k = recipe.imgsz as f32 / img.image.width().max(img.image.height()) as f32 * s * zoom;
        let (w, h) = (obj.bbox.width() * k, obj.bbox.height() * k);
        let bound = 0.1 * w * h + 3.0 * (w + h);
        assert!(
            (uncovered as f32) <= bound,
            "class {class}: {uncovered} visible pixels outside its boxes (bound {bound}); recipe {recipe:?}"
        );
    }
}

fn recipes(hyp: Hyp, imgsz: u32, mosaic: bool, count: u64) -> Vec<TrainRecipe> {
    let sampler = RecipeSampler::new(Hyp { hsv_h: 0.0, hsv_s: 0.0, hsv_v: 0.0, ..hyp }, 4).expect("sampler");
    (0..count)
        .map(|i| {
            let mut r = sampler.draw(i % 4, imgsz, mosaic, &mut ChaCha8Rng::seed_from_u64(1000 + i));
            // Distinct tiles so each colour appears once.
            if let Layout::Mosaic4 { ids, .. } = &mut r.geometry.layout {
                *ids = [i % 4, (i + 1) % 4, (i + 2) % 4, (i + 3) % 4];
            }
            r
        })
        .collect()
}

#[test]
fn mosaic_perspective_boxes_enclose_their_objects() {
    let data = rect_dataset();
    let hyp = Hyp { degrees: 10.0, ..Hyp::default() };
    let mut total = 0;
    for r in recipes(hyp, 320, true, 24) {
        assert!(matches!(r.geometry.layout, Layout::Mosaic4 { .. }));
        let (slot, labels) = render(&r, &data);
        check(&r, &slot, &labels, &data);
        total += labels.len();
    }
    assert!(total > 24 * 3, "too few boxes survived: {total}");
}

#[test]
fn shear_and_perspective_boxes_stay_inside_and_enclose() {
    let data = rect_dataset();
    // Shear and perspective map a rectangle to a quadrilateral whose bounding box is the min/max of its 4
    // corners, so the boxes stay tight.
    let hyp = Hyp { shear: 4.0, perspective: 0.0003, ..Hyp::default() };
    for r in recipes(hyp, 256, true, 12) {
        let (slot, labels) = render(&r, &data);
        check(&r, &slot, &labels, &data);
    }
}

#[test]
fn letterbox_perspective_without_mosaic_and_flips() {
    let data = rect_dataset();
    let hyp = Hyp { flipud: 0.5, degrees: 5.0, ..Hyp::default() };
    let rs = recipes(hyp, 320, false, 16);
    assert!(rs.iter().any(|r| r.flip_lr) && rs.iter().any(|r| r.flip_ud) && rs.iter().any(|r| !r.flip_lr));
    for r in rs {
        assert!(matches!(r.geometry.layout, Layout::Single { .. }));
        let (slot, labels) = render(&r, &data);
        check(&r, &slot, &labels, &data);
    }
}

#[test]
fn mixup_blends_two_samples_and_keeps_both_label_sets() {
    let data = rect_dataset();
    let sampler = RecipeSampler::new(Hyp { mixup: 1.0, hsv_h: 0.0, hsv_s: 0.0, hsv_v: 0.0, ..Hyp::default() }, 4)
        .expect("sampler");
    let r = sampler.draw(1, 256, true, &mut ChaCha8Rng::seed_from_u64(3));
    let m = r.mixup.expect("mixup drawn");
    let imgs = |g: &sluice_augment::Geometry| -> Vec<&SourceImage> {
        g.layout.ids().iter().map(|&i| &data[i as usize]).collect()
    };
    let (main_imgs, mix_imgs) = (imgs(&r.geometry), imgs(&m.geometry));
    let full = TrainPlan::new(&r, &main_imgs, &mix_imgs).expect("plan");
    let alone = TrainRecipe { mixup: None, ..r };
    let partner = TrainRecipe { mixup: None, geometry: m.geometry, ..r };
    let (a, la) = render(&alone, &data);
    let (b, lb) = render(&partner, &data);
    let mut out = vec![0u8; full.slot_len()];
    full.render(&mut out).expect("render");
    for i in 0..out.len() {
        let want = (f32::from(a[i]) * m.ratio + f32::from(b[i]) * (1.0 - m.ratio)) as u8;
        assert_eq!(out[i], want, "byte {i}");
    }
    let mut labels = Vec::new();
    full.labels(|l| labels.push(l));
    assert_eq!(labels, [la, lb].concat());
}

#[test]
fn every_multiscale_size_keeps_boxes_inside_and_enclosing() {
    let data = rect_dataset();
    let (lo, hi) = multiscale_bounds(256, 0.5, 32);
    assert_eq!((lo, hi), (128, 384));
    let sizes: Vec<u32> = (lo / 32..=hi / 32).map(|k| k * 32).collect();
    let mosaic = recipes(Hyp { degrees: 10.0, ..Hyp::default() }, 256, true, sizes.len() as u64);
    let single = recipes(Hyp { flipud: 0.5, degrees: 5.0, ..Hyp::default() }, 256, false, sizes.len() as u64);
    let mut total = 0;
    for (r, &size) in mosaic.iter().chain(&single).zip(sizes.iter().cycle()) {
        let r = r.with_size(size);
        let (slot, labels) = render(&r, &data);
        assert_eq!(slot.len(), 3 * size as usize * size as usize);
        check(&r, &slot, &labels, &data);
        total += labels.len();
    }
    assert!(total > sizes.len() * 3, "too few boxes survived: {total}");
}

/// The images of [`rect_dataset`] repainted with a smooth plaid (periods of 80 and 96 source pixels): steep enough
/// that a misplaced pixel shows, smooth enough that bilinear sampling at either size agrees.
fn plaid_dataset() -> Vec<SourceImage> {
    rect_dataset()
        .into_iter()
        .map(|mut d| {
            for y in 0..d.image.height() {
                let fy = (y as f32 * std::f32::consts::TAU / 96.0).cos();
                for (x, px) in d.image.row_mut(y).chunks_exact_mut(3).enumerate() {
                    let fx = (x as f32 * std::f32::consts::TAU / 80.0).sin();
                    let v = 128.0 + 90.0 * fx * fy;
                    px.copy_from_slice(&[v as u8, (255.0 - v) as u8, (128.0 + 90.0 * fx) as u8]);
                }
            }
            d
        })
        .collect()
}

/// Channel values of `big` (side `2n`), averaged over 2x2 blocks shifted by `(dx, dy)` big pixels, that differ from
/// `base` (side `n`) by more than 8, as a fraction.
fn off_fraction(big: &[u8], base: &[u8], n: usize, (dx, dy): (usize, usize)) -> f64 {
    let m = 2 * n;
    let mut off = 0usize;
    for c in 0..3 {
        for y in 0..n - 1 {
            for x in 0..n - 1 {
                let at = |yy: usize, xx: usize| i64::from(big[c * m * m + (yy + dy) * m + xx + dx]);
                let avg =
                    (at(2 * y, 2 * x) + at(2 * y, 2 * x + 1) + at(2 * y + 1, 2 * x) + at(2 * y + 1, 2 * x + 1)) / 4;
                off += usize::from((avg - i64::from(base[c * n * n + y * n + x])).abs() > 8);
            }
        }
    }
    off as f64 / (3 * (n - 1) * (n - 1)) as f64
}

#[test]
fn another_size_is_the_imgsz_sample_resized() {
    let (data, plaid) = (rect_dataset(), plaid_dataset());
    for r in recipes(Hyp { degrees: 10.0, fliplr: 0.5, ..Hyp::default() }, 128, true, 4) {
        let (_, base_labels) = render(&r, &data);
        // Twice the size: boxes scale by 2.
        let big = r.with_size(256);
        let (_, labels) = render(&big, &data);
        assert_eq!(labels.len(), base_labels.len());
        for (a, b) in labels.iter().zip(&base_labels) {
            assert_eq!(a.class, b.class);
            for (u, v) in
                [(a.bbox.x1, b.bbox.x1), (a.bbox.y1, b.bbox.y1), (a.bbox.x2, b.bbox.x2), (a.bbox.y2, b.bbox.y2)]
            {
                assert!((u - 2.0 * v).abs() < 1e-3, "{a:?} vs 2 x {b:?}");
            }
        }
        // And each 2x2 block of pixels averages to the base pixel, everywhere but on the tile and border edges
        // (about 1%; a half-pixel error in the resize map makes it 10%, a one-pixel shift over 50%).
        let (base, _) = render(&r, &plaid);
        let (px, _) = render(&big, &plaid);
        let aligned = off_fraction(&px, &base, 128, (0, 0));
        let shifted = off_fraction(&px, &base, 128, (1, 1));
        assert!(aligned < 0.03, "{:.1}% of the 2x render, downsampled, is off the base render", aligned * 100.0);
        assert!(shifted > 10.0 * aligned, "a one-pixel shift should show: {shifted} vs {aligned}");
        // Half the size: boxes scale by 1/2 (a candidate filtered at imgsz stays filtered).
        let (_, small) = render(&r.with_size(64), &data);
        assert_eq!(small.len(), base_labels.len());
        for (a, b) in small.iter().zip(&base_labels) {
            assert!((a.bbox.x2 - 0.5 * b.bbox.x2).abs() < 1e-3 && (a.bbox.y1 - 0.5 * b.bbox.y1).abs() < 1e-3);
        }
    }
}
