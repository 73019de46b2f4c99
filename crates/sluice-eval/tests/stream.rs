//! The streaming validator on synthetic predictions made from ground truth with noise: identical reports for
//! 1, 2 and 4 workers and any submission order, equal to NMS + `UltralyticsMetric` run sequentially, other
//! post-process and metric stages through the `sluice-core` traits, errors that name the sample, and a drop in
//! the middle of a stream that returns promptly.
#![allow(clippy::unwrap_used)]

#[path = "common/synth.rs"]
mod synth;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use sluice_core::{Detection, ImageLabels, MergeMetric, Metric, PostProcess, SampleId};
use sluice_eval::{
    CocoMetric, Nms, NmsMode, NmsParams, NmsScratch, PredBatch, PredView, StreamConfig, StreamReport,
    StreamingValidator,
};
use synth::SynthImage;

const NC: usize = 4;
const ANCHORS: usize = 300;

/// Runs the validator over `images` in the given order, `batch` images per submitted batch.
fn stream(images: &[&SynthImage], batch: usize, workers: usize, queue_depth: usize) -> StreamReport {
    let v = StreamingValidator::new(StreamConfig { workers, queue_depth, ..StreamConfig::new(NC as u32) }).unwrap();
    run(v, images, batch)
}

/// Submits `images` to `v`, `batch` images per submitted batch, and finishes.
fn run<P, M>(mut v: StreamingValidator<P, M>, images: &[&SynthImage], batch: usize) -> StreamReport<M::Report>
where
    P: PostProcess<Input = PredBatch> + 'static,
    M: MergeMetric + 'static,
{
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

/// A metric that records which images arrive and what they carry: every image must arrive exactly once, in one
/// worker's part, so a duplicate is an error in `update` and in `merge`.
#[derive(Debug, Default)]
struct Census {
    ids: BTreeSet<SampleId>,
    detections: u64,
    objects: u64,
}

impl Metric for Census {
    type Report = (Vec<SampleId>, u64, u64);

    fn update(&mut self, id: SampleId, detections: &[Detection], truth: &ImageLabels) -> sluice_core::Result<()> {
        if !self.ids.insert(id) {
            return Err(sluice_core::Error::other(format!("image {id} arrived twice")));
        }
        self.detections += detections.len() as u64;
        self.objects += truth.objects.len() as u64;
        Ok(())
    }

    fn finalize(&mut self) -> sluice_core::Result<Self::Report> {
        Ok((self.ids.iter().copied().collect(), self.detections, self.objects))
    }
}

impl MergeMetric for Census {
    fn merge(&mut self, other: Census) -> sluice_core::Result<()> {
        for id in other.ids {
            if !self.ids.insert(id) {
                return Err(sluice_core::Error::other(format!("image {id} is in two parts")));
            }
        }
        self.detections += other.detections;
        self.objects += other.objects;
        Ok(())
    }
}

#[test]
fn other_post_process_and_metric_run_through_the_stage_traits() {
    let images = synth::images(8, 300, 23, NC, ANCHORS);
    let refs: Vec<&SynthImage> = images.iter().collect();
    // Exact per-class, single-label NMS with at most 5 boxes per image: not what `StreamConfig::nms` (Ultralytics'
    // class-offset, multi-label, 300 boxes) asks for, so a validator that ignored the stage would count more.
    let exact = Nms::new(NmsParams { mode: NmsMode::Exact, multi_label: false, max_det: 5, ..NmsParams::default() });
    let (mut scratch, mut dets) = (NmsScratch::default(), Vec::new());
    let (mut coco, mut n_dets, mut n_default) = (CocoMetric::new(NC as u32).unwrap(), 0, 0);
    for (i, im) in images.iter().enumerate() {
        let view = PredView::new(&im.pred, NC, ANCHORS, sluice_eval::Layout::ChannelsFirst).unwrap();
        Nms::new(NmsParams::ultralytics_val()).run(&view, i, &mut scratch, &mut dets, None).unwrap();
        n_default += dets.len() as u64;
        exact.run(&view, i, &mut scratch, &mut dets, None).unwrap();
        n_dets += dets.len() as u64;
        coco.update(im.id, &dets, &im.labels).unwrap();
    }
    assert!(n_dets < n_default, "{n_dets} vs {n_default}: the two post-processes must differ");
    let objects: u64 = images.iter().map(|im| im.labels.objects.len() as u64).sum();

    for workers in [1, 4] {
        let cfg = StreamConfig { workers, queue_depth: 2, ..StreamConfig::new(NC as u32) };
        let r = run(StreamingValidator::with_stages(cfg, exact, Census::default).unwrap(), &refs, 3);
        let (ids, got_dets, got_objects) = r.metrics;
        assert_eq!(ids, (300..323).collect::<Vec<_>>(), "every image exactly once ({workers} workers)");
        assert_eq!((got_dets, got_objects), (n_dets, objects));
        assert_eq!((r.stats.images, r.stats.detections), (23, n_dets));

        let cfg = StreamConfig { workers, queue_depth: 2, ..StreamConfig::new(NC as u32) };
        let v = StreamingValidator::with_stages(cfg, exact, || CocoMetric::new(NC as u32).unwrap()).unwrap();
        assert_eq!(v.post_process().params.max_det, 5);
        let r = run(v, &refs, 3);
        let want = coco.clone().finalize().unwrap();
        assert_eq!(r.metrics.stats, want.stats, "{workers} workers");
        assert!(want.stats[1] > 0.1, "COCO mAP50 {}: the data is not hopeless", want.stats[1]);
    }

    // A metric's error names the sample: the same image twice in one batch.
    let cfg = StreamConfig { workers: 1, ..StreamConfig::new(NC as u32) };
    let mut v = StreamingValidator::with_stages(cfg, exact, Census::default).unwrap();
    let mut buf = v.buffer().unwrap();
    buf.preds.data.extend_from_slice(&images[4].pred);
    buf.preds.data.extend_from_slice(&images[4].pred);
    (buf.preds.batch, buf.preds.num_classes, buf.preds.num_anchors) = (2, NC, ANCHORS);
    buf.set_labels(&[304, 304], &[images[4].labels.clone(), images[4].labels.clone()]).unwrap();
    v.submit(buf).unwrap();
    let e = v.finish().unwrap_err().to_string();
    assert_eq!(e, "sample 304: image 304 arrived twice");
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
