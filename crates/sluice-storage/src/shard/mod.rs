//! Packed shards: one file holding many samples, read through `mmap` without copies.
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! header   64 bytes   magic "SLUICESH", version u32, flags u32, record count u64, index offset u64,
//!                     names offset u64, names length u64, crc32 of index + names u32, 8 reserved bytes,
//!                     crc32 of header bytes 0..60 u32
//! records  ...        per record: encoded image bytes, then label bytes (opaque to the shard)
//! index    32 bytes × count: record offset u64, image length u32, label length u32, name offset u32,
//!                     name length u32, crc32 of image + label bytes u32, reserved u32
//! names    ...        UTF-8 record names (the source paths), concatenated
//! ```
//!
//! The file ends exactly at the end of the names, so truncation is always detected on open; every offset is
//! checked against the file before use, so a corrupt index gives an error, never an out-of-bounds access.

mod format;
mod reader;
mod writer;

pub use format::{FORMAT_VERSION, MAGIC};
pub use reader::{PackedReader, Record, Verify};
pub use writer::{PackSummary, ShardWriter};
