//! Mosaic and random-perspective labels against Ultralytics 8.4.190 for the same parameters. The fixture
//! (`data/mosaic_fixture.json`, made by `data/make_mosaic_fixture.py`, which scripts Ultralytics' `random` draws)
//! holds 300 cases: four source images with random boxes (many running to their image's edge), a mosaic centre, a
//! scale and a translation, and the boxes Ultralytics' `Mosaic` + `RandomPerspective` return at imgsz 64. Sluice's
//! recipe with the same layout and parameters must return the same boxes, in the same order, with the same classes.

use sluice_augment::{Geometry, Layout, PerspectiveParams, TrainPlan, TrainRecipe};
use sluice_core::{BoxXyxy, ImageLabels, ImageRgb8, Label, SourceImage};

/// Pixels: Ultralytics computes the boxes in float32.
const TOL: f32 = 2e-3;

fn source(im: &serde_json::Value) -> SourceImage {
    let (w, h) = (im["w"].as_u64().expect("w") as u32, im["h"].as_u64().expect("h") as u32);
    let objects = im["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| {
            let v: Vec<f64> = l.as_array().expect("label").iter().map(|x| x.as_f64().expect("number")).collect();
            let (cx, cy, bw, bh) = (v[1] * f64::from(w), v[2] * f64::from(h), v[3] * f64::from(w), v[4] * f64::from(h));
            let bbox = BoxXyxy::new(
                (cx - bw / 2.0) as f32,
                (cy - bh / 2.0) as f32,
                (cx + bw / 2.0) as f32,
                (cy + bh / 2.0) as f32,
            );
            Label { class: v[0] as u32, bbox }
        })
        .collect();
    SourceImage { image: ImageRgb8::new(w, h), labels: ImageLabels { width: w, height: h, objects } }
}

#[test]
fn mosaic_and_perspective_labels_equal_ultralytics() {
    let text = include_str!("data/mosaic_fixture.json");
    let fixture: serde_json::Value = serde_json::from_str(text).expect("fixture");
    let imgsz = fixture["imgsz"].as_u64().expect("imgsz") as u32;
    let mut boxes = 0;
    for (k, case) in fixture["cases"].as_array().expect("cases").iter().enumerate() {
        let images: Vec<SourceImage> = case["images"].as_array().expect("images").iter().map(source).collect();
        let refs: Vec<&SourceImage> = images.iter().collect();
        let c = &case["centre"];
        let t = &case["translate"];
        let recipe = TrainRecipe {
            imgsz,
            size: imgsz,
            geometry: Geometry {
                layout: Layout::Mosaic4 {
                    ids: [0, 1, 2, 3],
                    centre: (c[0].as_i64().expect("x") as i32, c[1].as_i64().expect("y") as i32),
                },
                perspective: PerspectiveParams {
                    scale: case["scale"].as_f64().expect("scale"),
                    translate_x: t[0].as_f64().expect("tx"),
                    translate_y: t[1].as_f64().expect("ty"),
                    ..PerspectiveParams::CENTRED
                },
            },
            mixup: None,
            hsv: None,
            flip_lr: false,
            flip_ud: false,
        };
        let plan = TrainPlan::new(&recipe, &refs, &[]).expect("plan");
        let mut got = Vec::new();
        plan.labels(|l| got.push(l));
        let want: Vec<Vec<f64>> = case["out"]
            .as_array()
            .expect("out")
            .iter()
            .map(|b| b.as_array().expect("box").iter().map(|x| x.as_f64().expect("number")).collect())
            .collect();
        let show = |g: &[Label]| g.iter().map(|l| (l.class, l.bbox)).collect::<Vec<_>>();
        assert_eq!(got.len(), want.len(), "case {k}: sluice {:?}\nultralytics {want:?}", show(&got));
        for (g, w) in got.iter().zip(&want) {
            let b = [g.bbox.x1, g.bbox.y1, g.bbox.x2, g.bbox.y2];
            let close = b.iter().zip(&w[1..]).all(|(a, e)| (a - *e as f32).abs() <= TOL);
            assert!(g.class == w[0] as u32 && close, "case {k}: sluice {:?}\nultralytics {want:?}", show(&got));
        }
        boxes += got.len();
    }
    assert!(boxes > 1000, "the fixture exercises too few boxes ({boxes})");
}
