//! Synthetic validation data for the streaming-validator tests and benches: ground-truth boxes on a 640 x 640
//! canvas and YOLO-shaped predictions `(4 + nc, A)` made from them with noise (several jittered anchors per
//! object, some with the wrong class, plus background anchors below and above the confidence threshold).
#![allow(dead_code)]

use sluice_core::{BoxXyxy, ImageLabels, Label, SampleId};

/// splitmix64: a small deterministic generator (no dependency needed for test data).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// One synthetic image: its id, its labels and its prediction `(4 + nc, A)`, channels-first.
pub(crate) struct SynthImage {
    pub(crate) id: SampleId,
    pub(crate) labels: ImageLabels,
    pub(crate) pred: Vec<f32>,
}

/// Image `id` with `nc` classes and `anchors` anchors (at least 8 per object: up to 5 objects).
pub(crate) fn image(seed: u64, id: SampleId, nc: usize, anchors: usize) -> SynthImage {
    let mut rng = Rng::new(seed ^ id.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let rows = 4 + nc;
    let mut pred = vec![0.0f32; rows * anchors];
    let set = |pred: &mut Vec<f32>, a: usize, b: [f32; 4], scores: &[f32]| {
        for (r, v) in b.iter().chain(scores).enumerate() {
            pred[r * anchors + a] = *v;
        }
    };
    // Background: half the anchors entirely below conf 0.001, the rest with small scores.
    let mut scores = vec![0.0f32; nc];
    for a in 0..anchors {
        let b = [rng.unit() * 640.0, rng.unit() * 640.0, 4.0 + rng.unit() * 150.0, 4.0 + rng.unit() * 150.0];
        let low = rng.unit() < 0.5;
        for s in scores.iter_mut() {
            let u = rng.unit();
            *s = if low { u * 0.0009 } else { u * u * u * 0.2 };
        }
        set(&mut pred, a, b, &scores);
    }
    let n_obj = 1 + rng.below(5);
    let mut objects = Vec::with_capacity(n_obj);
    for _ in 0..n_obj {
        let class = rng.below(nc) as u32;
        let (w, h) = (10.0 + rng.unit() * 190.0, 10.0 + rng.unit() * 190.0);
        let (cx, cy) = (w / 2.0 + rng.unit() * (640.0 - w), h / 2.0 + rng.unit() * (640.0 - h));
        objects.push(Label { class, bbox: BoxXyxy::new(cx - w / 2.0, cy - h / 2.0, cx + w / 2.0, cy + h / 2.0) });
        // Six noisy detections of the object; one in ten with a wrong class.
        for _ in 0..6 {
            let a = rng.below(anchors);
            let j = |rng: &mut Rng| rng.unit() * 2.0 - 1.0;
            let b = [
                cx + j(&mut rng) * 0.12 * w,
                cy + j(&mut rng) * 0.12 * h,
                w * (1.0 + 0.2 * j(&mut rng)),
                h * (1.0 + 0.2 * j(&mut rng)),
            ];
            for s in scores.iter_mut() {
                *s = rng.unit() * 0.05;
            }
            let c = if rng.unit() < 0.1 { rng.below(nc) } else { class as usize };
            scores[c] = 0.2 + 0.8 * rng.unit();
            set(&mut pred, a, b, &scores);
        }
    }
    SynthImage { id, labels: ImageLabels { width: 640, height: 640, objects }, pred }
}

/// `n` images with ids `first_id..first_id + n`.
pub(crate) fn images(seed: u64, first_id: SampleId, n: usize, nc: usize, anchors: usize) -> Vec<SynthImage> {
    (0..n as u64).map(|i| image(seed, first_id + i, nc, anchors)).collect()
}
