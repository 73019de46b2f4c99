//! Robustness: the label parser and the header reader on many random and mutated inputs (seeded, so a failure
//! reproduces) return a value or an error naming the file, and never panic.
#![allow(clippy::unwrap_used)] // Helpers of integration tests; clippy.toml already allows it in #[test] fns.

use std::io::Cursor;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sluice_dataset::header::read_header_from;
use sluice_dataset::labels::to_pixel_labels;
use sluice_dataset::parse_yolo_labels;

const TOKENS: &[&str] = &[
    "0",
    "1",
    "79",
    "80",
    "-1",
    "0.5",
    "1.0",
    "1.01",
    "1.02",
    "-0.005",
    "-0.5",
    "nan",
    "inf",
    "-inf",
    "1e-3",
    "1e38",
    "3.4e39",
    "x",
    "",
    " ",
    "\t",
    "\r",
    "\n",
    "\r\n",
    "0.0.0",
    "+0.5",
    "٣",
    "\u{feff}",
    "0.999999999",
];

#[test]
fn label_parser_never_panics() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let path = Path::new("fuzz.txt");
    for _ in 0..20_000 {
        let n = rng.random_range(0..40);
        let text: String = (0..n)
            .map(|_| TOKENS[rng.random_range(0..TOKENS.len())])
            .collect::<Vec<_>>()
            .join(if rng.random_bool(0.5) { " " } else { "\n" });
        match parse_yolo_labels(&text, path, 80) {
            Ok(p) => {
                let (labels, _) = to_pixel_labels(&p.rows, 64, 48, path);
                for l in labels {
                    assert!(l.class < 80);
                    assert!(l.bbox.is_finite() && l.bbox.area() > 0.0);
                    assert!(l.bbox.x1 >= 0.0 && l.bbox.x2 <= 64.0 && l.bbox.y1 >= 0.0 && l.bbox.y2 <= 48.0);
                }
            }
            Err(e) => assert!(e.to_string().starts_with("fuzz.txt:"), "{e}"),
        }
    }
}

#[test]
fn header_reader_never_panics_on_mutated_images() {
    let img = image::RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8 * 6, y as u8 * 8, 100]));
    let jpg = sluice_dataset::synth::encode_jpeg(&img, 80).unwrap();
    let mut png = Vec::new();
    img.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let path = Path::new("fuzz.img");
    for base in [&jpg, &png] {
        for _ in 0..3000 {
            let mut b = base.clone();
            match rng.random_range(0..3) {
                0 => b.truncate(rng.random_range(0..b.len())),
                1 => {
                    for _ in 0..rng.random_range(1..8) {
                        let i = rng.random_range(0..b.len().min(400));
                        b[i] = rng.random();
                    }
                }
                _ => b = (0..rng.random_range(0..64)).map(|_| rng.random()).collect(),
            }
            if let Err(e) = read_header_from(Cursor::new(b), path) {
                assert!(e.to_string().starts_with("fuzz.img"), "{e}");
            }
        }
    }
}
