//! The loader settings a user names in a config or on the command line: `cache` (Ultralytics' `cache=ram`:
//! whether decoded images are kept between epochs, and the decoded-image source's byte budget that follows) and
//! `source` (whether the images' bytes come from the files or from a packed shard).

use serde::{Deserialize, Serialize};

/// Where decoded images are kept between epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Decode every epoch.
    #[default]
    None,
    /// Keep decoded (resized) images in memory.
    Ram,
}

impl CacheMode {
    /// `none` or `ram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Ram => "ram",
        }
    }

    /// The decoded-image cache's byte budget in this mode.
    pub fn budget_bytes(self) -> usize {
        match self {
            Self::None => 0,
            Self::Ram => crate::source::RAM_CACHE_BYTES,
        }
    }
}

/// A `--cache` value that is neither `ram` nor `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cache '{0}': expected ram or none")]
pub struct ParseCacheModeError(String);

impl std::str::FromStr for CacheMode {
    type Err = ParseCacheModeError;

    /// `ram` / `true` or `none` / `false` (Ultralytics' `cache=True` means RAM).
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s {
            "ram" | "true" => Ok(Self::Ram),
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
