//! An RGB8 image buffer with an explicit row stride, reusable across decodes: owned pixels, or a read-only range
//! of shared bytes (a memory-mapped cache file) that readers see exactly as owned ones.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Result};

/// Read-only bytes that several images may share, e.g. a memory-mapped file of decoded images.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where an image's pixels live: `shared` when set (a range of shared bytes, never written), else `owned`.
#[derive(Clone, Default)]
struct Storage {
    owned: Vec<u8>,
    shared: Option<(SharedBytes, Range<usize>)>,
}

impl Storage {
    fn owned(v: Vec<u8>) -> Self {
        Self { owned: v, shared: None }
    }

    fn bytes(&self) -> &[u8] {
        match &self.shared {
            Some((b, r)) => &(**b).as_ref()[r.clone()],
            None => &self.owned,
        }
    }

    /// The owned buffer, copying shared bytes into it first (copy on write).
    fn owned_mut(&mut self) -> &mut Vec<u8> {
        if let Some((b, r)) = self.shared.take() {
            self.owned = (*b).as_ref()[r].to_vec();
        }
        &mut self.owned
    }
}

/// Interleaved RGB, 8 bits per channel. Rows are `stride` bytes apart (`stride >= 3 * width`), so a decoder can
/// write padded rows and a cache can hand out sub-images without copies. The buffer is reused: [`Self::reset`]
/// keeps its allocation when the new image fits. The pixels are owned, or borrowed read-only from shared bytes
/// ([`Self::from_shared`]) so a memory-mapped cache serves images without copying them; writing to such an image
/// copies its pixels first.
#[derive(Clone, Default)]
pub struct ImageRgb8 {
    width: u32,
    height: u32,
    stride: usize,
    data: Storage,
}

impl PartialEq for ImageRgb8 {
    fn eq(&self, other: &Self) -> bool {
        (self.width, self.height, self.stride) == (other.width, other.height, other.stride)
            && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ImageRgb8 {}

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
        Self { width, height, stride, data: Storage::owned(vec![0; stride * height as usize]) }
    }

    /// Wraps existing pixels; fails if `data` is too short for `height` rows of `stride` bytes.
    pub fn from_raw(width: u32, height: u32, stride: usize, data: Vec<u8>) -> Result<Self> {
        check_len(width, height, stride, data.len())?;
        Ok(Self { width, height, stride, data: Storage::owned(data) })
    }

    /// An image whose backing buffer is `bytes[range]`, read in place (no copy); fails if the range lies outside
    /// `bytes` or is too short for `height` rows of `stride` bytes.
    pub fn from_shared(
        width: u32,
        height: u32,
        stride: usize,
        bytes: SharedBytes,
        range: Range<usize>,
    ) -> Result<Self> {
        let total = (*bytes).as_ref().len();
        if range.start > range.end || range.end > total {
            return Err(Error::Invalid {
                what: "image buffer",
                reason: format!("bytes {}..{} outside the {total} shared bytes", range.start, range.end),
            });
        }
        check_len(width, height, stride, range.len())?;
        Ok(Self { width, height, stride, data: Storage { owned: Vec::new(), shared: Some((bytes, range)) } })
    }

    /// Whether the pixels are borrowed from shared bytes rather than owned.
    pub fn is_shared(&self) -> bool {
        self.data.shared.is_some()
    }

    /// Reshapes the buffer to `width x height` with packed rows, reusing the allocation when it is big enough.
    /// Pixel contents are unspecified afterwards.
    pub fn reset(&mut self, width: u32, height: u32) {
        self.width = width;
        self.height = height;
        self.stride = width as usize * 3;
        let len = self.stride * height as usize;
        // The contents are unspecified after a reset: drop shared bytes instead of copying them.
        self.data.shared = None;
        self.data.owned.resize(len, 0);
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
        &self.as_bytes()[start..start + self.width as usize * 3]
    }

    /// Row `y`, mutable.
    pub fn row_mut(&mut self, y: u32) -> &mut [u8] {
        let start = y as usize * self.stride;
        let len = self.width as usize * 3;
        &mut self.data.owned_mut()[start..start + len]
    }

    /// The pixel at `(x, y)`.
    pub fn pixel(&self, x: u32, y: u32) -> [u8; 3] {
        let i = y as usize * self.stride + x as usize * 3;
        let d = self.as_bytes();
        [d[i], d[i + 1], d[i + 2]]
    }

    /// The whole backing buffer, including row padding.
    pub fn as_bytes(&self) -> &[u8] {
        self.data.bytes()
    }

    /// The whole backing buffer, mutable (copied into an owned buffer first when shared).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        self.data.owned_mut()
    }

    /// Size of the backing buffer in bytes (what a cache charges for this image).
    pub fn byte_size(&self) -> usize {
        self.as_bytes().len()
    }

    /// Consumes the image, returning its buffer (a copy of the pixels when they are shared).
    pub fn into_raw(mut self) -> Vec<u8> {
        std::mem::take(self.data.owned_mut())
    }
}

/// Fails unless `len` bytes hold `height` rows of `stride` bytes, each row `3 * width` bytes of pixels.
fn check_len(width: u32, height: u32, stride: usize, len: usize) -> Result<()> {
    let row = width as usize * 3;
    if stride < row {
        return Err(Error::Invalid { what: "image stride", reason: format!("stride {stride} < 3 * width {width}") });
    }
    let need = if height == 0 { 0 } else { stride * (height as usize - 1) + row };
    if len < need {
        return Err(Error::Invalid {
            what: "image buffer",
            reason: format!("{len} bytes < {need} needed for {width}x{height} stride {stride}"),
        });
    }
    Ok(())
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

    #[test]
    fn shared_pixels_read_in_place_and_copy_on_write() {
        let bytes: Vec<u8> = (0..40).collect();
        let shared: SharedBytes = Arc::new(bytes);
        let base = (*shared).as_ref().as_ptr();
        let img = ImageRgb8::from_shared(2, 2, 8, Arc::clone(&shared), 10..24).expect("valid");
        assert!(img.is_shared());
        assert_eq!(img.as_bytes().as_ptr(), base.wrapping_add(10));
        assert_eq!(img.row(1), &[18, 19, 20, 21, 22, 23]);
        assert_eq!(img.pixel(0, 1), [18, 19, 20]);
        let owned = ImageRgb8::from_raw(2, 2, 8, (10..24).collect()).expect("valid");
        assert_eq!(img, owned);
        let mut written = img.clone();
        written.row_mut(0)[0] = 99;
        assert!(!written.is_shared());
        assert_eq!(written.pixel(0, 0), [99, 11, 12]);
        assert_eq!(img.pixel(0, 0), [10, 11, 12], "the shared bytes are never written");
        assert_eq!(img.clone().into_raw(), (10..24).collect::<Vec<u8>>());
        assert!(ImageRgb8::from_shared(2, 2, 8, Arc::clone(&shared), 30..44).is_err());
        assert!(ImageRgb8::from_shared(2, 2, 8, shared, 10..23).is_err());
    }
}
