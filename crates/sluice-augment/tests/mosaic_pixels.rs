//! Mosaic and random-perspective pixels against Ultralytics 8.4.190 for the same parameters. The fixture
//! (`data/mosaic_pixels.json` and `.bin`, made by `data/make_mosaic_pixels_fixture.py`, which scripts Ultralytics'
//! `random` draws) holds ten cases at imgsz 48: four source images at the training size (smooth colour waves with
//! sharp rectangles), a mosaic centre, a scale and a translation, and the image Ultralytics' `Mosaic` +
//! `RandomPerspective` return. Away from the tiles' edges Sluice's fused render must give the same pixels up to
//! the rounding of OpenCV's fixed-point `warpAffine` (coordinates in 1/32 pixel, 15-bit weights). On the edges the
//! two differ by design: Ultralytics interpolates across the seam of its composed canvas, where the fused render
//! samples one tile (or the grey border) per output pixel; the test measures that band too, so a change to it shows.

use sluice_augment::{Geometry, Layout, PerspectiveParams, TrainPlan, TrainRecipe};
use sluice_core::{ImageLabels, ImageRgb8, SourceImage};

/// Largest difference away from the edges: the fused render reproduces OpenCV's fixed-point bilinear warp
/// (coordinates on its 1/32-pixel grid, 15-bit weights), so only a final rounding may differ, by one level.
const INTERIOR_MAX: i32 = 1;
/// Mean absolute difference away from the edges: such roundings are rare (a few in a thousand values).
const INTERIOR_MEAN: f64 = 0.02;
/// What counts as a clear difference in the edge band (reported, not bounded).
const BAND_CLEAR: i32 = 8;

struct Case {
    images: Vec<SourceImage>,
    recipe: TrainRecipe,
    ultralytics: Vec<u8>,
    /// Canvas coordinates of every tile edge: x edges, y edges.
    edges: (Vec<f64>, Vec<f64>),
}

fn cases() -> (u32, Vec<Case>) {
    let meta: serde_json::Value = serde_json::from_str(include_str!("data/mosaic_pixels.json")).expect("fixture");
    let blob: &[u8] = include_bytes!("data/mosaic_pixels.bin");
    let imgsz = meta["imgsz"].as_u64().expect("imgsz") as u32;
    let n = (imgsz * imgsz * 3) as usize;
    let num = |v: &serde_json::Value| v.as_f64().expect("number");
    let cases = meta["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|case| {
            let images: Vec<SourceImage> = case["images"]
                .as_array()
                .expect("images")
                .iter()
                .map(|im| {
                    let (w, h, o) = (num(&im["w"]) as u32, num(&im["h"]) as u32, num(&im["offset"]) as usize);
                    let data = blob[o..o + (w * h * 3) as usize].to_vec();
                    SourceImage {
                        image: ImageRgb8::from_raw(w, h, (w * 3) as usize, data).expect("image"),
                        labels: ImageLabels { width: w, height: h, objects: vec![] },
                    }
                })
                .collect();
            let (xc, yc) = (num(&case["centre"][0]), num(&case["centre"][1]));
            let wh = |i: usize| (f64::from(images[i].image.width()), f64::from(images[i].image.height()));
            // The tiles' own edges and the canvas' (where a tile is cut by it).
            let c2 = 2.0 * f64::from(imgsz);
            let edges = (
                vec![xc, xc - wh(0).0, xc + wh(1).0, xc - wh(2).0, xc + wh(3).0, 0.0, c2],
                vec![yc, yc - wh(0).1, yc - wh(1).1, yc + wh(2).1, yc + wh(3).1, 0.0, c2],
            );
            let recipe = TrainRecipe {
                imgsz,
                size: imgsz,
                geometry: Geometry {
                    layout: Layout::Mosaic4 { ids: [0, 1, 2, 3], centre: (xc as i32, yc as i32) },
                    perspective: PerspectiveParams {
                        scale: num(&case["scale"]),
                        translate_x: num(&case["translate"][0]),
                        translate_y: num(&case["translate"][1]),
                        ..PerspectiveParams::CENTRED
                    },
                },
                mixup: None,
                hsv: None,
                flip_lr: false,
                flip_ud: false,
            };
            let o = num(&case["out_offset"]) as usize;
            Case { images, recipe, ultralytics: blob[o..o + n].to_vec(), edges }
        })
        .collect();
    (imgsz, cases)
}

#[test]
fn mosaic_pixels_equal_ultralytics_away_from_the_tiles_edges() {
    let (imgsz, cases) = cases();
    let s = imgsz as usize;
    let (mut interior, mut band, mut worst) = ((0usize, 0f64), (0usize, 0usize), 0);
    for (k, case) in cases.iter().enumerate() {
        let refs: Vec<&SourceImage> = case.images.iter().collect();
        let plan = TrainPlan::new(&case.recipe, &refs, &[]).expect("plan");
        let mut out = vec![0u8; plan.slot_len()];
        plan.render(&mut out).expect("render");
        let p = case.recipe.geometry.perspective;
        let side = f64::from(imgsz);
        // Ultralytics' affine for these parameters: out = scale * (canvas - imgsz) + translate * imgsz.
        let canvas = |o: usize, t: f64| (o as f64 - t * side) / p.scale + side;
        let near = |c: f64, edges: &[f64]| edges.iter().any(|e| (c - e).abs() < 1.0 + 1e-9);
        for y in 0..s {
            for x in 0..s {
                let edge =
                    near(canvas(x, p.translate_x), &case.edges.0) || near(canvas(y, p.translate_y), &case.edges.1);
                for ch in 0..3 {
                    let d = (i32::from(out[ch * s * s + y * s + x])
                        - i32::from(case.ultralytics[(y * s + x) * 3 + ch]))
                    .abs();
                    if edge {
                        band.0 += 1;
                        band.1 += usize::from(d > BAND_CLEAR);
                    } else {
                        assert!(d <= INTERIOR_MAX, "case {k}: pixel ({x}, {y}) channel {ch} differs by {d}");
                        worst = worst.max(d);
                        interior.0 += 1;
                        interior.1 += f64::from(d);
                    }
                }
            }
        }
    }
    let mean = interior.1 / interior.0 as f64;
    println!(
        "interior: {} values, mean |d| {mean:.4}, max {worst}; edge band: {} values, {} beyond {BAND_CLEAR}",
        interior.0, band.0, band.1
    );
    assert!(interior.0 > 3 * band.0, "the edge band ({}) leaves too little interior ({})", band.0, interior.0);
    assert!(mean <= INTERIOR_MEAN, "interior mean |difference| {mean:.3} > {INTERIOR_MEAN}");
}
