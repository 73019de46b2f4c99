//! The device-side shrink step (candle CPU backend): NMS on the shrunk buffer returns exactly what it returns on
//! the full head output (synthetic batches and the Ultralytics reference prediction), the streaming validator
//! gives the same report either way, and truncation and NaNs in dropped anchors are reported.
#![cfg(feature = "candle")]
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/synth.rs"]
mod synth;

use candle_core::{Device, Tensor};
use sluice_core::{Detection, SampleId, Target};
use sluice_eval::{
    Layout, Nms, NmsParams, NmsScratch, PredView, ShrinkParams, Shrunk, StreamConfig, StreamReport, StreamingValidator,
    ValBatch, ValOutput, shrink,
};

const NC: usize = 4;
const ANCHORS: usize = 300;

/// NMS of every image of a host batch: (detections, anchor index in the full output) per image.
fn nms_all(v: &ValBatch) -> Vec<(Vec<Detection>, Vec<usize>)> {
    let nms = Nms::new(NmsParams::ultralytics_val());
    let mut scratch = NmsScratch::default();
    (0..v.preds.batch)
        .map(|b| {
            let (mut dets, mut idx) = (Vec::new(), Vec::new());
            nms.run(&v.preds.image(b).unwrap(), b, &mut scratch, &mut dets, Some(&mut idx)).unwrap();
            if !v.anchor_index.is_empty() {
                let k = v.preds.num_anchors;
                idx = idx.iter().map(|&a| v.anchor_index[b * k + a] as usize).collect();
            }
            (dets, idx)
        })
        .collect()
}

fn full_batch(data: &[f32], b: usize, nc: usize, a: usize) -> ValBatch {
    let mut v = ValBatch::default();
    v.preds.data.extend_from_slice(data);
    (v.preds.batch, v.preds.num_classes, v.preds.num_anchors, v.preds.layout) = (b, nc, a, Layout::ChannelsFirst);
    v
}

fn synth_tensor(images: &[synth::SynthImage]) -> (Vec<f32>, Tensor) {
    let data: Vec<f32> = images.iter().flat_map(|im| im.pred.iter().copied()).collect();
    let t = Tensor::from_vec(data.clone(), (images.len(), 4 + NC, ANCHORS), &Device::Cpu).unwrap();
    (data, t)
}

/// How a batch's output reaches the validator: copied straight into its pooled buffer (the CPU loop) or packed into
/// one tensor whose host copy is unpacked (a device loop's readback).
#[derive(Debug, Clone, Copy)]
enum Route {
    OnHost,
    Packed,
}

/// `shrunk` submitted as the validation loop does, by `route`.
fn submit_shrunk<P, M>(
    v: &mut StreamingValidator<P, M>,
    shrunk: Shrunk,
    ids: &[SampleId],
    targets: &[Target],
    route: Route,
) -> sluice_eval::Result<()> {
    let out = ValOutput::Shrunk(shrunk);
    match route {
        Route::OnHost => v.submit_on_host(&out, ids, targets),
        Route::Packed => {
            let (packed, dims) = out.pack()?;
            v.submit_output(&packed.to_vec1::<f32>().unwrap(), dims, ids, targets)
        }
    }
}

#[test]
fn nms_on_the_shrunk_buffer_equals_nms_on_the_full_one() {
    let images = synth::images(5, 0, 6, NC, ANCHORS);
    let (data, y) = synth_tensor(&images);
    let full = nms_all(&full_batch(&data, 6, NC, ANCHORS));
    for p in [ShrinkParams::default(), ShrinkParams { top_k: 200, fit: false, ..ShrinkParams::default() }] {
        let s = shrink(&y, &p).unwrap();
        let mut v = ValBatch::default();
        s.copy_into(&mut v).unwrap();
        let counts = v.above_conf.clone();
        // Half of the background anchors are below conf: the buffer really is smaller, and nothing was cut.
        assert!(v.preds.num_anchors < ANCHORS && counts.iter().all(|&n| n as usize <= v.preds.num_anchors), "{p:?}");
        assert!(v.all_finite.iter().all(|&f| f));
        assert_eq!(nms_all(&v), full, "{p:?}");
    }
    // A top_k below the counts cuts images, and the counts say so.
    let s = shrink(&y, &ShrinkParams { top_k: 50, fit: false, ..ShrinkParams::default() }).unwrap();
    let mut v = ValBatch::default();
    s.copy_into(&mut v).unwrap();
    assert_eq!(v.preds.num_anchors, 50);
    assert!(v.above_conf.iter().all(|&n| n > 50));
}

#[test]
fn detections_kept_through_the_shrunk_output_equal_nms_on_the_full_output() {
    let images = synth::images(8, 40, 10, NC, ANCHORS);
    let cfg = StreamConfig { workers: 2, keep_batches: 1, ..StreamConfig::new(NC as u32) };
    let mut v = StreamingValidator::new(cfg).unwrap();
    let mut batch0 = Vec::new();
    for chunk in images.chunks(4) {
        let (data, y) = synth_tensor(chunk);
        if batch0.is_empty() {
            batch0 = nms_all(&full_batch(&data, chunk.len(), NC, ANCHORS)).into_iter().map(|(d, _)| d).collect();
        }
        let ids: Vec<SampleId> = chunk.iter().map(|im| im.id).collect();
        submit_shrunk(&mut v, shrink(&y, &ShrinkParams::default()).unwrap(), &ids, &[], Route::OnHost).unwrap();
    }
    let r = v.finish().unwrap();
    assert_eq!(r.kept.len(), 1);
    assert_eq!((r.kept[0].batch, &r.kept[0].ids), (0, &vec![40, 41, 42, 43]));
    assert_eq!(r.kept[0].detections, batch0);
    assert!(batch0.iter().any(|d| !d.is_empty()));
}

#[test]
fn shrunk_reference_prediction_gives_ultralytics_detections() {
    let npy = common::read_npy("nms_pred_img0.npy");
    let data = npy.f32();
    let y = Tensor::from_vec(data.clone(), (1, 84, 8400), &Device::Cpu).unwrap();
    let s = shrink(&y, &ShrinkParams::default()).unwrap();
    let mut v = ValBatch::default();
    s.copy_into(&mut v).unwrap();
    // nms_ref_img0.json: 3203 anchors have a best class score above 0.001; k is that rounded up to 32.
    assert_eq!((v.above_conf[0], v.preds.num_anchors), (3203, 3232));
    let shrunk = nms_all(&v);
    assert_eq!(shrunk, nms_all(&full_batch(&data, 1, 80, 8400)));
    // And both are Ultralytics' rows (DetectionValidator: multi-label, class offset).
    let want: Vec<usize> = common::read_npy("nms_ref_img0_multi_idx.npy").i64().iter().map(|&i| i as usize).collect();
    assert_eq!(shrunk[0].1, want);
    let _ = PredView::new(&v.preds.data, 80, 3232, Layout::ChannelsFirst).unwrap();
}

fn run_stream(images: &[synth::SynthImage], shrunk: Option<(ShrinkParams, Route)>) -> StreamReport {
    let mut v = StreamingValidator::new(StreamConfig { workers: 2, ..StreamConfig::new(NC as u32) }).unwrap();
    for chunk in images.chunks(4) {
        let ids: Vec<SampleId> = chunk.iter().map(|im| im.id).collect();
        let targets: Vec<Target> = chunk
            .iter()
            .enumerate()
            .flat_map(|(b, im)| {
                im.labels.objects.iter().map(move |o| Target { image: b as u32, class: o.class, bbox: o.bbox })
            })
            .collect();
        let (data, y) = synth_tensor(chunk);
        match shrunk {
            Some((p, route)) => submit_shrunk(&mut v, shrink(&y, &p).unwrap(), &ids, &targets, route).unwrap(),
            None => {
                let mut buf = v.buffer().unwrap();
                *buf = full_batch(&data, chunk.len(), NC, ANCHORS);
                buf.ids = ids;
                buf.targets = targets;
                v.submit(buf).unwrap();
            }
        }
    }
    v.finish().unwrap()
}

#[test]
fn stream_report_is_the_same_with_and_without_the_shrink_step() {
    let images = synth::images(6, 500, 10, NC, ANCHORS);
    let full = run_stream(&images, None);
    for route in [Route::OnHost, Route::Packed] {
        let shrunk = run_stream(&images, Some((ShrinkParams::default(), route)));
        assert_eq!(shrunk.metrics, full.metrics, "{route:?}");
        assert_eq!((shrunk.stats.detections, shrunk.stats.truncated_images), (full.stats.detections, 0), "{route:?}");
    }
    let cut =
        run_stream(&images, Some((ShrinkParams { top_k: 40, fit: false, ..ShrinkParams::default() }, Route::Packed)));
    assert_eq!(cut.stats.truncated_images, 10);
    assert!(cut.stats.summary().contains("10 images cut by top_k"));
}

#[test]
fn nan_in_a_dropped_anchor_is_still_an_error_naming_the_sample() {
    let mut images = synth::images(7, 70, 4, NC, ANCHORS);
    // Find a background anchor of image 72 that is entirely below conf, and put a NaN into its box.
    let im = &mut images[2];
    let a = (0..ANCHORS).find(|&a| (4..4 + NC).all(|r| im.pred[r * ANCHORS + a] <= 0.001)).unwrap();
    im.pred[2 * ANCHORS + a] = f32::NAN;
    let (_, y) = synth_tensor(&images);
    let s = shrink(&y, &ShrinkParams::default()).unwrap();
    let mut v = StreamingValidator::new(StreamConfig { workers: 1, ..StreamConfig::new(NC as u32) }).unwrap();
    let ids: Vec<SampleId> = images.iter().map(|im| im.id).collect();
    let err = match submit_shrunk(&mut v, s, &ids, &[], Route::OnHost) {
        Err(e) => e,
        Ok(()) => v.finish().unwrap_err(),
    };
    let msg = err.to_string();
    assert!(msg.starts_with("sample 72: ") && msg.contains("NaN or infinite"), "{msg}");
}
