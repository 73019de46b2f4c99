//! `PackedReader`: a shard opened with `memmap2`; record bytes are served as slices of the map, checked against
//! their crc32 on every read unless told otherwise.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use sluice_core::{Reader, SampleId};

use super::format::{ENTRY_LEN, Entry, HEADER_LEN, Header};
use crate::error::{Result, StorageError};

/// When record checksums are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// On every read (crc32 runs at several GB/s, far faster than decoding the image).
    #[default]
    EveryRead,
    /// Never on reads; call [`PackedReader::verify_all`] once instead.
    Never,
}

/// One record of a shard, borrowed from the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record's name (its source path when packed by `pack`).
    pub name: &'a str,
    /// The encoded image.
    pub image: &'a [u8],
    /// The label bytes.
    pub labels: &'a [u8],
}

/// A read-only, memory-mapped shard. All offsets are validated on open; reads never copy.
///
/// Like every mmap-based reader, it relies on the file not being truncated or rewritten in place while it is
/// mapped (a SIGBUS otherwise). [`super::ShardWriter`] never does that: it writes a new file and renames it.
#[derive(Debug)]
pub struct PackedReader {
    path: PathBuf,
    map: Mmap,
    entries: Vec<Entry>,
    names: (usize, usize),
    verify: Verify,
}

impl PackedReader {
    /// Opens and validates `path` (header, index checksum, every record's and name's bounds).
    pub fn open(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let file = File::open(&path).map_err(|e| StorageError::io(&path, e))?;
        let len = file.metadata().map_err(|e| StorageError::io(&path, e))?.len();
        if len < HEADER_LEN as u64 {
            return Err(StorageError::bad_shard(
                &path,
                format!("file is {len} bytes, shorter than the {HEADER_LEN}-byte header"),
            ));
        }
        // SAFETY: the map is read-only and private to this reader. The usual mmap caveat applies: the file must
        // not be truncated or modified in place while mapped (documented on the type); Sluice's writer never does.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| StorageError::io(&path, e))?;
        Self::from_map(path, map)
    }

    fn from_map(path: PathBuf, map: Mmap) -> Result<Self> {
        let bytes: &[u8] = &map;
        let header = Header::decode(bytes, bytes.len() as u64, &path)?;
        // The header check guarantees index and names lie inside the file and end exactly at its end.
        let (index_start, names_start) = (header.index_offset as usize, header.names_offset as usize);
        let names_end = names_start + header.names_len as usize;
        let actual = crc32fast::hash(&bytes[index_start..names_end]);
        if actual != header.index_crc {
            return Err(StorageError::bad_shard(
                &path,
                format!("index checksum {actual:08x} does not match the stored {:08x}", header.index_crc),
            ));
        }
        let mut entries = Vec::with_capacity(header.count as usize);
        for (id, raw) in bytes[index_start..names_start].chunks_exact(ENTRY_LEN).enumerate() {
            let e = Entry::decode(raw);
            let in_data = e.offset >= HEADER_LEN as u64 && e.end().is_some_and(|end| end <= header.index_offset);
            let name_end = u64::from(e.name_offset) + u64::from(e.name_len);
            if !in_data || name_end > header.names_len {
                return Err(StorageError::bad_shard(
                    &path,
                    format!(
                        "index entry {id} points outside the file (record at {}, name at {})",
                        e.offset, e.name_offset
                    ),
                ));
            }
            let name = &bytes[names_start + e.name_offset as usize..names_start + name_end as usize];
            if std::str::from_utf8(name).is_err() {
                return Err(StorageError::bad_shard(&path, format!("index entry {id} has a name that is not UTF-8")));
            }
            entries.push(e);
        }
        Ok(Self { path, map, entries, names: (names_start, names_end), verify: Verify::default() })
    }

    /// Sets when checksums are checked.
    pub fn with_verify(mut self, verify: Verify) -> Self {
        self.verify = verify;
        self
    }

    /// The shard file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the mapped file in bytes.
    pub fn file_bytes(&self) -> usize {
        self.map.len()
    }

    fn entry(&self, id: SampleId) -> Result<&Entry> {
        usize::try_from(id).ok().and_then(|i| self.entries.get(i)).ok_or_else(|| StorageError::OutOfRange {
            what: self.path.display().to_string(),
            id,
            len: self.entries.len(),
        })
    }

    fn name_of(&self, e: &Entry) -> &str {
        let start = self.names.0 + e.name_offset as usize;
        // Validated as UTF-8 on open.
        std::str::from_utf8(&self.map[start..start + e.name_len as usize]).unwrap_or("<invalid name>")
    }

    fn checked(&self, id: SampleId, verify: bool) -> Result<Record<'_>> {
        let e = self.entry(id)?;
        let start = e.offset as usize;
        let mid = start + e.image_len as usize;
        let end = mid + e.label_len as usize;
        let bytes = &self.map[start..end];
        if verify {
            let actual = crc32fast::hash(bytes);
            if actual != e.crc {
                return Err(StorageError::CorruptRecord {
                    path: self.path.clone(),
                    id,
                    name: self.name_of(e).to_owned(),
                    expected: e.crc,
                    actual,
                });
            }
        }
        Ok(Record { name: self.name_of(e), image: &bytes[..mid - start], labels: &bytes[mid - start..] })
    }

    /// Record `id` (name, image, labels), checksum-checked according to [`Verify`].
    pub fn record(&self, id: SampleId) -> Result<Record<'_>> {
        self.checked(id, self.verify == Verify::EveryRead)
    }

    /// The encoded image of record `id`.
    pub fn image(&self, id: SampleId) -> Result<&[u8]> {
        Ok(self.record(id)?.image)
    }

    /// The label bytes of record `id`.
    pub fn labels(&self, id: SampleId) -> Result<&[u8]> {
        Ok(self.record(id)?.labels)
    }

    /// The name of record `id`.
    pub fn name(&self, id: SampleId) -> Result<&str> {
        Ok(self.name_of(self.entry(id)?))
    }

    /// Checks every record's checksum; returns the errors of the corrupt ones (empty when all are intact).
    pub fn verify_all(&self) -> Vec<StorageError> {
        (0..self.entries.len() as u64).filter_map(|id| self.checked(id, true).err()).collect()
    }

    /// Number of records.
    pub fn records(&self) -> usize {
        self.entries.len()
    }
}

impl Reader for PackedReader {
    fn read<'a>(&'a self, id: SampleId, _scratch: &'a mut Vec<u8>) -> sluice_core::Result<&'a [u8]> {
        Ok(self.image(id)?)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}
