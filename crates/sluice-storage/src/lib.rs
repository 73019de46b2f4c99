//! Sluice's byte readers, implementing [`sluice_core::Reader`] (sample id → encoded image bytes):
//!
//! - [`FileReader`]: one file per sample, read into the caller's reused scratch buffer;
//! - [`PackedReader`]: one shard file (see [`shard`] for the layout) mapped with `memmap2`, bytes served as
//!   slices of the map, every record crc32-checked so corruption is reported with the record id, and a truncated
//!   or corrupt shard refused on open with a clear error;
//! - [`ShardWriter`] / [`pack_files`]: write a shard atomically (temporary file + rename);
//! - [`CachedReader`]: a RAM cache with a byte budget in front of any reader, shared by all threads, reporting
//!   its usage ([`CacheUsage`]);
//! - [`ensure_free_space`]: a full disk named before a large write, with the bytes needed;
//! - `remote` (feature `object-store`): a shard in object storage (`s3://`, `gs://`, `az://`, `https://`) staged
//!   onto local disk by parallel ranged reads, reused while the object is unchanged;
//! - [`encode_labels`] / [`decode_labels`]: the binary label encoding `sluice pack` stores next to each image.
#![warn(missing_docs)]

mod cache;
mod error;
mod file;
mod labels;
mod pack;
#[cfg(feature = "object-store")]
pub mod remote;
pub mod shard;
mod space;

pub use cache::{CacheUsage, CachedReader};
pub use error::{Result, StorageError};
pub use file::FileReader;
pub use labels::{decode_labels, encode_labels};
pub use pack::pack_files;
pub use shard::{PackSummary, PackedReader, Record, ShardWriter, Verify};
pub use space::ensure_free_space;
