//! Packing a list of (image file, label bytes) into one shard.

use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};
use crate::shard::{PackSummary, ShardWriter};

/// Packs `items` — each an image file and its label bytes — into the shard `out`, atomically: on any error
/// (a missing image, a full disk) no shard appears at `out` and the error names the file. Records are numbered
/// in the order of `items`, so record `i` is sample `i` of the list; each record's name is its image path.
pub fn pack_files<I>(items: I, out: &Path) -> Result<PackSummary>
where
    I: IntoIterator<Item = (PathBuf, Vec<u8>)>,
{
    let mut writer = ShardWriter::create(out)?;
    let mut image = Vec::new();
    for (path, labels) in items {
        image.clear();
        let mut file = std::fs::File::open(&path).map_err(|e| StorageError::io(&path, e))?;
        std::io::Read::read_to_end(&mut file, &mut image).map_err(|e| StorageError::io(&path, e))?;
        writer.add(&path.to_string_lossy(), &image, &labels)?;
    }
    writer.finish()
}
