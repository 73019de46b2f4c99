//! Test helpers: a minimal `.npy` reader (format 1.0, little-endian, C order) and fixture paths.
#![allow(dead_code, clippy::unwrap_used)]

/// Path of a file in `tests/data`.
pub(crate) fn data(name: &str) -> String {
    format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A `.npy` array: shape, dtype descriptor and raw little-endian bytes.
pub(crate) struct Npy {
    pub(crate) shape: Vec<usize>,
    pub(crate) descr: String,
    pub(crate) bytes: Vec<u8>,
}

pub(crate) fn read_npy(name: &str) -> Npy {
    let raw = std::fs::read(data(name)).unwrap();
    assert_eq!(&raw[..6], b"\x93NUMPY", "{name}: not an npy file");
    assert_eq!(raw[6], 1, "{name}: npy version");
    let hlen = u16::from_le_bytes([raw[8], raw[9]]) as usize;
    let header = std::str::from_utf8(&raw[10..10 + hlen]).unwrap();
    assert!(header.contains("'fortran_order': False"), "{name}: {header}");
    let descr = header.split("'descr': '").nth(1).unwrap().split('\'').next().unwrap().to_string();
    let shape_s = header.split("'shape': (").nth(1).unwrap().split(')').next().unwrap();
    let shape = shape_s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    Npy { shape, descr, bytes: raw[10 + hlen..].to_vec() }
}

impl Npy {
    pub(crate) fn f32(&self) -> Vec<f32> {
        assert_eq!(self.descr, "<f4");
        self.bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }
    pub(crate) fn i64(&self) -> Vec<i64> {
        assert_eq!(self.descr, "<i8");
        self.bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }
    pub(crate) fn bool(&self) -> Vec<bool> {
        assert_eq!(self.descr, "|b1");
        self.bytes.iter().map(|&b| b != 0).collect()
    }
}

pub(crate) fn expected() -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(data("expected.json")).unwrap()).unwrap()
}
