//! The crate's error type: every variant names the file (and line, where there is one) that caused it.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = DatasetError> = std::result::Result<T, E>;

/// Errors of dataset loading, validation, caching, COCO conversion and generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DatasetError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder concerned.
        path: PathBuf,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// A YAML file is not valid YAML.
    #[error("{}: invalid YAML: {source}", path.display())]
    Yaml {
        /// The YAML file.
        path: PathBuf,
        /// The parser's error (it carries the line and column).
        source: serde_yaml_ng::Error,
    },
    /// A dataset YAML is valid YAML but not a valid dataset description.
    #[error("{}: {reason}", path.display())]
    Config {
        /// The dataset YAML.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A label row is invalid (the whole image/label pair is skipped, as in Ultralytics).
    #[error("{}:{line}: {reason}", path.display())]
    Label {
        /// The label file.
        path: PathBuf,
        /// 1-based line number in the file.
        line: usize,
        /// What is wrong with the row.
        reason: String,
    },
    /// A label file as a whole cannot be used (not UTF-8, unreadable).
    #[error("{}: {reason}", path.display())]
    LabelFile {
        /// The label file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// An image file is corrupt, too small or of an unsupported format.
    #[error("{}: {reason}", path.display())]
    Image {
        /// The image file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A JSON file (COCO annotations, label cache) is invalid.
    #[error("{}: {reason}", path.display())]
    Json {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A value is out of its allowed range.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was invalid.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

impl DatasetError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }
}

impl From<DatasetError> for sluice_core::Error {
    fn from(e: DatasetError) -> Self {
        match e {
            DatasetError::Io { path, source } => sluice_core::Error::Io { path, source },
            DatasetError::Label { path, line, reason } => sluice_core::Error::Label { path, line, reason },
            other => sluice_core::Error::other(other),
        }
    }
}
