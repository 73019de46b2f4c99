//! An owned RGB8 image buffer with an explicit row stride, reusable across decodes.

use crate::error::{Error, Result};

/// Interleaved RGB, 8 bits per channel. Rows are `stride` bytes apart (`stride >= 3 * width`), so a decoder can
/// write padded rows and a cache can hand out sub-images without copies. The buffer is reused: [`Self::reset`]
/// keeps its allocation when the new image fits.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ImageRgb8 {
    width: u32,
    height: u32,
    stride: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for ImageRgb8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageRgb8")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("stride", &self.stride)
            .finish_non_exhaustive()
    }
}

impl ImageRgb8 {
    /// A black image with tightly packed rows.
    pub fn new(width: u32, height: u32) -> Self {
        let stride = width as usize * 3;
        Self { width, height, stride, data: vec![0; stride * height as usize] }
    }

    /// Wraps existing pixels; fails if `data` is too short for `height` rows of `stride` bytes.
    pub fn from_raw(width: u32, height: u32, stride: usize, data: Vec<u8>) -> Result<Self> {
        let row = width as usize * 3;
        if stride < row {
            return Err(Error::Invalid {
                what: "image stride",
                reason: format!("stride {stride} < 3 * width {width}"),
            });
        }
        let need = if height == 0 { 0 } else { stride * (height as usize - 1) + row };
        if data.len() < need {
            return Err(Error::Invalid {
                what: "image buffer",
                reason: format!("{} bytes < {need} needed for {width}x{height} stride {stride}", data.len()),
            });
        }
        Ok(Self { width, height, stride, data })
    }

    /// Reshapes the buffer to `width x height` with packed rows, reusing the allocation when it is big enough.
    /// Pixel contents are unspecified afterwards.
    pub fn reset(&mut self, width: u32, height: u32) {
        self.width = width;
        self.height = height;
        self.stride = width as usize * 3;
        self.data.resize(self.stride * height as usize, 0);
    }

    /// Width in pixels.
    pub fn width(&self) -> u32 {
        self.width
    }

    /// Height in pixels.
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Bytes between the starts of two rows.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Row `y` (exactly `3 * width` bytes).
    pub fn row(&self, y: u32) -> &[u8] {
        let start = y as usize * self.stride;
        &self.data[start..start + self.width as usize * 3]
    }

    /// Row `y`, mutable.
    pub fn row_mut(&mut self, y: u32) -> &mut [u8] {
        let start = y as usize * self.stride;
        let len = self.width as usize * 3;
        &mut self.data[start..start + len]
    }

    /// The pixel at `(x, y)`.
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = y as usize * self.stride + x as usize * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// The whole backing buffer, including row padding.
    pub fn as_bytes(&self) -> &[u8] {
        &self.data
    }

    /// The whole backing buffer, mutable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        &mut self.data
    }

    /// Size of the backing buffer in bytes (what a cache charges for this image).
    pub fn byte_size(&self) -> usize {
        self.data.len()
    }

    /// Consumes the image, returning its buffer.
    pub fn into_raw(self) -> Vec<u8> {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_rows_skip_padding() {
        let mut data = vec![0u8; 2 * 8];
        data[8..14].copy_from_slice(&[1, 2, 3, 4, 5, 6]);
        let img = ImageRgb8::from_raw(2, 2, 8, data).expect("valid");
        assert_eq!(img.row(1), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(img.pixel(1, 1), [4, 5, 6]);
    }

    #[test]
    fn from_raw_rejects_short_buffers_and_strides() {
        assert!(ImageRgb8::from_raw(4, 2, 11, vec![0; 100]).is_err());
        assert!(ImageRgb8::from_raw(4, 2, 12, vec![0; 23]).is_err());
        assert!(ImageRgb8::from_raw(4, 2, 16, vec![0; 28]).is_ok());
    }

    #[test]
    fn reset_reuses_allocation() {
        let mut img = ImageRgb8::new(64, 64);
        let ptr = img.as_bytes().as_ptr();
        img.reset(32, 48);
        assert_eq!((img.width(), img.height(), img.stride()), (32, 48, 96));
        assert_eq!(img.as_bytes().as_ptr(), ptr);
    }
}
