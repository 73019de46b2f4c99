//! The loader settings a user names in a config or on the command line: `cache` (Ultralytics' `cache=ram|disk`:
//! whether decoded images are kept between epochs, in memory or in a mapped file, and the decoded-image source's
//! byte budget that follows) and `source` (whether the images' bytes come from the files or from a packed shard).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sluice_dataset::SampleIndex;

/// Where decoded images are kept between epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Decode every epoch.
    #[default]
    None,
    /// Keep decoded (resized) images in memory.
    Ram,
    /// Keep decoded (resized) images in one memory-mapped file per split and image size ([`disk_cache_path`]),
    /// built on first use and reused by later runs while the images and settings are unchanged.
    Disk,
}

impl CacheMode {
    /// `none`, `ram` or `disk`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ram => "ram",
            Self::Disk => "disk",
        }
    }

    /// The byte budget of the source's in-memory cache in this mode (0 for `disk`: the mapped file holds every
    /// image, and a second copy in memory would defeat it).
    pub fn budget_bytes(self) -> usize {
        match self {
            Self::None | Self::Disk => 0,
            Self::Ram => crate::source::RAM_CACHE_BYTES,
        }
    }
}

/// A `--cache` value that is neither `ram` nor `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cache '{0}': expected ram, disk or none")]
pub struct ParseCacheModeError(String);

impl std::str::FromStr for CacheMode {
    type Err = ParseCacheModeError;

    /// `ram` / `true`, `disk` or `none` / `false` (Ultralytics' `cache=True` means RAM).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "ram" | "true" => Ok(Self::Ram),
            "disk" => Ok(Self::Disk),
            "none" | "false" => Ok(Self::None),
            other => Err(ParseCacheModeError(other.to_string())),
        }
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where `cache: disk` keeps the decoded images of the split `index` at `imgsz`, resized for training (`augment`)
/// or validation: beside the split's label cache (`labels/train2017.640-train.imgcache` for
/// `labels/train2017.cache`), or in `dir` when given, named after the label cache and a hash of its folder so
/// datasets with like-named splits keep apart. `None` for an empty split.
pub fn disk_cache_path(index: &SampleIndex, imgsz: u32, augment: bool, dir: Option<&Path>) -> Option<PathBuf> {
    let images: Vec<PathBuf> = index.samples.iter().take(1).map(|s| s.image.clone()).collect();
    let labels = sluice_dataset::index::cache_path_for(&images)?;
    let stem = labels.file_stem().map_or_else(|| "split".into(), |s| s.to_string_lossy().into_owned());
    let mode = if augment { "train" } else { "val" };
    let name = format!("{imgsz}-{mode}.imgcache");
    Some(match dir {
        None => labels.with_extension(name),
        Some(dir) => {
            // FNV-1a of the label cache's path: stable across runs and processes.
            let hash = labels
                .as_os_str()
                .as_encoded_bytes()
                .iter()
                .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
            dir.join(format!("{stem}-{:08x}.{name}", hash as u32))
        }
    })
}

/// Where a run reads its images' bytes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ReadFrom {
    /// The image files (or the shard a split of the data YAML names).
    #[default]
    Files,
    /// A shard per split, packed beside the split's label cache when absent or stale ([`crate::split::packed`]).
    Packed,
}

/// A `--source` value that is neither `files` nor `packed`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("source '{0}': expected files or packed")]
pub struct ParseReadFromError(String);

impl std::str::FromStr for ReadFrom {
    type Err = ParseReadFromError;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "files" => Ok(Self::Files),
            "packed" => Ok(Self::Packed),
            other => Err(ParseReadFromError(other.to_string())),
        }
    }
}

impl std::fmt::Display for ReadFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Files => "files",
            Self::Packed => "packed",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_of(image: &str) -> SampleIndex {
        let mut index = SampleIndex::default();
        index.samples.push(sluice_dataset::Sample {
            image: PathBuf::from(image),
            format: sluice_dataset::ImageFormat::Jpeg,
            label_file: None,
            labels: Default::default(),
            crowd: Vec::new(),
            image_id: None,
        });
        index
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [CacheMode::None, CacheMode::Ram, CacheMode::Disk] {
            assert_eq!(m.as_str().parse::<CacheMode>(), Ok(m));
        }
        assert_eq!("true".parse::<CacheMode>(), Ok(CacheMode::Ram));
        assert!("ssd".parse::<CacheMode>().is_err());
        assert_eq!(CacheMode::Disk.budget_bytes(), 0);
    }

    #[test]
    fn the_disk_cache_lives_beside_the_label_cache_or_in_the_folder_given() {
        let index = index_of("/d/images/train2017/a.jpg");
        let beside = disk_cache_path(&index, 640, true, None).expect("path");
        assert_eq!(beside, PathBuf::from("/d/labels/train2017.640-train.imgcache"));
        let val = disk_cache_path(&index, 640, false, None).expect("path");
        assert_eq!(val, PathBuf::from("/d/labels/train2017.640-val.imgcache"));
        let other = disk_cache_path(&index_of("/e/images/train2017/a.jpg"), 640, true, Some(Path::new("/c")));
        let here = disk_cache_path(&index, 640, true, Some(Path::new("/c"))).expect("path");
        assert_eq!(here.parent(), Some(Path::new("/c")));
        assert!(here.to_string_lossy().ends_with(".640-train.imgcache"), "{}", here.display());
        assert_ne!(Some(here), other, "like-named splits of two datasets keep apart");
        assert_eq!(disk_cache_path(&SampleIndex::default(), 640, true, None), None);
    }
}
