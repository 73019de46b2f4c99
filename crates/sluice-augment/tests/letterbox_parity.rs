//! Letterbox parity with Ultralytics: the loss fixture records `LetterBox(new_shape=(320, 320))` of two coco128
//! images (ratio, resized size, padding, letterboxed targets, and the letterboxed pixels). Reproduce the numbers
//! exactly and the pixels up to JPEG-decoder differences (the fixture decoded with OpenCV's libjpeg, this test
//! with the `image` crate).

mod common;

use std::path::{Path, PathBuf};

use sluice_augment::{FILL, Letterbox, LetterboxOpts, letterbox_into};
use sluice_core::{BoxXyxy, ImageRgb8};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

fn load_rgb(path: &Path) -> ImageRgb8 {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).to_rgb8();
    let (w, h) = img.dimensions();
    ImageRgb8::from_raw(w, h, w as usize * 3, img.into_raw()).expect("rgb")
}

fn fixture() -> serde_json::Value {
    let text = std::fs::read_to_string(data("letterbox_320.json")).expect("fixture");
    serde_json::from_str(&text).expect("json")
}

#[test]
fn parameters_and_targets_match_ultralytics() {
    let fx = fixture();
    let targets = fx["targets"].as_array().expect("targets");
    for (i, im) in fx["images"].as_array().expect("images").iter().enumerate() {
        let (h0, w0) = (im["orig_hw"][0].as_u64().expect("h") as u32, im["orig_hw"][1].as_u64().expect("w") as u32);
        let lb = Letterbox::new(w0, h0, 320, 320, LetterboxOpts::default());
        assert_eq!(lb.ratio.0, im["ratio"].as_f64().expect("ratio"));
        assert_eq!(lb.ratio.1, im["ratio"].as_f64().expect("ratio"));
        let wh: Vec<u32> =
            im["resized_wh"].as_array().expect("wh").iter().map(|v| v.as_u64().expect("int") as u32).collect();
        assert_eq!(vec![lb.new_unpad.0, lb.new_unpad.1], wh);
        let pad: Vec<u32> =
            im["pad_ltrb"].as_array().expect("pad").iter().map(|v| v.as_u64().expect("int") as u32).collect();
        assert_eq!(lb.pad.to_vec(), pad);
        assert_eq!(lb.canvas, (320, 320));

        // Labels: YOLO rows (class, cx, cy, w, h normalised) -> pixels -> letterbox -> normalised to the canvas.
        let rows: Vec<&serde_json::Value> = targets.iter().filter(|t| t[0].as_f64() == Some(i as f64)).collect();
        let labels = im["label_rows"].as_array().expect("labels");
        assert_eq!(rows.len(), labels.len());
        for (row, want) in labels.iter().zip(rows) {
            let v: Vec<f32> = row.as_array().expect("row").iter().map(|x| x.as_f64().expect("num") as f32).collect();
            let b = BoxXyxy::from_cxcywh(v[1] * w0 as f32, v[2] * h0 as f32, v[3] * w0 as f32, v[4] * h0 as f32);
            let m = lb.map_box(&b).to_cxcywh();
            assert_eq!(want[1].as_f64().expect("cls") as f32, v[0]);
            for k in 0..4 {
                let expected = want[2 + k].as_f64().expect("num") as f32;
                assert!((m[k] / 320.0 - expected).abs() < 2e-6, "image {i} coord {k}: {} vs {expected}", m[k] / 320.0);
            }
            // Round trip back to the source frame.
            let back = lb.unmap_box(&lb.map_box(&b));
            assert!((back.x1 - b.x1).abs() < 1e-3 && (back.y2 - b.y2).abs() < 1e-3);
        }
    }
}

#[test]
fn pixels_match_ultralytics_letterbox() {
    let fx = fixture();
    for (i, im) in fx["images"].as_array().expect("images").iter().enumerate() {
        let name = Path::new(im["file"].as_str().expect("file")).file_name().expect("name").to_owned();
        let src = load_rgb(&data(name.to_str().expect("utf8")));
        let want = load_rgb(&data(&format!("loss_in_320_{i}.png")));
        let lb = Letterbox::new(src.width(), src.height(), 320, 320, LetterboxOpts::default());
        let mut out = vec![0u8; 3 * 320 * 320];
        letterbox_into(&src, &lb, &mut out);
        let (top, bottom) = (lb.pad[1] as usize, 320 - lb.pad[3] as usize);
        let mut sum = 0u64;
        let mut shifted = 0u64;
        let mut worst = 0;
        for y in 0..320 {
            for x in 0..320 {
                let got = common::chw_pixel(&out, 320, 320, x, y);
                let exp = want.pixel(x as u32, y as u32);
                if y < top || y >= bottom {
                    assert_eq!(got, [FILL; 3], "image {i} padding pixel ({x}, {y})");
                    assert_eq!(exp, [FILL; 3], "fixture padding pixel ({x}, {y})");
                    continue;
                }
                for c in 0..3 {
                    let d = (i32::from(got[c]) - i32::from(exp[c])).unsigned_abs();
                    sum += u64::from(d);
                    worst = worst.max(d);
                    // The same comparison one pixel off, to show the test tells a misplaced image apart.
                    let exp_shift = want.pixel(x as u32, (y + 1).min(bottom - 1) as u32);
                    shifted += u64::from((i32::from(got[c]) - i32::from(exp_shift[c])).unsigned_abs());
                }
            }
        }
        let count = (bottom - top) as f64 * 320.0 * 3.0;
        let (mean, mean_shifted) = (sum as f64 / count, shifted as f64 / count);
        println!("image {i}: mean |diff| {mean:.3}, max {worst}, shifted by one row {mean_shifted:.3}");
        // Observed: mean 0.014 / 0.017, max 1 (decoder and fixed-point rounding differences only).
        assert!(mean < 0.1 && worst <= 2, "image {i}: mean abs difference {mean}, max {worst}");
        assert!(mean_shifted > 2.0 * mean + 1.0, "image {i}: a one-row shift is not detectable ({mean_shifted})");
    }
}

/// The letterbox's resize equals `cv2.resize(INTER_LINEAR)` bit for bit at a scale whose weights show cv2's own
/// rounding (64 x 80 → 51 x 64, Ultralytics' `LetterBox` at imgsz 64; `tests/data/make_resize_fixture.py`), and the
/// padding around it is the fill value.
#[test]
fn resize_matches_cv2_bit_for_bit() {
    let src = load_rgb(&data("resize_src_64x80.png"));
    let want = load_rgb(&data("resize_cv2_51x64.png"));
    let lb = Letterbox::new(64, 80, 64, 64, LetterboxOpts { auto: true, ..LetterboxOpts::default() });
    assert_eq!((lb.new_unpad, lb.pad, lb.canvas), ((51, 64), [6, 0, 7, 0], (64, 64)));
    let mut out = vec![0u8; 3 * 64 * 64];
    letterbox_into(&src, &lb, &mut out);
    let plane = 64 * 64;
    let mut differ = 0;
    for y in 0..64usize {
        for x in 0..64usize {
            for c in 0..3 {
                let got = out[c * plane + y * 64 + x];
                let expected = if (6..57).contains(&x) { want.row(y as u32)[(x - 6) * 3 + c] } else { FILL };
                differ += usize::from(got != expected);
            }
        }
    }
    assert_eq!(differ, 0, "values differing from cv2.resize");
}
