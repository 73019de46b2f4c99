//! `ShardWriter`: streams records into a temporary file next to the target and renames it into place on
//! [`ShardWriter::finish`], so a reader never sees a half-written shard and a failed pack leaves nothing behind.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::format::{ENTRY_LEN, Entry, HEADER_LEN, Header};
use crate::error::{Result, StorageError};

/// What a finished shard holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackSummary {
    /// The shard file.
    pub path: PathBuf,
    /// Number of records.
    pub records: u64,
    /// Sum of the image bytes.
    pub image_bytes: u64,
    /// Sum of the label bytes.
    pub label_bytes: u64,
    /// Size of the shard file.
    pub file_bytes: u64,
}

/// Writes one shard atomically (temporary file + rename).
#[derive(Debug)]
pub struct ShardWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    pos: u64,
    entries: Vec<Entry>,
    names: Vec<u8>,
    image_bytes: u64,
    label_bytes: u64,
}

impl ShardWriter {
    /// Starts a shard that will appear at `path` when finished.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).ok_or_else(|| {
            StorageError::BadRecord { path: path.clone(), name: String::new(), reason: "no file name".into() }
        })?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let tmp = path.with_file_name(format!(".{file_name}.tmp-{}-{nanos}", std::process::id()));
        let file = OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&[0u8; HEADER_LEN]).map_err(|e| StorageError::io(&tmp, e))?;
        Ok(Self {
            path,
            tmp,
            out: Some(out),
            pos: HEADER_LEN as u64,
            entries: Vec::new(),
            names: Vec::new(),
            image_bytes: 0,
            label_bytes: 0,
        })
    }

    /// Appends one record; returns its id (records are numbered from 0 in the order they are added).
    pub fn add(&mut self, name: &str, image: &[u8], labels: &[u8]) -> Result<u64> {
        let bad = |reason: String| StorageError::BadRecord { path: self.path.clone(), name: name.to_owned(), reason };
        let image_len =
            u32::try_from(image.len()).map_err(|_| bad(format!("image of {} bytes > 4 GiB", image.len())))?;
        let label_len =
            u32::try_from(labels.len()).map_err(|_| bad(format!("labels of {} bytes > 4 GiB", labels.len())))?;
        let name_offset = u32::try_from(self.names.len()).map_err(|_| bad("more than 4 GiB of record names".into()))?;
        let name_len = u32::try_from(name.len()).map_err(|_| bad("name longer than 4 GiB".into()))?;
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(image);
        hasher.update(labels);
        let entry = Entry { offset: self.pos, image_len, label_len, name_offset, name_len, crc: hasher.finalize() };
        let out = self.writer()?;
        out.write_all(image).and_then(|()| out.write_all(labels)).map_err(|e| StorageError::io(&self.tmp, e))?;
        self.pos += u64::from(image_len) + u64::from(label_len);
        self.names.extend_from_slice(name.as_bytes());
        self.entries.push(entry);
        self.image_bytes += u64::from(image_len);
        self.label_bytes += u64::from(label_len);
        Ok(self.entries.len() as u64 - 1)
    }

    /// Number of records added so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no record was added yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn writer(&mut self) -> Result<&mut BufWriter<File>> {
        let tmp = &self.tmp;
        self.out.as_mut().ok_or_else(|| StorageError::io(tmp, std::io::Error::other("shard writer already finished")))
    }

    /// Writes the index, the names and the header, syncs the file and renames it to its final path.
    pub fn finish(mut self) -> Result<PackSummary> {
        let tmp = self.tmp.clone();
        let io = |e| StorageError::io(&tmp, e);
        let mut index = Vec::with_capacity(self.entries.len() * ENTRY_LEN);
        for e in &self.entries {
            index.extend_from_slice(&e.encode());
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&index);
        hasher.update(&self.names);
        let header = Header {
            count: self.entries.len() as u64,
            index_offset: self.pos,
            names_offset: self.pos + index.len() as u64,
            names_len: self.names.len() as u64,
            index_crc: hasher.finalize(),
        };
        let mut out = self.out.take().ok_or_else(|| io(std::io::Error::other("shard writer already finished")))?;
        out.write_all(&index).map_err(io)?;
        out.write_all(&self.names).map_err(io)?;
        out.seek(SeekFrom::Start(0)).map_err(io)?;
        out.write_all(&header.encode()).map_err(io)?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        let file_bytes = file.metadata().map_err(io)?.len();
        drop(file);
        std::fs::rename(&tmp, &self.path).map_err(|e| StorageError::io(&self.path, e))?;
        sync_dir(&self.path);
        Ok(PackSummary {
            path: self.path.clone(),
            records: header.count,
            image_bytes: self.image_bytes,
            label_bytes: self.label_bytes,
            file_bytes,
        })
    }
}

/// Best effort: makes the rename durable by syncing the parent directory.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(d) = File::open(dir)
    {
        let _ = d.sync_all();
    }
}

impl Drop for ShardWriter {
    fn drop(&mut self) {
        // Not finished (an error, or the caller gave up): remove the temporary file.
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
