//! `FileReader`: one file per sample (a dataset's image paths), read into the caller's scratch buffer.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use sluice_core::{Reader, SampleId};

use crate::error::{Result, StorageError};

/// Serves sample `i` as the bytes of `paths[i]`. Each read opens the file and reads it whole into the caller's
/// scratch buffer (cleared first, its allocation kept), so steady-state reads allocate nothing.
#[derive(Debug, Clone)]
pub struct FileReader {
    paths: Vec<PathBuf>,
}

impl FileReader {
    /// A reader over `paths`; sample ids are indices into it.
    pub fn new(paths: Vec<PathBuf>) -> Self {
        Self { paths }
    }

    /// The path of sample `id`.
    pub fn path(&self, id: SampleId) -> Option<&Path> {
        usize::try_from(id).ok().and_then(|i| self.paths.get(i)).map(PathBuf::as_path)
    }

    /// Reads sample `id` into `scratch` and returns it.
    pub fn read_into<'a>(&self, id: SampleId, scratch: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        let path = self.path(id).ok_or_else(|| StorageError::OutOfRange {
            what: "file reader".to_owned(),
            id,
            len: self.paths.len(),
        })?;
        let wrap = |source| StorageError::Sample { id, path: path.to_path_buf(), source };
        let mut file = File::open(path).map_err(wrap)?;
        scratch.clear();
        if let Ok(meta) = file.metadata() {
            scratch.reserve(usize::try_from(meta.len()).unwrap_or(0));
        }
        file.read_to_end(scratch).map_err(wrap)?;
        Ok(scratch)
    }
}

impl Reader for FileReader {
    fn read<'a>(&'a self, id: SampleId, scratch: &'a mut Vec<u8>) -> sluice_core::Result<&'a [u8]> {
        Ok(self.read_into(id, scratch)?)
    }

    fn len(&self) -> usize {
        self.paths.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_into_the_reused_scratch_and_names_missing_ones() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.bin");
        std::fs::write(&a, b"hello").expect("write");
        let missing = dir.path().join("missing.jpg");
        let reader = FileReader::new(vec![a, missing]);
        let mut scratch = Vec::with_capacity(64);
        let cap_ptr = scratch.as_ptr();
        assert_eq!(reader.read(0, &mut scratch).expect("read"), b"hello");
        assert_eq!(scratch.as_ptr(), cap_ptr, "scratch allocation reused");
        let err = reader.read(1, &mut scratch).expect_err("missing file").to_string();
        assert!(err.contains("sample 1") && err.contains("missing.jpg"), "{err}");
        let err = reader.read(7, &mut scratch).expect_err("out of range").to_string();
        assert!(err.contains("sample 7 out of range"), "{err}");
    }
}
