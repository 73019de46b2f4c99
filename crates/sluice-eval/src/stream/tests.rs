//! The streaming validator's unit tests.
use super::*;
use sluice_core::BoxXyxy;

fn one_box_batch(v: &StreamingValidator, id: SampleId, score: f32) -> Pooled<ValBatch> {
    let mut b = v.buffer().unwrap();
    b.preds.data.extend_from_slice(&[20.0, 20.0, 20.0, 20.0, score]);
    (b.preds.batch, b.preds.num_classes, b.preds.num_anchors) = (1, 1, 1);
    b.ids.push(id);
    b.targets.push(Target { image: 0, class: 0, bbox: BoxXyxy::new(10.0, 10.0, 30.0, 30.0) });
    b
}

#[test]
fn drop_joins_every_worker() {
    let mut v = StreamingValidator::new(StreamConfig { workers: 3, ..StreamConfig::new(1) }).unwrap();
    for id in 0..4 {
        let b = one_box_batch(&v, id, 0.5);
        v.submit(b).unwrap();
    }
    let weak = Arc::downgrade(&v.shared);
    let pool = v.pool().clone();
    drop(v);
    // Each worker held a clone of the shared state until its thread ended.
    assert!(weak.upgrade().is_none());
    // Every buffer came back to the pool.
    let created = pool.created();
    let held: Vec<_> = (0..created).map(|_| pool.try_acquire().unwrap()).collect();
    assert_eq!((held.len(), pool.created()), (created, created));
}

#[test]
fn drop_cancels_the_queued_batches() {
    // One worker, eight queued batches that each take far longer to post-process than to submit: 64
    // images of 2000 disjoint boxes above conf, so NMS keeps 300 per image after comparing with every kept box.
    let cfg = StreamConfig { workers: 1, queue_depth: 8, ..StreamConfig::new(1) };
    let mut v = StreamingValidator::new(cfg).unwrap();
    let na = 2000;
    let mut image = vec![0.0f32; 5 * na];
    for a in 0..na {
        let (x, y) = ((a % 50) as f32 * 12.0, (a / 50) as f32 * 12.0);
        for (r, val) in [x, y, 10.0, 10.0, 0.5 + a as f32 / (4.0 * na as f32)].into_iter().enumerate() {
            image[r * na + a] = val;
        }
    }
    let per = 64;
    for i in 0..8 {
        let mut b = v.buffer().unwrap();
        for _ in 0..per {
            b.preds.data.extend_from_slice(&image);
        }
        (b.preds.batch, b.preds.num_classes, b.preds.num_anchors) = (per, 1, na);
        b.ids.extend((0..per as u64).map(|k| i * per as u64 + k));
        v.submit(b).unwrap();
    }
    let shared = Arc::clone(&v.shared);
    drop(v);
    // Every worker thread has ended (each held a clone), and most queued batches were never processed.
    assert_eq!(Arc::strong_count(&shared), 1);
    let processed = shared.processed.load(Ordering::Relaxed);
    assert!(processed < 8, "{processed} of 8 batches processed: the drop did not cancel the queue");
}

#[test]
fn bad_batches_are_refused_in_submit() {
    let mut v = StreamingValidator::new(StreamConfig { workers: 1, ..StreamConfig::new(1) }).unwrap();
    let mut b = one_box_batch(&v, 1, 0.5);
    b.ids.push(2);
    assert!(v.submit(b).unwrap_err().to_string().contains("2 sample ids for 1 images"));
    let mut b = one_box_batch(&v, 1, 0.5);
    b.targets[0].image = 3;
    assert!(v.submit(b).is_err());
    let mut b = one_box_batch(&v, 1, 0.5);
    b.preds.num_classes = 2;
    assert!(v.submit(b).is_err());
    // The validator still works after refusing bad input.
    let b = one_box_batch(&v, 1, 0.5);
    v.submit(b).unwrap();
    assert_eq!(v.finish().unwrap().stats.images, 1);
    assert!(StreamingValidator::new(StreamConfig { workers: 0, ..StreamConfig::new(1) }).is_err());
}

#[test]
fn duplicate_sample_ids_fail_at_finish() {
    let mut v = StreamingValidator::new(StreamConfig { workers: 2, ..StreamConfig::new(1) }).unwrap();
    for _ in 0..2 {
        let b = one_box_batch(&v, 5, 0.5);
        v.submit(b).unwrap();
    }
    let e = v.finish().unwrap_err();
    assert!(e.to_string().contains('5'), "{e}");
}

#[test]
fn device_flags_name_the_sample() {
    let mut v = StreamingValidator::new(StreamConfig { workers: 1, ..StreamConfig::new(1) }).unwrap();
    let mut b = one_box_batch(&v, 41, 0.5);
    b.all_finite.push(false);
    v.submit(b).unwrap();
    let e = v.finish().unwrap_err();
    assert!(e.to_string().starts_with("sample 41: "), "{e}");
}
