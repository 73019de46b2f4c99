//! COCO bbox evaluation (evaluate + accumulate + summarize, from parsed JSON) on the reference set replicated
//! x40 (5120 images, ~55k detections, image id = k * 1_000_000 + id) single-threaded and with 2 threads: the
//! workload the peers' `m6_coco_eval.py time base` runs through pycocotools and faster-coco-eval.
//! `coco_eval_hard_x40` pads every image to 100 detections first (512k detections; a deterministic stand-in for
//! `m6_coco_eval.pad_dets`: half near-duplicates of a GT box, half random boxes, scores < 0.5). Also the
//! per-image streaming update of the 128-image set. Results beside the peers' times: `docs/bench-results.md`.

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

/// A small deterministic generator (SplitMix64) for the padding.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Pads every image of `gt` to 100 detections.
fn pad_to_100(gt: &CocoDataset, dt: &Detections) -> Detections {
    let mut rng = Rng(1);
    let mut out = dt.clone();
    for im in &gt.images {
        let (w, h) = (im.width.unwrap_or(640.0), im.height.unwrap_or(480.0));
        let mine: Vec<&GtBox> = gt.annotations.iter().filter(|(i, _)| *i == im.id).map(|(_, a)| a).collect();
        let have = dt.dets.iter().filter(|(i, _)| *i == im.id).count();
        for _ in have..100 {
            let cat = 1 + (rng.next() * 80.0) as i64;
            let bbox = if !mine.is_empty() && rng.next() < 0.5 {
                let a = mine[(rng.next() * mine.len() as f64) as usize];
                let j = |s: f64, r: &mut Rng| (r.next() - 0.5) * 0.3 * s;
                let [x, y, bw, bh] = a.bbox;
                [x + j(bw, &mut rng), y + j(bh, &mut rng), bw * (1.0 + j(1.0, &mut rng)), bh * (1.0 + j(1.0, &mut rng))]
            } else {
                let (bw, bh) = ((0.01 + 0.59 * rng.next()) * w, (0.01 + 0.59 * rng.next()) * h);
                [rng.next() * (w - bw), rng.next() * (h - bh), bw, bh]
            };
            let category_id = if rng.next() < 0.5 && !mine.is_empty() { mine[0].category_id } else { cat };
            out.dets.push((im.id, DtBox { category_id, bbox, score: 0.5 * rng.next() }));
        }
    }
    out
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

    let hard = pad_to_100(&gt, &dt);
    let (h40, hd40) = replicate(&gt, &hard, 40);
    let mut grp = c.benchmark_group("coco_eval_hard_x40");
    grp.sample_size(10);
    grp.throughput(Throughput::Elements(h40.images.len() as u64));
    for threads in [1usize, 2] {
        grp.bench_function(format!("cpu/threads{threads}"), |b| {
            b.iter(|| coco_evaluate(&h40, &hd40, &params, threads).expect("eval").stats[0])
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
