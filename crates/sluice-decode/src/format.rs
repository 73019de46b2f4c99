//! Format sniffing from magic bytes, the JPEG header walk (frame size, EXIF segment) that the backends share, and
//! the choice of a DCT scale for a decode hint.

use crate::orient::Orientation;

/// An encoded image format, recognised from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// JPEG / JFIF / EXIF (`FF D8 FF`).
    Jpeg,
    /// PNG.
    Png,
    /// Windows bitmap (`BM`).
    Bmp,
    /// WebP (`RIFF....WEBP`).
    WebP,
    /// GIF.
    Gif,
    /// TIFF (either byte order).
    Tiff,
}

impl Format {
    /// Recognises `bytes` by their magic number.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Self::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Self::Png)
        } else if bytes.starts_with(b"BM") {
            Some(Self::Bmp)
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(Self::WebP)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Self::Gif)
        } else if bytes.starts_with(b"II*\0") || bytes.starts_with(b"MM\0*") {
            Some(Self::Tiff)
        } else {
            None
        }
    }

    /// Lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Jpeg => "JPEG",
            Self::Png => "PNG",
            Self::Bmp => "BMP",
            Self::WebP => "WebP",
            Self::Gif => "GIF",
            Self::Tiff => "TIFF",
        }
    }
}

/// What the JPEG header walk found before the first scan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct JpegHeader<'a> {
    /// The TIFF payload of the first `APP1 Exif` segment, if any.
    pub(crate) exif: Option<&'a [u8]>,
    /// Width and height from the first start-of-frame segment (as stored, before EXIF orientation), if any.
    pub(crate) frame: Option<(u32, u32)>,
}

/// Walks the JPEG marker segments from SOI up to the first SOS (never into the entropy-coded data) and returns
/// the EXIF payload and the frame size. Malformed segment lengths end the walk quietly: the decoder reports the
/// corruption itself.
pub(crate) fn jpeg_header(bytes: &[u8]) -> JpegHeader<'_> {
    let mut head = JpegHeader::default();
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return head;
    }
    let mut i = 2usize;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            break;
        }
        let marker = bytes[i + 1];
        if marker == 0xFF {
            i += 1; // Fill byte.
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            break; // SOS or EOI: the header is over.
        }
        if (0xD0..=0xD7).contains(&marker) || marker == 0x01 {
            i += 2; // Stand-alone markers carry no length.
            continue;
        }
        let len = u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]) as usize;
        let Some(end) = (i + 2).checked_add(len).filter(|&e| len >= 2 && e <= bytes.len()) else {
            break;
        };
        let seg = &bytes[i + 4..end];
        if marker == 0xE1 && head.exif.is_none() && seg.starts_with(b"Exif\0\0") {
            head.exif = Some(&seg[6..]);
        }
        // SOF0–SOF15 but DHT (C4), JPG (C8) and DAC (CC): precision, height, width, components.
        if matches!(marker, 0xC0..=0xCF)
            && !matches!(marker, 0xC4 | 0xC8 | 0xCC)
            && head.frame.is_none()
            && seg.len() >= 5
        {
            let (h, w) = (u16::from_be_bytes([seg[1], seg[2]]), u16::from_be_bytes([seg[3], seg[4]]));
            head.frame = Some((u32::from(w), u32::from(h)));
        }
        i = end;
    }
    head
}

/// The EXIF orientation of a JPEG, or [`Orientation::Normal`] when it has no (readable) EXIF orientation tag.
pub fn jpeg_orientation(bytes: &[u8]) -> Orientation {
    jpeg_header(bytes).orientation()
}

impl JpegHeader<'_> {
    /// The EXIF orientation, or [`Orientation::Normal`] without a (readable) EXIF orientation tag.
    pub(crate) fn orientation(&self) -> Orientation {
        self.exif.map_or(Orientation::Normal, exif_orientation)
    }
}

/// The orientation tag of a raw EXIF (TIFF-structured) block, parsed with kamadak-exif.
pub(crate) fn exif_orientation(tiff: &[u8]) -> Orientation {
    let Ok(exif) = exif::Reader::new().read_raw(tiff.to_vec()) else {
        return Orientation::Normal;
    };
    exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
        .and_then(|f| f.value.get_uint(0))
        .map_or(Orientation::Normal, Orientation::from_exif)
}

/// The DCT scale denominator (1, 2, 4 or 8) for a source whose long side is `long_side` when the caller needs a
/// long side of at least `min_long_side`: the largest `d` with `ceil(long_side / d) >= min_long_side` (libjpeg
/// rounds scaled sizes up), i.e. a reduced decode only when the source is (about) twice the target or more.
pub fn dct_denominator(long_side: u32, min_long_side: Option<u32>) -> u32 {
    let Some(min) = min_long_side else { return 1 };
    let min = min.max(1);
    [8u32, 4, 2].into_iter().find(|&d| long_side.div_ceil(d) >= min).unwrap_or(1)
}

/// For a JPEG-only backend: `None` when `bytes` are a JPEG (the backend decodes them), else the decode by the
/// `image` backend when it is compiled in, or an "unsupported" error naming `backend`.
#[cfg(any(feature = "turbojpeg", feature = "nvjpeg"))]
pub(crate) fn non_jpeg(
    backend: &'static str,
    bytes: &[u8],
    max_pixels: u64,
    out: &mut sluice_core::ImageRgb8,
) -> Option<crate::Result<sluice_core::DecodeInfo>> {
    match Format::sniff(bytes) {
        Some(Format::Jpeg) => None,
        #[cfg(feature = "image")]
        Some(_) => Some(crate::image_backend::ImageDecoder::new().with_max_pixels(max_pixels).decode_rgb(
            bytes,
            sluice_core::DecodeHint::default(),
            out,
        )),
        _ => {
            let _ = (max_pixels, &out);
            Some(Err(crate::DecodeError::Unsupported {
                backend,
                len: bytes.len(),
                head: crate::DecodeError::head(bytes),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffs_magic_numbers() {
        assert_eq!(Format::sniff(&[0xFF, 0xD8, 0xFF, 0xE0]), Some(Format::Jpeg));
        assert_eq!(Format::sniff(b"\x89PNG\r\n\x1a\n...."), Some(Format::Png));
        assert_eq!(Format::sniff(b"RIFF\0\0\0\0WEBPVP8L"), Some(Format::WebP));
        assert_eq!(Format::sniff(b"BM"), Some(Format::Bmp));
        assert_eq!(Format::sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(Format::sniff(&[]), None);
    }

    #[test]
    fn dct_scale_only_when_source_is_twice_the_target() {
        assert_eq!(dct_denominator(640, None), 1);
        assert_eq!(dct_denominator(640, Some(640)), 1);
        assert_eq!(dct_denominator(1278, Some(640)), 1);
        assert_eq!(dct_denominator(1279, Some(640)), 2); // ceil(1279 / 2) = 640 is still enough.
        assert_eq!(dct_denominator(1280, Some(640)), 2);
        assert_eq!(dct_denominator(2560, Some(640)), 4);
        assert_eq!(dct_denominator(4000, Some(320)), 8);
        assert_eq!(dct_denominator(640, Some(320)), 2);
        assert_eq!(dct_denominator(641, Some(320)), 2); // ceil(641 / 2) = 321 >= 320.
        assert_eq!(dct_denominator(100, Some(0)), 8);
    }

    #[test]
    fn header_walk_survives_garbage_and_truncation() {
        let mut bytes = vec![0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x10];
        bytes.extend_from_slice(b"Exif\0\0");
        assert_eq!(jpeg_header(&bytes).exif, None); // Segment runs past the end.
        bytes.extend_from_slice(&[0; 8]);
        assert_eq!(jpeg_header(&bytes).exif, Some(&[0u8; 8][..]));
        assert_eq!(jpeg_header(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x00]).exif, None); // Length < 2.
        assert_eq!(
            jpeg_orientation(&[0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x08, b'E', b'x', b'i', b'f', 0, 0]),
            Orientation::Normal
        );
        assert_eq!(jpeg_orientation(b"garbage"), Orientation::Normal);
    }

    #[test]
    fn header_walk_reads_the_frame_size_as_stored() {
        let frame = |name: &str| {
            let bytes = std::fs::read(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).expect("fixture");
            jpeg_header(&bytes).frame
        };
        assert_eq!(frame("coco_643.jpg"), Some((500, 375))); // Baseline (SOF0).
        assert_eq!(frame("progressive.jpg"), Some((160, 120))); // SOF2.
        assert_eq!(frame("exif_orient6.jpg"), Some((120, 160))); // Stored size, before the EXIF rotation.
        // A DHT segment (C4) is not a frame; a frame segment too short for its sizes is ignored.
        let dht = [0xFF, 0xD8, 0xFF, 0xC4, 0x00, 0x07, 0, 1, 2, 3, 4];
        assert_eq!(jpeg_header(&dht).frame, None);
        assert_eq!(jpeg_header(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x05, 8, 0, 1]).frame, None);
        assert_eq!(jpeg_header(&[0xFF, 0xD8, 0xFF, 0xC0, 0x00, 0x07, 8, 0, 2, 0, 3]).frame, Some((3, 2)));
    }
}
