//! Image size and format from the file header, without decoding pixels (`imagesize` reads JPEG SOF, PNG IHDR,
//! BMP, WebP and others from the first bytes), with the EXIF orientation (`kamadak-exif`) applied: orientations
//! 5-8 swap width and height, so sizes are those of the image as a decoder that honours EXIF returns it.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{DatasetError, Result};

/// Image formats Sluice indexes (those its default decoder reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// JPEG.
    Jpeg,
    /// PNG.
    Png,
    /// BMP.
    Bmp,
    /// WebP.
    Webp,
}

/// What the header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageHeader {
    /// The format found in the bytes (not the extension).
    pub format: ImageFormat,
    /// Width after EXIF orientation.
    pub width: u32,
    /// Height after EXIF orientation.
    pub height: u32,
    /// EXIF orientation, 1 (none) to 8.
    pub orientation: u16,
    /// For a JPEG: whether the file lacks its final `FF D9` end-of-image marker (a truncated file).
    pub missing_eoi: bool,
}

/// Ultralytics' minimum: both sides at least 10 pixels.
pub const MIN_SIDE: u32 = 10;

/// Reads the header of the image file at `path`.
pub fn read_header(path: &Path) -> Result<ImageHeader> {
    let file = File::open(path).map_err(|e| DatasetError::io(path, e))?;
    read_header_from(BufReader::with_capacity(16 * 1024, file), path)
}

/// Reads an image header from `reader`; `path` only names the image in errors.
pub fn read_header_from<R: BufRead + Seek>(mut reader: R, path: &Path) -> Result<ImageHeader> {
    let bad = |reason: String| DatasetError::Image { path: path.to_path_buf(), reason };
    let kind = imagesize::reader_type(&mut reader).map_err(|e| bad(format!("unreadable image header: {e}")))?;
    let format = match kind {
        imagesize::ImageType::Jpeg => ImageFormat::Jpeg,
        imagesize::ImageType::Png => ImageFormat::Png,
        imagesize::ImageType::Bmp => ImageFormat::Bmp,
        imagesize::ImageType::Webp => ImageFormat::Webp,
        other => return Err(bad(format!("unsupported image format {other:?} (supported: jpeg, png, bmp, webp)"))),
    };
    reader.seek(SeekFrom::Start(0)).map_err(|e| DatasetError::io(path, e))?;
    let size = imagesize::reader_size(&mut reader).map_err(|e| bad(format!("corrupt image header: {e}")))?;
    let (w, h) = (u32::try_from(size.width), u32::try_from(size.height));
    let (Ok(mut width), Ok(mut height)) = (w, h) else {
        return Err(bad(format!("image size {}x{} out of range", size.width, size.height)));
    };
    reader.seek(SeekFrom::Start(0)).map_err(|e| DatasetError::io(path, e))?;
    // A missing or unreadable EXIF block means orientation 1, as for every decoder.
    let orientation = exif::Reader::new()
        .read_from_container(&mut reader)
        .ok()
        .and_then(|ex| ex.get_field(exif::Tag::Orientation, exif::In::PRIMARY).and_then(|f| f.value.get_uint(0)))
        .and_then(|o| u16::try_from(o).ok())
        .filter(|o| (1..=8).contains(o))
        .unwrap_or(1);
    if orientation >= 5 {
        std::mem::swap(&mut width, &mut height);
    }
    if width < MIN_SIDE || height < MIN_SIDE {
        return Err(bad(format!("image size ({height}, {width}) <{MIN_SIDE} pixels")));
    }
    let missing_eoi = if format == ImageFormat::Jpeg {
        let mut tail = [0u8; 2];
        reader
            .seek(SeekFrom::End(-2))
            .and_then(|_| reader.read_exact(&mut tail))
            .map_err(|e| DatasetError::io(path, e))?;
        tail != [0xFF, 0xD9]
    } else {
        false
    };
    Ok(ImageHeader { format, width, height, orientation, missing_eoi })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn jpeg(w: u32, h: u32) -> Vec<u8> {
        let img = image::RgbImage::from_pixel(w, h, image::Rgb([10, 200, 30]));
        let mut out = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 80)
            .encode(img.as_raw(), w, h, image::ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    /// Inserts an APP1 EXIF segment with the given orientation right after SOI.
    fn with_orientation(jpg: &[u8], o: u16) -> Vec<u8> {
        // TIFF header (big endian), IFD0 with one entry: Orientation (0x0112), SHORT, count 1, value o.
        let mut tiff = b"MM\0\x2a\0\0\0\x08".to_vec();
        tiff.extend_from_slice(&[0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1]);
        tiff.extend_from_slice(&o.to_be_bytes());
        tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend_from_slice(&tiff);
        let len = (app1.len() + 2) as u16;
        let mut out = jpg[..2].to_vec();
        out.extend_from_slice(&[0xFF, 0xE1]);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&app1);
        out.extend_from_slice(&jpg[2..]);
        out
    }

    #[test]
    fn jpeg_size_from_sof() {
        let h = read_header_from(Cursor::new(jpeg(40, 24)), Path::new("a.jpg")).unwrap();
        assert_eq!((h.format, h.width, h.height, h.orientation, h.missing_eoi), (ImageFormat::Jpeg, 40, 24, 1, false));
    }

    #[test]
    fn exif_orientation_swaps_sides() {
        for (o, swapped) in [(1, false), (3, false), (5, true), (6, true), (8, true)] {
            let h = read_header_from(Cursor::new(with_orientation(&jpeg(40, 24), o)), Path::new("a.jpg")).unwrap();
            assert_eq!(h.orientation, o);
            assert_eq!((h.width, h.height), if swapped { (24, 40) } else { (40, 24) }, "orientation {o}");
        }
    }

    #[test]
    fn truncated_jpeg_is_flagged_and_garbage_rejected() {
        let j = jpeg(32, 32);
        let h = read_header_from(Cursor::new(j[..j.len() - 10].to_vec()), Path::new("t.jpg")).unwrap();
        assert!(h.missing_eoi);
        let e = read_header_from(Cursor::new(b"not an image at all".to_vec()), Path::new("g.jpg")).unwrap_err();
        assert!(e.to_string().starts_with("g.jpg: "), "{e}");
        assert!(read_header_from(Cursor::new(Vec::new()), Path::new("z.jpg")).is_err());
        assert!(read_header_from(Cursor::new(j[..20].to_vec()), Path::new("s.jpg")).is_err());
    }

    #[test]
    fn png_ihdr_and_minimum_size() {
        let mut out = Vec::new();
        image::RgbaImage::new(17, 12).write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png).unwrap();
        let h = read_header_from(Cursor::new(out), Path::new("a.png")).unwrap();
        assert_eq!((h.format, h.width, h.height), (ImageFormat::Png, 17, 12));
        let e = read_header_from(Cursor::new(jpeg(9, 30)), Path::new("small.jpg")).unwrap_err();
        assert!(e.to_string().contains("<10 pixels"), "{e}");
    }
}
