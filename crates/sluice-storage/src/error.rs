//! The storage crate's error type: every message names the file, and the sample / record id where there is one.

use std::path::PathBuf;

use sluice_core::SampleId;

/// What went wrong while reading or writing sample bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// An I/O error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Reading the file of one sample failed.
    #[error("sample {id} ({}): {source}", path.display())]
    Sample {
        /// The sample id.
        id: SampleId,
        /// Its file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A sample id past the end.
    #[error("{what}: sample {id} out of range (it serves {len} samples)")]
    OutOfRange {
        /// The reader (e.g. a shard path).
        what: String,
        /// The requested id.
        id: SampleId,
        /// How many samples there are.
        len: usize,
    },
    /// The shard file is not a valid shard: wrong magic, unsupported version, truncated, inconsistent index.
    #[error("{}: not a valid sluice shard: {reason}", path.display())]
    BadShard {
        /// The shard file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One record's checksum does not match its bytes.
    #[error("{}: record {id} ({name}) is corrupt: crc32 {actual:08x}, expected {expected:08x}", path.display())]
    CorruptRecord {
        /// The shard file.
        path: PathBuf,
        /// The record (sample) id.
        id: SampleId,
        /// The record's name (its source path when packed).
        name: String,
        /// The checksum in the index.
        expected: u32,
        /// The checksum of the bytes.
        actual: u32,
    },
    /// A record cannot be written (too large for the format, empty name...).
    #[error("{}: cannot write record {name}: {reason}", path.display())]
    BadRecord {
        /// The shard being written.
        path: PathBuf,
        /// The record's name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The file system has too little free space for what is about to be written.
    #[error(
        "{}: {free} bytes free, {what} needs {need} bytes ({:.2} GB); free space or choose another folder",
        dir.display(),
        *need as f64 / 1e9
    )]
    NoSpace {
        /// The folder written to.
        dir: PathBuf,
        /// Bytes free for an unprivileged writer.
        free: u64,
        /// Bytes needed.
        need: u64,
        /// What would be written.
        what: String,
    },
    /// An object of an object store could not be read (the message names the object and why).
    #[error("{url}: {reason}")]
    Remote {
        /// The object's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// Encoded labels cannot be decoded.
    #[error("labels of sample {id}: {reason}")]
    BadLabels {
        /// The sample id.
        id: SampleId,
        /// What is wrong.
        reason: String,
    },
}

impl StorageError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    pub(crate) fn bad_shard(path: &std::path::Path, reason: impl Into<String>) -> Self {
        Self::BadShard { path: path.to_path_buf(), reason: reason.into() }
    }
}

impl From<StorageError> for sluice_core::Error {
    fn from(err: StorageError) -> Self {
        match err {
            StorageError::Io { path, source } => sluice_core::Error::Io { path, source },
            other => sluice_core::Error::other(other),
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
