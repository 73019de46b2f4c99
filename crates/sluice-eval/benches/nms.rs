//! NMS per image on the reference prediction (`tests/data/nms_pred_img0.npy`, 8400 anchors x 80 classes):
//! single- and multi-label, exact per-class and Ultralytics' class-offset mode, and the device NMS's host twin
//! (`masknms`). Results beside Ultralytics' own time per image: `docs/bench-results.md`.
//!
//! In-run baseline (`baseline_torchvision_kernel`): the same candidates through a direct port of torchvision's
//! CPU `nms` kernel (class-offset boxes, every kept box suppresses every later box, no early exit), i.e. what
//! Ultralytics runs after its tensor filtering; the ratio of the two is printed by criterion side by side.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_eval::{Layout, MaskNms, MaskScratch, Nms, NmsMode, NmsParams, NmsScratch, PredView};

/// Reads a little-endian float32 `.npy` file (format 1.0).
fn read_npy_f32(path: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).expect("read npy");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// torchvision's CPU `nms` kernel on class-offset candidates (stable descending sort, suppression matrix
/// walk), after the candidate filtering of `non_max_suppression` done naively per anchor.
fn baseline_torchvision_kernel(data: &[f32], multi_label: bool) -> usize {
    let (na, nc) = (8400usize, 80usize);
    let mut boxes: Vec<[f32; 4]> = Vec::new();
    let mut scores: Vec<f32> = Vec::new();
    for a in 0..na {
        let cls: Vec<f32> = (0..nc).map(|c| data[(4 + c) * na + a]).collect();
        let best = cls.iter().copied().fold(f32::MIN, f32::max);
        if best <= 0.001 {
            continue;
        }
        let (cx, cy, w, h) = (data[a], data[na + a], data[2 * na + a], data[3 * na + a]);
        for (c, &s) in cls.iter().enumerate() {
            let take = if multi_label { s > 0.001 } else { s == best };
            if take {
                let off = c as f32 * 7680.0;
                boxes.push([cx - w / 2.0 + off, cy - h / 2.0 + off, cx + w / 2.0 + off, cy + h / 2.0 + off]);
                scores.push(s);
                if !multi_label {
                    break;
                }
            }
        }
    }
    let n = boxes.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&i, &j| scores[j].total_cmp(&scores[i]));
    let areas: Vec<f32> = boxes.iter().map(|b| (b[2] - b[0]) * (b[3] - b[1])).collect();
    let mut suppressed = vec![false; n];
    let mut keep = Vec::new();
    for ii in 0..n {
        let i = order[ii];
        if suppressed[i] {
            continue;
        }
        keep.push(i);
        for &j in &order[ii + 1..] {
            if suppressed[j] {
                continue;
            }
            let (bi, bj) = (&boxes[i], &boxes[j]);
            let w = (bi[2].min(bj[2]) - bi[0].max(bj[0])).max(0.0);
            let h = (bi[3].min(bj[3]) - bi[1].max(bj[1])).max(0.0);
            let inter = w * h;
            if f64::from(inter / (areas[i] + areas[j] - inter)) > 0.7 {
                suppressed[j] = true;
            }
        }
    }
    keep.truncate(300);
    keep.len()
}

fn bench(c: &mut Criterion) {
    let data = read_npy_f32(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/nms_pred_img0.npy"));
    let view = PredView::new(&data, 80, 8400, Layout::ChannelsFirst).expect("view");
    let mut g = c.benchmark_group("nms_per_image");
    g.throughput(Throughput::Elements(1));
    for (name, multi_label, mode) in [
        ("single_exact", false, NmsMode::Exact),
        ("single_offset", false, NmsMode::ClassOffset { max_wh: 7680.0 }),
        ("multi_exact", true, NmsMode::Exact),
        ("multi_offset", true, NmsMode::ClassOffset { max_wh: 7680.0 }),
    ] {
        let nms = Nms::new(NmsParams { multi_label, mode, ..NmsParams::default() });
        let mut scratch = NmsScratch::default();
        let mut out = Vec::new();
        g.bench_function(format!("cpu/{name}"), |b| {
            b.iter(|| {
                nms.run(&view, 0, &mut scratch, &mut out, None).expect("nms");
                out.len()
            })
        });
    }
    // The device algorithm's host twin (`masknms`: keys, sort, overlap masks, greedy keep) on the same input, the
    // Ultralytics validation setting: what the CUDA kernels compute, timed on the host.
    for (name, multi_label) in [("single_offset", false), ("multi_offset", true)] {
        let params = NmsParams { multi_label, mode: NmsMode::ClassOffset { max_wh: 7680.0 }, ..NmsParams::default() };
        let nms = MaskNms::new(params);
        let mut scratch = MaskScratch::default();
        let mut out = Vec::new();
        g.bench_function(format!("cpu/masknms_twin_{name}"), |b| {
            b.iter(|| {
                nms.run(&view, 0, &mut scratch, &mut out, None).expect("masknms");
                out.len()
            })
        });
    }
    for (name, multi) in [("single", false), ("multi", true)] {
        g.bench_function(format!("cpu/baseline_torchvision_kernel_{name}"), |b| {
            b.iter(|| baseline_torchvision_kernel(&data, multi))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
