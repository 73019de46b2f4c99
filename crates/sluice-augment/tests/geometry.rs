//! Geometry of the fused sampler: after mosaic + perspective + flips, every box lies inside the image and
//! tightly encloses the pixels of its object (filled rectangles of unique colours), and every object that is
//! visible in the output (beyond what Ultralytics' box-candidate filter may drop) has a box.

mod common;

use common::{COLOURS, chw_pixel, is_colour, rect_dataset};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sluice_augment::{Hyp, Layout, RecipeSampler, TrainPlan, TrainRecipe};
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
    let n = recipe.imgsz as usize;
    let s = recipe.geometry.perspective.scale as f32;
    for l in labels {
        let b = l.bbox;
        assert!(b.x1 >= 0.0 && b.y1 >= 0.0 && b.x2 <= n as f32 && b.y2 <= n as f32, "box outside: {b:?}");
        assert!(b.x2 - b.x1 > 2.0 && b.y2 - b.y1 > 2.0, "degenerate box {b:?}");
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
        let inside = px1 >= b.x1 - TOL && py1 >= b.y1 - TOL && px2 <= b.x2 + TOL && py2 <= b.y2 + TOL;
        assert!(inside, "class {} pixels ({px1}, {py1}, {px2}, {py2}) outside box {b:?} (recipe {recipe:?})", l.class);
        // Tightness, for boxes away from the image border: a box clipped at the border comes from corners that
        // left the image, and Ultralytics' min/max of the rotated corners is then looser than the visible part.
        let interior = b.x1 >= 1.0 && b.y1 >= 1.0 && b.x2 <= n as f32 - 1.0 && b.y2 <= n as f32 - 1.0;
        if interior {
            for (edge, want, got) in [("x1", b.x1, px1), ("y1", b.y1, py1), ("x2", b.x2, px2), ("y2", b.y2, py2)] {
                assert!((want - got).abs() <= TOL, "class {} {edge}: box {want} vs pixels {got} ({recipe:?})", l.class);
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
                        && xf >= l.bbox.x1 - TOL
                        && xf <= l.bbox.x2 + TOL
                        && yf >= l.bbox.y1 - TOL
                        && yf <= l.bbox.y2 + TOL
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
        // The object's size in its tile: tiles are the image resized to a long side of imgsz.
        let k = recipe.imgsz as f32 / img.image.width().max(img.image.height()) as f32 * s;
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
