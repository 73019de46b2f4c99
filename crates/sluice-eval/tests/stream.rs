//! The streaming validator on synthetic predictions made from ground truth with noise: identical reports for
//! 1, 2 and 4 workers and any submission order, equal to NMS + `UltralyticsMetric` run sequentially, errors that
//! name the sample, and a drop in the middle of a stream that returns promptly.
#![allow(clippy::unwrap_used)]

#[path = "common/synth.rs"]
mod synth;

use std::time::{Duration, Instant};

use sluice_core::{Metric, SampleId};
use sluice_eval::{Nms, NmsParams, NmsScratch, PredView, StreamConfig, StreamReport, StreamingValidator};
use synth::SynthImage;

const NC: usize = 4;
const ANCHORS: usize = 300;

/// Runs the validator over `images` in the given order, `batch` images per submitted batch.
fn stream(images: &[&SynthImage], batch: usize, workers: usize, queue_depth: usize) -> StreamReport {
    let mut v = StreamingValidator::new(StreamConfig { workers, queue_depth, ..StreamConfig::new(NC as u32) }).unwrap();
    for chunk in images.chunks(batch) {
        let mut buf = v.buffer().unwrap();
        for im in chunk {
            buf.preds.data.extend_from_slice(&im.pred);
        }
        (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (chunk.len(), NC, ANCHORS);
        let ids: Vec<SampleId> = chunk.iter().map(|im| im.id).collect();
        let labels: Vec<_> = chunk.iter().map(|im| im.labels.clone()).collect();
        buf.set_labels(&ids, &labels).unwrap();
        v.submit(buf).unwrap();
    }
    v.finish().unwrap()
}

#[test]
fn same_report_for_any_worker_count_and_submission_order() {
    let images = synth::images(1, 100, 23, NC, ANCHORS);
    let in_order: Vec<&SynthImage> = images.iter().collect();
    let reference = stream(&in_order, 5, 1, 1);
    assert_eq!(reference.stats.images, 23);
    assert_eq!(reference.stats.batches, 5);
    for workers in [2, 4] {
        let r = stream(&in_order, 5, workers, 2);
        assert_eq!(r.metrics, reference.metrics, "{workers} workers");
        assert_eq!((r.stats.images, r.stats.detections), (reference.stats.images, reference.stats.detections));
    }
    // Shuffled images, regrouped into batches of 3.
    let mut shuffled = in_order.clone();
    let mut rng = synth::Rng::new(9);
    for i in (1..shuffled.len()).rev() {
        shuffled.swap(i, rng.below(i + 1));
    }
    assert_ne!(shuffled.iter().map(|im| im.id).collect::<Vec<_>>(), (100..123).collect::<Vec<_>>());
    for workers in [1, 4] {
        let r = stream(&shuffled, 3, workers, 1);
        assert_eq!(r.metrics, reference.metrics, "shuffled, {workers} workers");
        assert_eq!(r.stats.batches, 8);
    }
}

#[test]
fn equals_nms_and_ultralytics_metric_run_sequentially() {
    let images = synth::images(2, 0, 17, NC, ANCHORS);
    let refs: Vec<&SynthImage> = images.iter().collect();
    let streamed = stream(&refs, 4, 3, 2);

    let nms = Nms::new(NmsParams::ultralytics_val());
    let mut metric = sluice_eval::UltralyticsMetric::new(NC as u32);
    let (mut scratch, mut dets, mut n_dets) = (NmsScratch::default(), Vec::new(), 0);
    for (i, im) in images.iter().enumerate() {
        let view = PredView::new(&im.pred, NC, ANCHORS, sluice_eval::Layout::ChannelsFirst).unwrap();
        nms.run(&view, i, &mut scratch, &mut dets, None).unwrap();
        n_dets += dets.len() as u64;
        metric.update(im.id, &dets, &im.labels).unwrap();
    }
    let sequential = metric.finalize().unwrap();
    assert_eq!(streamed.metrics, sequential);
    assert_eq!(streamed.stats.detections, n_dets);
    // The data is neither trivial nor hopeless: the test would notice a broken matcher.
    let m = &sequential;
    assert!(m.map50 > 0.3 && m.map50 < 0.999 && m.map50_95 > 0.1 && m.map50_95 < m.map50, "{m:?}");
    assert_eq!(m.classes.len(), NC);
}

#[test]
fn kept_batches_equal_sequential_nms_and_change_nothing_else() {
    let images = synth::images(6, 500, 17, NC, ANCHORS);
    let refs: Vec<&SynthImage> = images.iter().collect();
    let plain = stream(&refs, 4, 3, 2);
    assert!(plain.kept.is_empty(), "keep_batches 0 keeps nothing");
    let nms = Nms::new(NmsParams::ultralytics_val());
    let mut scratch = NmsScratch::default();
    for (workers, keep) in [(1, 1), (3, 2), (4, 9)] {
        let cfg = StreamConfig { workers, queue_depth: 2, keep_batches: keep, ..StreamConfig::new(NC as u32) };
        let mut v = StreamingValidator::new(cfg).unwrap();
        for chunk in refs.chunks(4) {
            let mut buf = v.buffer().unwrap();
            for im in chunk {
                buf.preds.data.extend_from_slice(&im.pred);
            }
            (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (chunk.len(), NC, ANCHORS);
            let ids: Vec<SampleId> = chunk.iter().map(|im| im.id).collect();
            let labels: Vec<_> = chunk.iter().map(|im| im.labels.clone()).collect();
            buf.set_labels(&ids, &labels).unwrap();
            v.submit(buf).unwrap();
        }
        let r = v.finish().unwrap();
        assert_eq!((&r.metrics, &r.stats.detections), (&plain.metrics, &plain.stats.detections));
        // 17 images in batches of 4 -> 5 batches; at most that many can be kept.
        assert_eq!(r.kept.len(), keep.min(5), "{workers} workers, keep {keep}");
        let mut total = 0;
        for (i, k) in r.kept.iter().enumerate() {
            assert_eq!(k.batch, i as u64);
            let chunk = refs.chunks(4).nth(i).unwrap();
            assert_eq!(k.ids, chunk.iter().map(|im| im.id).collect::<Vec<_>>());
            assert_eq!(k.detections.len(), chunk.len());
            for (b, (im, got)) in chunk.iter().zip(&k.detections).enumerate() {
                let view = PredView::new(&im.pred, NC, ANCHORS, sluice_eval::Layout::ChannelsFirst).unwrap();
                let mut want = Vec::new();
                nms.run(&view, b, &mut scratch, &mut want, None).unwrap();
                assert_eq!(got, &want, "batch {i} image {b}");
                total += want.len();
            }
        }
        assert!(total > 0, "the kept batches hold detections");
    }
}

#[test]
fn nan_prediction_is_an_error_naming_the_sample() {
    let mut images = synth::images(3, 1000, 12, NC, ANCHORS);
    // A NaN class score of image 1007, anchor 17.
    images[7].pred[5 * ANCHORS + 17] = f32::NAN;
    let mut v =
        StreamingValidator::new(StreamConfig { workers: 2, queue_depth: 1, ..StreamConfig::new(NC as u32) }).unwrap();
    let mut first_err = None;
    for chunk in images.chunks(2) {
        let mut buf = v.buffer().unwrap();
        for im in chunk {
            buf.preds.data.extend_from_slice(&im.pred);
        }
        (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (chunk.len(), NC, ANCHORS);
        let ids: Vec<SampleId> = chunk.iter().map(|im| im.id).collect();
        let labels: Vec<_> = chunk.iter().map(|im| im.labels.clone()).collect();
        buf.set_labels(&ids, &labels).unwrap();
        if let Err(e) = v.submit(buf) {
            first_err = Some(e);
            break;
        }
    }
    let err = match first_err {
        Some(e) => e,
        None => v.finish().unwrap_err(),
    };
    let msg = err.to_string();
    assert!(msg.contains("sample 1007") && msg.contains("anchor 17, row 5"), "{msg}");
}

#[test]
fn dropping_mid_stream_stops_and_joins_promptly() {
    // Big batches so that the queue holds far more work than the drop should wait for.
    let images = synth::images(4, 0, 8, NC, ANCHORS);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let cfg = StreamConfig { workers: 2, queue_depth: 4, ..StreamConfig::new(NC as u32) };
        let mut v = StreamingValidator::new(cfg).unwrap();
        let start = Instant::now();
        for (i, b) in (0..6).enumerate() {
            let mut buf = v.buffer().unwrap();
            for k in 0..64 {
                buf.preds.data.extend_from_slice(&images[(b + k) % images.len()].pred);
            }
            (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (64, NC, ANCHORS);
            buf.ids.extend((0..64).map(|k| (i * 64 + k) as SampleId));
            v.submit(buf).unwrap();
        }
        let submitted = start.elapsed();
        let t = Instant::now();
        drop(v);
        done_tx.send((submitted, t.elapsed())).unwrap();
    });
    // A hang would fail here instead of blocking the test run.
    let (submitted, dropped) = done_rx.recv_timeout(Duration::from_secs(60)).expect("drop did not return");
    assert!(dropped < Duration::from_secs(30), "drop took {dropped:?} (submitting took {submitted:?})");
}
