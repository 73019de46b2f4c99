//! The `Augment` stage implementations against an in-memory image source: slots and targets land in the batch,
//! validation boxes map back to the source exactly, and bad input is an error that names the sample.

mod common;

use common::{MemSource, chw_pixel, is_colour, rect_dataset};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use sluice_augment::{FILL, Hyp, RecipeSampler, RectPlan, TrainAugment, ValLetterbox, ValRecipe, ValTransform};
use sluice_core::{Augment, Batch, BatchShape};

#[test]
fn val_letterbox_fills_rect_batches_and_boxes_round_trip() {
    let data = rect_dataset();
    let sizes: Vec<(u32, u32)> = data.iter().map(|d| (d.image.width(), d.image.height())).collect();
    let source = MemSource::new(data.clone());
    let plan = RectPlan::new(&sizes, 2, 320, 32, 0.5);
    for b in 0..plan.len() {
        let (cw, ch) = plan.shapes[b];
        let mut batch = Batch::new(BatchShape::rgb(2, ch as usize, cw as usize), 8);
        for &i in plan.batch(b) {
            ValLetterbox
                .apply(&ValRecipe { id: i as u64, imgsz: 320, canvas: (cw, ch) }, &source, &mut batch)
                .expect("apply");
        }
        for (k, &i) in plan.batch(b).iter().enumerate() {
            let src = &data[i];
            let t = ValTransform::new(src.image.width(), src.image.height(), 320, (cw, ch));
            let targets = batch.targets_of(k as u32);
            assert_eq!(targets.len(), src.labels.objects.len());
            for (tg, obj) in targets.iter().zip(&src.labels.objects) {
                assert_eq!(tg.class, obj.class);
                let back = t.unmap_box(&tg.bbox);
                for (a, b) in
                    [(back.x1, obj.bbox.x1), (back.y1, obj.bbox.y1), (back.x2, obj.bbox.x2), (back.y2, obj.bbox.y2)]
                {
                    assert!((a - b).abs() < 1e-3, "round trip {a} vs {b}");
                }
                // The object's colour sits at its mapped box centre; the padding is grey.
                let [cx, cy, _, _] = tg.bbox.to_cxcywh();
                let px = chw_pixel(batch.slot(k), cw as usize, ch as usize, cx as usize, cy as usize);
                assert!(is_colour(px, tg.class), "class {} centre pixel {px:?}", tg.class);
            }
            let lb = t.letterbox;
            if lb.pad[1] > 0 {
                assert_eq!(chw_pixel(batch.slot(k), cw as usize, ch as usize, 0, 0), [FILL; 3]);
            }
        }
    }
}

#[test]
fn errors_name_the_sample() {
    let source = MemSource::new(rect_dataset());
    // Wrong canvas for the batch.
    let mut batch = Batch::new(BatchShape::rgb(1, 64, 64), 4);
    let err = ValLetterbox.apply(&ValRecipe { id: 2, imgsz: 320, canvas: (320, 320) }, &source, &mut batch);
    let msg = err.expect_err("shape mismatch").to_string();
    assert!(msg.contains("sample 2"), "{msg}");
    // Missing image.
    let sampler = RecipeSampler::new(Hyp::default(), 4).expect("sampler");
    let mut recipe = sampler.draw(1, 64, false, &mut ChaCha8Rng::seed_from_u64(0));
    recipe.geometry.layout = sluice_augment::Layout::Single { id: 99 };
    let msg = TrainAugment.apply(&recipe, &source, &mut batch).expect_err("missing").to_string();
    assert!(msg.contains("sample 99"), "{msg}");
    // Full batch.
    let recipe = sampler.draw(1, 64, true, &mut ChaCha8Rng::seed_from_u64(0));
    TrainAugment.apply(&recipe, &source, &mut batch).expect("first slot");
    let msg = TrainAugment.apply(&recipe, &source, &mut batch).expect_err("full").to_string();
    assert!(msg.contains("sample 1") && msg.contains("full"), "{msg}");
    assert_eq!(batch.len(), 1);
}
