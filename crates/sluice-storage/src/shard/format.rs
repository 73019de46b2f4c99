//! The byte layout of a shard's header and index entries (see the module docs of `shard`).

use std::path::Path;

use crate::error::{Result, StorageError};

/// The first 8 bytes of every shard.
pub const MAGIC: &[u8; 8] = b"SLUICESH";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Header size in bytes; records start here.
pub(crate) const HEADER_LEN: usize = 64;
/// Size of one index entry in bytes.
pub(crate) const ENTRY_LEN: usize = 32;

/// The decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Header {
    pub(crate) count: u64,
    pub(crate) index_offset: u64,
    pub(crate) names_offset: u64,
    pub(crate) names_len: u64,
    pub(crate) index_crc: u32,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.index_offset.to_le_bytes());
        b[32..40].copy_from_slice(&self.names_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.names_len.to_le_bytes());
        b[48..52].copy_from_slice(&self.index_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks the header of a `file_len`-byte file: magic, version, header checksum, and that the
    /// index and names fill the file exactly up to its end.
    pub(crate) fn decode(bytes: &[u8], file_len: u64, path: &Path) -> Result<Self> {
        let bad = |reason: String| StorageError::bad_shard(path, reason);
        if bytes.len() < HEADER_LEN {
            return Err(bad(format!("file is {} bytes, shorter than the {HEADER_LEN}-byte header", bytes.len())));
        }
        if &bytes[0..8] != MAGIC {
            return Err(bad(format!("wrong magic {:02x?} (expected \"SLUICESH\")", &bytes[0..8])));
        }
        let version = u32_at(bytes, 8);
        if version != FORMAT_VERSION {
            return Err(bad(format!("format version {version}, this build reads version {FORMAT_VERSION}")));
        }
        let (stored, actual) = (u32_at(bytes, 60), crc32fast::hash(&bytes[..60]));
        if stored != actual {
            return Err(bad(format!("header checksum {actual:08x} does not match the stored {stored:08x}")));
        }
        let h = Header {
            count: u64_at(bytes, 16),
            index_offset: u64_at(bytes, 24),
            names_offset: u64_at(bytes, 32),
            names_len: u64_at(bytes, 40),
            index_crc: u32_at(bytes, 48),
        };
        let index_end = h
            .count
            .checked_mul(ENTRY_LEN as u64)
            .and_then(|n| n.checked_add(h.index_offset))
            .ok_or_else(|| bad(format!("record count {} overflows", h.count)))?;
        if h.index_offset < HEADER_LEN as u64 || index_end != h.names_offset {
            return Err(bad(format!(
                "inconsistent index: {} records at offset {}, names at offset {}",
                h.count, h.index_offset, h.names_offset
            )));
        }
        let end = h.names_offset.checked_add(h.names_len).ok_or_else(|| bad("names length overflows".into()))?;
        if end != file_len {
            return Err(bad(if end > file_len {
                format!("truncated: the index says {end} bytes, the file has {file_len}")
            } else {
                format!("{} unexpected bytes after the end of the shard ({end} bytes)", file_len - end)
            }));
        }
        Ok(h)
    }
}

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Entry {
    pub(crate) offset: u64,
    pub(crate) image_len: u32,
    pub(crate) label_len: u32,
    pub(crate) name_offset: u32,
    pub(crate) name_len: u32,
    pub(crate) crc: u32,
}

impl Entry {
    pub(crate) fn encode(&self) -> [u8; ENTRY_LEN] {
        let mut b = [0u8; ENTRY_LEN];
        b[0..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..12].copy_from_slice(&self.image_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.label_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.name_offset.to_le_bytes());
        b[20..24].copy_from_slice(&self.name_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Decodes entry bytes (exactly [`ENTRY_LEN`] of them).
    pub(crate) fn decode(b: &[u8]) -> Self {
        Entry {
            offset: u64_at(b, 0),
            image_len: u32_at(b, 8),
            label_len: u32_at(b, 12),
            name_offset: u32_at(b, 16),
            name_len: u32_at(b, 20),
            crc: u32_at(b, 24),
        }
    }

    /// End of the record's bytes (image + labels), `None` on overflow.
    pub(crate) fn end(&self) -> Option<u64> {
        self.offset.checked_add(u64::from(self.image_len))?.checked_add(u64::from(self.label_len))
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_entry_round_trip() {
        let h = Header { count: 2, index_offset: 100, names_offset: 164, names_len: 10, index_crc: 7 };
        let path = Path::new("x.sluice");
        assert_eq!(Header::decode(&h.encode(), 174, path).expect("valid"), h);
        let e = Entry { offset: 64, image_len: 3, label_len: 4, name_offset: 5, name_len: 6, crc: 0xdead_beef };
        assert_eq!(Entry::decode(&e.encode()), e);
    }

    #[test]
    fn header_checks_name_the_problem() {
        let h = Header { count: 2, index_offset: 100, names_offset: 164, names_len: 10, index_crc: 7 };
        let path = Path::new("x.sluice");
        let msg = |r: Result<Header>| r.expect_err("invalid").to_string();
        assert!(msg(Header::decode(&h.encode(), 170, path)).contains("truncated"));
        assert!(msg(Header::decode(&h.encode(), 180, path)).contains("unexpected bytes"));
        assert!(msg(Header::decode(&h.encode()[..10], 10, path)).contains("shorter than"));
        let mut b = h.encode();
        b[17] ^= 1;
        assert!(msg(Header::decode(&b, 174, path)).contains("header checksum"));
        let mut b = h.encode();
        b[0] = b'X';
        assert!(msg(Header::decode(&b, 174, path)).contains("wrong magic"));
        let bad = Header { count: u64::MAX, ..h };
        assert!(msg(Header::decode(&bad.encode(), 174, path)).contains("overflows"));
        let bad = Header { names_offset: 200, ..h };
        assert!(msg(Header::decode(&bad.encode(), 210, path)).contains("inconsistent index"));
    }
}
