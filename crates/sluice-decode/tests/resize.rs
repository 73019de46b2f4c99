//! Resizing against OpenCV (`cv2.resize`, as Ultralytics' `load_image` calls it): `INTER_AREA` at an integer and
//! a fractional factor, `INTER_LINEAR` shrinking and enlarging. References in `tests/data` (see its README).

mod common;

use common::{diff, reference};
use sluice_decode::ImageRgb8;
use sluice_decode::resize::{Interpolation, resize, resize_long_side, target_size};

fn check(interp: Interpolation, w: u32, h: u32, name: &str, max_mean: f64, max_abs: u8) {
    let src = reference("rgb.png");
    let mut out = ImageRgb8::default();
    resize(&src, w, h, interp, &mut out).expect("resize");
    let d = diff(&out, &reference(name));
    eprintln!("{name}: {d:?}");
    assert!(d.mean <= max_mean && d.max <= max_abs, "{name}: {d:?}");
}

#[test]
fn area_matches_opencv_inter_area() {
    check(Interpolation::Area, 80, 60, "resize_area_80.png", 0.5, 1); // Factor 2: exact up to rounding.
    check(Interpolation::Area, 64, 48, "resize_area_64.png", 0.5, 1); // Factor 2.5: fractional weights.
}

#[test]
fn linear_matches_opencv_inter_linear() {
    check(Interpolation::Linear, 200, 150, "resize_linear_200.png", 0.5, 1);
    check(Interpolation::Linear, 64, 48, "resize_linear_64.png", 0.5, 1);
}

#[test]
fn long_side_resize_follows_ultralytics() {
    let src = reference("rgb.png"); // 160 x 120
    let mut out = ImageRgb8::default();
    let r = resize_long_side(&src, 160, 120, 80, false, &mut out).expect("resize");
    assert_eq!((r, out.width(), out.height()), (0.5, 80, 60));
    assert!(diff(&out, &reference("resize_area_80.png")).max <= 1);
    assert_eq!(target_size(160, 120, 200), (1.25, 200, 150));
}
