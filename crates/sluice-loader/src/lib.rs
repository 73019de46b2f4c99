//! Sluice's data loading: the CPU stages wired into the loaders the trainer, the validator and the benches share.
//!
//! - [`TrainLoader`] and [`ValLoader`]: the sampler's recipes executed on the pipeline runner (decode → augment
//!   straight into pooled batch slots), byte-identical batches for any worker count.
//! - [`DecodedSource`]: read → decode to the training size → labels, with a RAM cache under a byte budget shared by
//!   every worker ([`CacheMode`]); the bytes come from the reader the user chooses ([`SourceKind`]: the image
//!   files, or a packed shard made by `sluice pack`).
//! - [`node_cache`]: one file of decoded images per machine, mapped by every rank of a data-parallel run
//!   ([`NodeCache`], attached with [`DecodedSource::with_node_cache`]).
//! - [`split`]: one split of a `data.yaml` indexed as the trainer does, and packing it into a shard.
//! - [`telemetry`]: where a loader-fed loop's time went and which stage bounds it.
//! - [`bench`](mod@bench): the loader, decode and read stage benchmarks (`sluice bench loader|decode|read`).
#![warn(missing_docs)]

pub mod bench;
mod cache;
mod loader;
pub mod node_cache;
mod source;
pub mod split;
pub mod telemetry;

pub use cache::{CacheMode, ParseCacheModeError, ParseReadFromError, ReadFrom, disk_cache_path};
pub use loader::{LoaderConfig, STRIDE, SkipReport, TrainLoader, ValLoader, default_workers};
pub use node_cache::NodeCache;
pub use source::{CacheFile, DecodedSource, RAM_CACHE_BYTES, SourceKind, SourceStats};
pub use split::{
    DataError, LoadedSplit, RemoteConfig, StagedCopy, load_split, load_split_observed, load_split_with, pack_index,
};
