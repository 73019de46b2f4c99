//! A compact binary encoding of [`ImageLabels`] for the label bytes of shard records: little-endian `width u32,
//! height u32, count u32`, then per object `class u32, x1 f32, y1 f32, x2 f32, y2 f32` (exact round trip).

use sluice_core::{BoxXyxy, ImageLabels, Label, SampleId};

use crate::error::{Result, StorageError};

const HEAD: usize = 12;
const OBJECT: usize = 20;

/// Appends the encoding of `labels` to `out`.
pub fn encode_labels(labels: &ImageLabels, out: &mut Vec<u8>) {
    out.reserve(HEAD + OBJECT * labels.objects.len());
    out.extend_from_slice(&labels.width.to_le_bytes());
    out.extend_from_slice(&labels.height.to_le_bytes());
    out.extend_from_slice(&(labels.objects.len() as u32).to_le_bytes());
    for o in &labels.objects {
        out.extend_from_slice(&o.class.to_le_bytes());
        for v in [o.bbox.x1, o.bbox.y1, o.bbox.x2, o.bbox.y2] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Decodes label bytes of sample `id` (the id only names the sample in errors).
pub fn decode_labels(id: SampleId, bytes: &[u8]) -> Result<ImageLabels> {
    let bad = |reason: String| StorageError::BadLabels { id, reason };
    if bytes.len() < HEAD {
        return Err(bad(format!("{} bytes, shorter than the {HEAD}-byte head", bytes.len())));
    }
    let word = |at: usize| {
        let mut a = [0u8; 4];
        a.copy_from_slice(&bytes[at..at + 4]);
        a
    };
    let count = u32::from_le_bytes(word(8)) as usize;
    let need = count.checked_mul(OBJECT).and_then(|n| n.checked_add(HEAD));
    if need != Some(bytes.len()) {
        return Err(bad(format!("{} bytes do not hold the {count} objects announced", bytes.len())));
    }
    let objects = (0..count)
        .map(|i| {
            let at = HEAD + i * OBJECT;
            let f = |k: usize| f32::from_le_bytes(word(at + 4 + 4 * k));
            Label { class: u32::from_le_bytes(word(at)), bbox: BoxXyxy::new(f(0), f(1), f(2), f(3)) }
        })
        .collect();
    Ok(ImageLabels { width: u32::from_le_bytes(word(0)), height: u32::from_le_bytes(word(4)), objects })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_bad_lengths() {
        let labels = ImageLabels {
            width: 640,
            height: 480,
            objects: vec![
                Label { class: 3, bbox: BoxXyxy::new(1.5, 2.25, 100.0, 200.125) },
                Label { class: 0, bbox: BoxXyxy::new(0.0, 0.0, 640.0, 480.0) },
            ],
        };
        let mut bytes = Vec::new();
        encode_labels(&labels, &mut bytes);
        assert_eq!(bytes.len(), 12 + 2 * 20);
        assert_eq!(decode_labels(0, &bytes).expect("valid"), labels);
        let err = decode_labels(5, &bytes[..30]).expect_err("short").to_string();
        assert!(err.contains("sample 5"), "{err}");
        assert!(decode_labels(5, &bytes[..4]).is_err());
        let mut huge = bytes.clone();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_labels(5, &huge).is_err());
    }
}
