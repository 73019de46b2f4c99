//! NMS per image on the reference prediction (`tests/data/nms_pred_img0.npy`, 8400 anchors x 80 classes):
//! single- and multi-label, exact per-class and Ultralytics' class-offset mode. The Ultralytics baseline on
//! the reference machine is 8.4 ms/image (single-label) and 15.9 ms/image (multi-label).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_eval::{Layout, Nms, NmsMode, NmsParams, NmsScratch, PredView};

/// Reads a little-endian float32 `.npy` file (format 1.0).
fn read_npy_f32(path: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).expect("read npy");
    let hlen = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    bytes[10 + hlen..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
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
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
