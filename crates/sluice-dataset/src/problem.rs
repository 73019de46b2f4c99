//! Problems found while indexing a dataset: each names its file (and line), has a kind and a severity, so a
//! check can group them by kind and a user can find and fix them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What kind of problem it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemKind {
    /// The image cannot be read, is corrupt, smaller than 10 px or of an unsupported format: skipped.
    CorruptImage,
    /// A label row is invalid (column count, non-number, class out of range, coordinates far outside
    /// `[0, 1]`): the image and its labels are skipped, as Ultralytics does.
    CorruptLabel,
    /// A JPEG without its end-of-image marker (Ultralytics re-saves such files; Sluice reports and uses it).
    CorruptJpeg,
    /// No label file: the image is used as a background image.
    MissingLabel,
    /// An empty label file: the image is used as a background image.
    EmptyLabel,
    /// Duplicate label rows were removed.
    DuplicateLabels,
    /// Coordinates slightly outside `[0, 1]` (within Ultralytics' 1% tolerance) were clipped to the image.
    Clipped,
    /// A box with zero width or height (after clipping) was dropped.
    ZeroArea,
    /// A label file with no image next to it: ignored.
    OrphanLabel,
    /// A COCO annotation that refers to an unknown image or category: ignored.
    BadAnnotation,
}

impl ProblemKind {
    /// The kind's snake_case name (the JSON key of `sluice data check`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::CorruptImage => "corrupt_image",
            Self::CorruptLabel => "corrupt_label",
            Self::CorruptJpeg => "corrupt_jpeg",
            Self::MissingLabel => "missing_label",
            Self::EmptyLabel => "empty_label",
            Self::DuplicateLabels => "duplicate_labels",
            Self::Clipped => "clipped",
            Self::ZeroArea => "zero_area",
            Self::OrphanLabel => "orphan_label",
            Self::BadAnnotation => "bad_annotation",
        }
    }

    /// How serious the kind is.
    pub fn severity(&self) -> Severity {
        match self {
            Self::CorruptImage | Self::CorruptLabel => Severity::Skipped,
            Self::CorruptJpeg | Self::DuplicateLabels | Self::Clipped | Self::ZeroArea | Self::BadAnnotation => {
                Severity::Fixed
            }
            Self::MissingLabel | Self::EmptyLabel | Self::OrphanLabel => Severity::Info,
        }
    }
}

/// What happened because of a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The image was left out of the index.
    Skipped,
    /// The data was repaired (rows clipped, dropped or deduplicated) and used.
    Fixed,
    /// Worth knowing, nothing was changed (background images, ignored orphan files).
    Info,
}

/// One problem, naming its file and, for a label row, its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    /// The kind.
    pub kind: ProblemKind,
    /// The file concerned (image, label file or annotation file).
    pub file: PathBuf,
    /// The 1-based line in `file`, for label rows.
    pub line: Option<usize>,
    /// A message in Ultralytics' wording where it has one.
    pub message: String,
}

impl Problem {
    /// A problem about a whole file.
    pub fn file(kind: ProblemKind, file: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self { kind, file: file.into(), line: None, message: message.into() }
    }

    /// A problem about one line of a file.
    pub fn line(kind: ProblemKind, file: impl Into<PathBuf>, line: usize, message: impl Into<String>) -> Self {
        Self { kind, file: file.into(), line: Some(line), message: message.into() }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(l) => write!(f, "{}:{l}: {}", self.file.display(), self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}
