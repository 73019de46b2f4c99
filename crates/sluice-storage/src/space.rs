//! Free space checked before a large write, so a full disk is an error naming the folder and the bytes needed
//! before anything is written, not a write error half-way through.

use std::path::Path;

use crate::error::{Result, StorageError};

/// Fails when the file system holding `dir` has fewer than `need` bytes free for an unprivileged writer; `what`
/// names what would be written there.
#[cfg(unix)]
pub fn ensure_free_space(dir: &Path, need: u64, what: &str) -> Result<()> {
    let st = rustix::fs::statvfs(dir).map_err(|e| StorageError::io(dir, std::io::Error::from(e)))?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    if free < need {
        return Err(StorageError::NoSpace { dir: dir.to_path_buf(), free, need, what: what.to_string() });
    }
    Ok(())
}

/// Free space is not checked on this platform: a full disk surfaces as a write error naming the file.
#[cfg(not(unix))]
pub fn ensure_free_space(_dir: &Path, _need: u64, _what: &str) -> Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_little_free_space_is_an_error_naming_the_folder_and_the_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(ensure_free_space(dir.path(), 1, "x").is_ok());
        let err = ensure_free_space(dir.path(), u64::MAX, "the test's file").expect_err("no file system has 16 EiB");
        let msg = err.to_string();
        assert!(msg.contains(&dir.path().display().to_string()) && msg.contains(&u64::MAX.to_string()), "{msg}");
        assert!(msg.contains("the test's file"), "{msg}");
    }
}
