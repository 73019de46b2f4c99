//! EXIF orientation and the one-pass copy that converts decoded pixels (gray, gray+alpha, RGB, RGBA) to RGB8 and
//! applies the orientation while writing into the caller's image.

use sluice_core::ImageRgb8;

/// The eight EXIF orientations (tag 0x0112), named by what displaying the stored pixels requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Orientation {
    /// 1: as stored.
    #[default]
    Normal,
    /// 2: mirror left-right.
    FlipHorizontal,
    /// 3: rotate 180°.
    Rotate180,
    /// 4: mirror top-bottom.
    FlipVertical,
    /// 5: mirror across the main diagonal.
    Transpose,
    /// 6: rotate 90° clockwise.
    Rotate90,
    /// 7: mirror across the anti-diagonal.
    Transverse,
    /// 8: rotate 90° counter-clockwise.
    Rotate270,
}

impl Orientation {
    /// From the EXIF tag value; values outside 1..=8 mean [`Orientation::Normal`].
    pub fn from_exif(value: u32) -> Self {
        match value {
            2 => Self::FlipHorizontal,
            3 => Self::Rotate180,
            4 => Self::FlipVertical,
            5 => Self::Transpose,
            6 => Self::Rotate90,
            7 => Self::Transverse,
            8 => Self::Rotate270,
            _ => Self::Normal,
        }
    }

    /// Whether displaying swaps width and height.
    pub fn swaps_axes(self) -> bool {
        matches!(self, Self::Transpose | Self::Rotate90 | Self::Transverse | Self::Rotate270)
    }

    /// The displayed size of a `w x h` stored image.
    pub fn apply_to_size(self, w: u32, h: u32) -> (u32, u32) {
        if self.swaps_axes() { (h, w) } else { (w, h) }
    }

    /// The stored pixel shown at displayed `(x, y)` of a `w x h` stored image.
    #[inline]
    fn source(self, x: usize, y: usize, w: usize, h: usize) -> (usize, usize) {
        match self {
            Self::Normal => (x, y),
            Self::FlipHorizontal => (w - 1 - x, y),
            Self::Rotate180 => (w - 1 - x, h - 1 - y),
            Self::FlipVertical => (x, h - 1 - y),
            Self::Transpose => (y, x),
            Self::Rotate90 => (y, h - 1 - x),
            Self::Transverse => (w - 1 - y, h - 1 - x),
            Self::Rotate270 => (w - 1 - y, x),
        }
    }
}

/// Converts packed `src` pixels (`w x h`, `channels` = 1 gray, 2 gray+alpha, 3 RGB or 4 RGBA, 8 bits each) to RGB8
/// in `out`, applying `orientation`. Alpha is dropped, as `cv2.imread(IMREAD_COLOR)` and Pillow's
/// `convert("RGB")` do. `src` must hold `w * h * channels` bytes.
pub(crate) fn convert_into(src: &[u8], w: u32, h: u32, channels: usize, orientation: Orientation, out: &mut ImageRgb8) {
    debug_assert!((1..=4).contains(&channels) && src.len() >= w as usize * h as usize * channels);
    let (ow, oh) = orientation.apply_to_size(w, h);
    out.reset(ow, oh);
    let (wu, hu) = (w as usize, h as usize);
    if orientation == Orientation::Normal {
        for y in 0..oh {
            let row_in = &src[y as usize * wu * channels..(y as usize + 1) * wu * channels];
            let row_out = out.row_mut(y);
            match channels {
                3 => row_out.copy_from_slice(row_in),
                1 => {
                    for (o, &g) in row_out.chunks_exact_mut(3).zip(row_in) {
                        o.fill(g);
                    }
                }
                _ => {
                    for (o, p) in row_out.chunks_exact_mut(3).zip(row_in.chunks_exact(channels)) {
                        if channels == 2 {
                            o.fill(p[0]);
                        } else {
                            o.copy_from_slice(&p[..3]);
                        }
                    }
                }
            }
        }
        return;
    }
    for y in 0..oh as usize {
        let row_out = out.row_mut(y as u32);
        for (x, o) in row_out.chunks_exact_mut(3).enumerate() {
            let (sx, sy) = orientation.source(x, y, wu, hu);
            let i = (sy * wu + sx) * channels;
            match channels {
                1 | 2 => o.fill(src[i]),
                _ => o.copy_from_slice(&src[i..i + 3]),
            }
        }
    }
}

/// Applies `orientation` to an RGB8 image, writing into `out` (which must be a different buffer).
#[cfg(feature = "image")]
pub(crate) fn orient_rgb(src: &ImageRgb8, orientation: Orientation, out: &mut ImageRgb8) {
    let (w, h) = (src.width(), src.height());
    if src.stride() == w as usize * 3 {
        convert_into(&src.as_bytes()[..w as usize * h as usize * 3], w, h, 3, orientation, out);
    } else {
        let mut packed = Vec::with_capacity(w as usize * h as usize * 3);
        for y in 0..h {
            packed.extend_from_slice(src.row(y));
        }
        convert_into(&packed, w, h, 3, orientation, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 3x2 RGB image whose pixels encode their own coordinates.
    fn coords(w: u32, h: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..h {
            for x in 0..w {
                v.extend_from_slice(&[x as u8, y as u8, 7]);
            }
        }
        v
    }

    #[test]
    fn all_orientations_match_the_image_crate() {
        let (w, h) = (3u32, 2u32);
        let src = coords(w, h);
        for tag in 1..=8u8 {
            let mut out = ImageRgb8::default();
            convert_into(&src, w, h, 3, Orientation::from_exif(u32::from(tag)), &mut out);
            let mut reference =
                image::DynamicImage::ImageRgb8(image::RgbImage::from_raw(w, h, src.clone()).expect("buffer fits"));
            reference.apply_orientation(image::metadata::Orientation::from_exif(tag).expect("valid tag"));
            let reference = reference.into_rgb8();
            assert_eq!((out.width(), out.height()), reference.dimensions(), "orientation {tag}");
            assert_eq!(out.as_bytes(), reference.as_raw().as_slice(), "orientation {tag}");
        }
    }

    #[test]
    fn gray_and_alpha_expand_to_rgb() {
        let mut out = ImageRgb8::default();
        convert_into(&[10, 20], 2, 1, 1, Orientation::Normal, &mut out);
        assert_eq!(out.as_bytes(), &[10, 10, 10, 20, 20, 20]);
        convert_into(&[10, 255, 20, 0], 2, 1, 2, Orientation::Rotate90, &mut out);
        assert_eq!((out.width(), out.height()), (1, 2));
        assert_eq!(out.as_bytes(), &[10, 10, 10, 20, 20, 20]);
        convert_into(&[1, 2, 3, 4, 5, 6, 7, 8], 2, 1, 4, Orientation::FlipHorizontal, &mut out);
        assert_eq!(out.as_bytes(), &[5, 6, 7, 1, 2, 3]);
    }
}
