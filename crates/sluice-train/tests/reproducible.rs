//! Reproducible runs: the same config, seed and thread count give the same `results.csv`, digit for digit, and a
//! run interrupted in the middle of an epoch and resumed writes the uninterrupted run's rows. The compute pool is
//! fixed at two threads (the CI machine's count), so the kernels' parallel reductions (the convolutions' weight
//! gradients summed over tiles, the BatchNorm statistics) run split across threads: their combine order must not
//! depend on which thread took which part.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sluice_dataset::synth::{SynthConfig, generate};
use sluice_train::train::results::{EpochRow, ResultsCsv};
use sluice_train::train::{BatchEvent, Observer, TrainConfig, Trainer};

/// Stops the run after batch `at` (epoch, batch) by raising the trainer's stop flag, as Ctrl-C does.
struct StopAt {
    at: (u32, usize),
    stop: Arc<AtomicBool>,
}

impl Observer for StopAt {
    fn batch(&mut self, e: &BatchEvent) {
        if (e.epoch, e.batch) == self.at {
            self.stop.store(true, Ordering::SeqCst);
        }
    }
}

struct Quiet;
impl Observer for Quiet {}

fn config(data: &Path, project: &Path, name: &str) -> TrainConfig {
    let mut c = TrainConfig {
        data: data.to_path_buf(),
        model: "yolov8n".into(),
        epochs: 3,
        imgsz: 96,
        batch: 8,
        workers: 2,
        project: project.to_path_buf(),
        name: name.into(),
        plots: false,
        ..Default::default()
    };
    c.hyp.close_mosaic = 1;
    c
}

/// The rows with the wall time, the one column that may differ, zeroed.
fn rows(path: &Path) -> Vec<EpochRow> {
    let rows = ResultsCsv::read(path).expect("results.csv");
    rows.into_iter().map(|r| EpochRow { time: 0.0, ..r }).collect()
}

#[test]
fn the_same_seed_gives_the_same_rows_and_a_resume_gives_the_uninterrupted_rows() {
    // Only this test runs in this binary, so the global pool is still unbuilt here.
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let synth = SynthConfig {
        out: dir.path().join("data"),
        seed: 11,
        train: 32,
        val: 8,
        imgsz: 128,
        quality: 90,
        ..Default::default()
    };
    let data = generate(&synth).unwrap().data_yaml;
    let project = dir.path().join("runs");

    let mut first = Trainer::new(config(&data, &project, "first")).unwrap();
    first.run(&mut Quiet).unwrap();
    let mut second = Trainer::new(config(&data, &project, "second")).unwrap();
    second.run(&mut Quiet).unwrap();
    let a = rows(&first.paths().results);
    assert_eq!(a.len(), 3);
    assert_eq!(a, rows(&second.paths().results), "two runs of one config and seed must write the same rows");

    // Interrupted after batch 1 of epoch 2 (4 batches an epoch), then resumed from `last`.
    let mut t = Trainer::new(config(&data, &project, "part")).unwrap();
    let mut stop = StopAt { at: (1, 1), stop: t.stop_flag() };
    let s = t.run(&mut stop).unwrap();
    assert!(s.interrupted);
    let mut t = Trainer::resume(&s.last).unwrap();
    let s = t.run(&mut Quiet).unwrap();
    assert!(!s.interrupted);
    assert_eq!(a, rows(&t.paths().results), "the resumed run must write the uninterrupted run's rows");
}
