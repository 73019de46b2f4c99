//! Shared helpers of the integration tests: synthetic images with coloured rectangles as objects, and an in-memory
//! image source.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::sync::Arc;

use sluice_core::{BoxXyxy, ImageLabels, ImageRgb8, ImageSource, Label, SampleId, SourceImage};

/// A distinct, saturated colour per class (never grey, far from each other and from the backgrounds).
pub const COLOURS: [[u8; 3]; 12] = [
    [250, 10, 10],
    [10, 250, 10],
    [10, 10, 250],
    [250, 250, 10],
    [250, 10, 250],
    [10, 250, 250],
    [250, 130, 10],
    [130, 10, 250],
    [10, 250, 130],
    [250, 10, 130],
    [130, 250, 10],
    [10, 130, 250],
];

/// A `w x h` image with a dark textured background and filled rectangles `(class, x0, y0, x1, y1)` (pixels
/// `x0..x1, y0..y1`); labels are the rectangles as boxes.
pub fn rect_image(w: u32, h: u32, rects: &[(u32, u32, u32, u32, u32)]) -> SourceImage {
    let mut image = ImageRgb8::new(w, h);
    for y in 0..h {
        for (x, px) in image.row_mut(y).chunks_exact_mut(3).enumerate() {
            let t = ((x as u32 * 7 + y * 13) % 40) as u8;
            px.copy_from_slice(&[40 + t, 60 - t / 2, 50 + t / 3]);
        }
    }
    let mut objects = Vec::new();
    for &(class, x0, y0, x1, y1) in rects {
        for y in y0..y1 {
            let row = image.row_mut(y);
            for x in x0..x1 {
                row[x as usize * 3..x as usize * 3 + 3].copy_from_slice(&COLOURS[class as usize]);
            }
        }
        objects.push(Label { class, bbox: BoxXyxy::new(x0 as f32, y0 as f32, x1 as f32, y1 as f32) });
    }
    SourceImage { image, labels: ImageLabels { width: w, height: h, objects } }
}

/// Four images of different sizes and aspect ratios with three objects each (classes 0..12, unique).
pub fn rect_dataset() -> Vec<SourceImage> {
    vec![
        rect_image(640, 480, &[(0, 40, 50, 200, 170), (1, 300, 60, 420, 400), (2, 480, 300, 620, 460)]),
        rect_image(500, 375, &[(3, 10, 10, 150, 120), (4, 200, 150, 330, 360), (5, 380, 40, 490, 200)]),
        rect_image(360, 640, &[(6, 30, 30, 330, 160), (7, 60, 250, 200, 420), (8, 220, 450, 340, 620)]),
        rect_image(800, 800, &[(9, 100, 100, 300, 260), (10, 420, 90, 760, 330), (11, 200, 500, 600, 760)]),
    ]
}

/// An in-memory image source.
pub struct MemSource(pub HashMap<SampleId, Arc<SourceImage>>);

impl MemSource {
    pub fn new(images: Vec<SourceImage>) -> Self {
        Self(images.into_iter().enumerate().map(|(i, s)| (i as SampleId, Arc::new(s))).collect())
    }
}

impl ImageSource for MemSource {
    fn get(&self, id: SampleId) -> sluice_core::Result<Arc<SourceImage>> {
        self.0.get(&id).cloned().ok_or_else(|| sluice_core::Error::Invalid {
            what: "sample id",
            reason: format!("no image {id} in the test source"),
        })
    }
}

/// Whether `px` is (within 8 levels per channel) the colour of `class`.
pub fn is_colour(px: [u8; 3], class: u32) -> bool {
    let c = COLOURS[class as usize];
    (0..3).all(|i| (i32::from(px[i]) - i32::from(c[i])).abs() <= 8)
}

/// Pixel `(x, y)` of a CHW slot of width `w` and height `h`.
pub fn chw_pixel(slot: &[u8], w: usize, h: usize, x: usize, y: usize) -> [u8; 3] {
    let i = y * w + x;
    [slot[i], slot[w * h + i], slot[2 * w * h + i]]
}
