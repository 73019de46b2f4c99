//! COCO bbox evaluation (evaluate + accumulate + summarize, from parsed JSON) on the reference set replicated
//! x40 (5120 images, ~55k detections, image id = k * 1_000_000 + id) single-threaded and with 2 threads, as
//! `m6_coco_eval.py time base` does for pycocotools (16.6 s) and faster-coco-eval (1.9 s) on the reference
//! machine. Also the per-image streaming update of the 128-image set.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_eval::{CocoAccumulator, CocoDataset, CocoParams, Detections, DtBox, GtBox, coco_evaluate};

fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn replicate(gt: &CocoDataset, dt: &Detections, k: i64) -> (CocoDataset, Detections) {
    let mut g = CocoDataset { categories: gt.categories.clone(), ..CocoDataset::default() };
    let mut d = Detections::default();
    let mut next_id = 1;
    for r in 0..k {
        let off = r * 1_000_000;
        g.images.extend(gt.images.iter().map(|im| sluice_eval::coco::CocoImage { id: im.id + off, ..im.clone() }));
        for (img, a) in &gt.annotations {
            g.annotations.push((img + off, GtBox { id: next_id, ..*a }));
            next_id += 1;
        }
        d.dets.extend(dt.dets.iter().map(|(img, b)| (img + off, *b)));
    }
    (g, d)
}

fn bench(c: &mut Criterion) {
    let gt = CocoDataset::from_path(data("coco128train_gt.json")).expect("gt");
    let dt = Detections::from_path(data("coco128train_dets_seed1.json"), &gt).expect("dets");
    let (g40, d40) = replicate(&gt, &dt, 40);
    let params = CocoParams::default();
    let mut grp = c.benchmark_group("coco_eval_x40");
    grp.sample_size(10);
    grp.throughput(Throughput::Elements(g40.images.len() as u64));
    for threads in [1usize, 2] {
        grp.bench_function(format!("cpu/threads{threads}"), |b| {
            b.iter(|| coco_evaluate(&g40, &d40, &params, threads).expect("eval").stats[0])
        });
    }
    grp.finish();

    // Streaming: one update per image (what a post-process worker does per validated image).
    let mut per_img: std::collections::BTreeMap<i64, (Vec<GtBox>, Vec<DtBox>)> = Default::default();
    for im in &gt.images {
        per_img.entry(im.id).or_default();
    }
    for (img, a) in &gt.annotations {
        per_img.entry(*img).or_default().0.push(*a);
    }
    for (img, d) in &dt.dets {
        per_img.entry(*img).or_default().1.push(*d);
    }
    let cats: Vec<i64> = gt.categories.iter().map(|c| c.id).collect();
    let mut grp = c.benchmark_group("coco_streaming_update");
    grp.throughput(Throughput::Elements(per_img.len() as u64));
    grp.bench_function("cpu/128_images_add_image", |b| {
        b.iter(|| {
            let mut acc = CocoAccumulator::new(params.clone(), &cats).expect("acc");
            for (id, (g, d)) in &per_img {
                acc.add_image(*id, g, d).expect("add");
            }
            acc.num_images()
        })
    });
    grp.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
