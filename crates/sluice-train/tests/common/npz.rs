//! A reader for the `.npz` files `np.savez_compressed` writes (a zip archive of `.npy` members, stored or
//! deflated): the members are found through the zip central directory (with its zip64 extra fields, which NumPy
//! always writes), inflated with `flate2`, and their `.npy` headers parsed for the dtype and shape. candle's own
//! `read_npz` cannot be used: the workspace builds `zip` without deflate support.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// One array: NumPy's dtype string (`<f4`, `|u1`, `<f8`, `<i8`, …), its shape and its raw little-endian bytes.
#[derive(Debug, Clone)]
pub(crate) struct Array {
    pub(crate) descr: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<u8>,
}

impl Array {
    fn expect(&self, descr: &str) {
        assert_eq!(self.descr, descr, "array dtype");
    }

    pub(crate) fn u8(&self) -> &[u8] {
        self.expect("|u1");
        &self.data
    }

    pub(crate) fn f32(&self) -> Vec<f32> {
        self.expect("<f4");
        self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    pub(crate) fn f64(&self) -> Vec<f64> {
        self.expect("<f8");
        self.data.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    pub(crate) fn i64(&self) -> Vec<i64> {
        self.expect("<i8");
        self.data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }
}

fn u16_at(b: &[u8], o: usize) -> usize {
    u16::from_le_bytes([b[o], b[o + 1]]) as usize
}

fn u32_at(b: &[u8], o: usize) -> u64 {
    u64::from(u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]))
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Every member of the archive at `path`, by name without the `.npy` suffix.
pub(crate) fn read(path: &Path) -> HashMap<String, Array> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // End of central directory: the last occurrence of its signature.
    let eocd = (0..=bytes.len() - 22)
        .rev()
        .find(|&o| bytes[o..o + 4] == [0x50, 0x4b, 0x05, 0x06])
        .expect("no zip end-of-central-directory record");
    let entries = u16_at(&bytes, eocd + 10);
    let mut at = u32_at(&bytes, eocd + 16) as usize;
    let mut out = HashMap::new();
    for _ in 0..entries {
        assert_eq!(bytes[at..at + 4], [0x50, 0x4b, 0x01, 0x02], "central directory entry");
        let method = u16_at(&bytes, at + 10);
        let mut comp = u32_at(&bytes, at + 20);
        let mut size = u32_at(&bytes, at + 24);
        let (name_len, extra_len, comment_len) =
            (u16_at(&bytes, at + 28), u16_at(&bytes, at + 30), u16_at(&bytes, at + 32));
        let mut local = u32_at(&bytes, at + 42);
        let name = String::from_utf8(bytes[at + 46..at + 46 + name_len].to_vec()).unwrap();
        // The zip64 extra field holds, in this order, the fields whose 32-bit slots are 0xFFFFFFFF.
        let mut e = at + 46 + name_len;
        let end = e + extra_len;
        while e + 4 <= end {
            let (id, len) = (u16_at(&bytes, e), u16_at(&bytes, e + 2));
            if id == 1 {
                let mut f = e + 4;
                for slot in [&mut size, &mut comp, &mut local] {
                    if *slot == 0xFFFF_FFFF {
                        *slot = u64_at(&bytes, f);
                        f += 8;
                    }
                }
            }
            e += 4 + len;
        }
        at = end + comment_len;
        let l = local as usize;
        assert_eq!(bytes[l..l + 4], [0x50, 0x4b, 0x03, 0x04], "local header of {name}");
        let start = l + 30 + u16_at(&bytes, l + 26) + u16_at(&bytes, l + 28);
        let raw = &bytes[start..start + comp as usize];
        let npy = match method {
            0 => raw.to_vec(),
            8 => {
                let mut v = Vec::with_capacity(size as usize);
                flate2::read::DeflateDecoder::new(raw).read_to_end(&mut v).unwrap();
                v
            }
            m => panic!("{name}: zip compression method {m} not supported"),
        };
        assert_eq!(npy.len() as u64, size, "{name}: inflated size");
        out.insert(name.trim_end_matches(".npy").to_string(), parse_npy(&name, npy));
    }
    out
}

/// A `.npy` file (format 1.0–3.0, C order).
fn parse_npy(name: &str, b: Vec<u8>) -> Array {
    assert_eq!(&b[..6], b"\x93NUMPY", "{name}: not an .npy member");
    let (header_len, off) = if b[6] == 1 { (u16_at(&b, 8), 10) } else { (u32_at(&b, 8) as usize, 12) };
    let header = std::str::from_utf8(&b[off..off + header_len]).unwrap();
    let field = |key: &str| -> &str {
        let i = header.find(key).unwrap_or_else(|| panic!("{name}: no {key} in {header}")) + key.len();
        header[i..].trim_start_matches([':', ' '])
    };
    let descr = field("'descr'").trim_start_matches('\'').split('\'').next().unwrap().to_string();
    assert!(field("'fortran_order'").starts_with("False"), "{name}: Fortran order");
    let shape_str = field("'shape'");
    let shape: Vec<usize> = shape_str[1..shape_str.find(')').unwrap()]
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let data = b[off + header_len..].to_vec();
    let item: usize = descr[2..].parse().unwrap();
    assert_eq!(data.len(), shape.iter().product::<usize>() * item, "{name}: data size for {descr} {shape:?}");
    Array { descr, shape, data }
}
