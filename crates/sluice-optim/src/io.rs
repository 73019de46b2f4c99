//! Safetensors files written atomically (a temporary file in the same directory, fsync, rename, fsync of the
//! directory), with string metadata, and read back with their metadata.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, View};

use super::error::{OptimError, Result};

fn io_err(file: &Path) -> impl FnOnce(std::io::Error) -> OptimError + '_ {
    move |source| OptimError::Io { file: file.to_path_buf(), source }
}

fn bad(file: &Path, reason: impl Into<String>) -> OptimError {
    OptimError::BadCheckpoint { file: file.to_path_buf(), reason: reason.into() }
}

/// Writes `path` through `write`, which receives a temporary path in the same directory: the temporary file is
/// fsynced and renamed over `path` only when `write` succeeds, then the directory is fsynced. On any error, or a
/// kill mid-write, `path` keeps its previous contents and the temporary file is removed (or, after a kill, left
/// as a dot-file next to it).
pub fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp =
        tempfile::Builder::new().prefix(&format!(".{name}.")).suffix(".tmp").tempfile_in(&dir).map_err(io_err(&dir))?;
    // On error `tmp` is dropped, which deletes the temporary file.
    write(tmp.path())?;
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    tmp.persist(path).map_err(|e| OptimError::Io { file: path.to_path_buf(), source: e.error })?;
    // Make the rename itself durable. Directories cannot be opened for syncing on every platform: best effort.
    if let Ok(d) = std::fs::File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A tensor as a safetensors view: its bytes are produced (and copied off the device) only when the writer asks
/// for them, one tensor at a time. A failed conversion is recorded in `failed` and fails the whole save.
struct LazyView<'a> {
    tensor: &'a Tensor,
    dtype: Dtype,
    failed: &'a RefCell<Option<String>>,
}

fn st_dtype(d: DType) -> Option<Dtype> {
    Some(match d {
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::I64 => Dtype::I64,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        _ => return None,
    })
}

fn le_bytes(t: &Tensor) -> candle_core::Result<Vec<u8>> {
    let t = t.to_device(&Device::Cpu)?.flatten_all()?;
    Ok(match t.dtype() {
        DType::U8 => t.to_vec1::<u8>()?,
        DType::U32 => t.to_vec1::<u32>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I64 => t.to_vec1::<i64>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F32 => t.to_vec1::<f32>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::F64 => t.to_vec1::<f64>()?.iter().flat_map(|x| x.to_le_bytes()).collect(),
        d => candle_core::bail!("dtype {d:?} cannot be saved"),
    })
}

impl View for LazyView<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        self.tensor.dims()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match le_bytes(self.tensor) {
            Ok(b) if b.len() == self.data_len() => Cow::Owned(b),
            Ok(b) => {
                *self.failed.borrow_mut() = Some(format!("{} bytes, expected {}", b.len(), self.data_len()));
                Cow::Owned(vec![0; self.data_len()])
            }
            Err(e) => {
                *self.failed.borrow_mut() = Some(e.to_string());
                Cow::Owned(vec![0; self.data_len()])
            }
        }
    }

    fn data_len(&self) -> usize {
        self.tensor.elem_count() * self.tensor.dtype().size_in_bytes()
    }
}

/// Writes tensors and string metadata as one safetensors file, atomically (see [`write_atomic`]).
pub fn save_safetensors(path: &Path, tensors: &[(String, Tensor)], metadata: HashMap<String, String>) -> Result<()> {
    let failed = RefCell::new(None);
    let views = tensors
        .iter()
        .map(|(name, t)| {
            let dtype = st_dtype(t.dtype()).ok_or_else(|| {
                bad(path, format!("tensor `{name}` has dtype {:?}, which cannot be saved", t.dtype()))
            })?;
            Ok((name.as_str(), LazyView { tensor: t, dtype, failed: &failed }))
        })
        .collect::<Result<Vec<_>>>()?;
    write_atomic(path, |tmp| {
        safetensors::serialize_to_file(views, Some(metadata), tmp)
            .map_err(|e| bad(tmp, format!("writing safetensors: {e}")))?;
        match failed.borrow_mut().take() {
            Some(reason) => Err(bad(path, format!("copying a tensor for saving: {reason}"))),
            None => Ok(()),
        }
    })
}

/// The string metadata of a safetensors file, reading only its header.
pub fn read_metadata(path: &Path) -> Result<HashMap<String, String>> {
    let mut f = std::fs::File::open(path).map_err(io_err(path))?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(io_err(path))?;
    let n = u64::from_le_bytes(n);
    let len = f.metadata().map_err(io_err(path))?.len();
    if n > 100_000_000 || n + 8 > len {
        return Err(bad(path, format!("not a safetensors file (header of {n} bytes in a file of {len})")));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io_err(path))?;
    let header: serde_json::Value =
        serde_json::from_slice(&header).map_err(|e| bad(path, format!("safetensors header: {e}")))?;
    let meta = header.get("__metadata__").cloned().unwrap_or_default();
    if meta.is_null() {
        return Ok(HashMap::new());
    }
    serde_json::from_value(meta).map_err(|e| bad(path, format!("safetensors metadata: {e}")))
}

/// Every tensor of a safetensors file (on `device`) and its string metadata.
pub fn load_safetensors(path: &Path, device: &Device) -> Result<(HashMap<String, Tensor>, HashMap<String, String>)> {
    let metadata = read_metadata(path)?;
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let st = candle_core::safetensors::SliceSafetensors::new(&bytes).map_err(|e| bad(path, e.to_string()))?;
    let mut tensors = HashMap::new();
    for (name, _) in st.tensors() {
        let t = st.load(&name, device).map_err(|e| bad(path, format!("tensor `{name}`: {e}")))?;
        tensors.insert(name, t);
    }
    Ok((tensors, metadata))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::io::Write;

    use super::*;

    #[test]
    fn round_trip_with_metadata() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.safetensors");
        let a = Tensor::new(&[[1f32, 2.0], [3.0, 4.5]], &Device::Cpu).unwrap();
        let b = Tensor::new(7i64, &Device::Cpu).unwrap();
        let meta = HashMap::from([("k".to_string(), "{\"v\": 1}".to_string())]);
        save_safetensors(&path, &[("a".into(), a.clone()), ("b".into(), b)], meta.clone()).unwrap();
        let (t, m) = load_safetensors(&path, &Device::Cpu).unwrap();
        assert_eq!(m, meta);
        assert_eq!(t["a"].to_vec2::<f32>().unwrap(), a.to_vec2::<f32>().unwrap());
        assert_eq!(t["b"].to_scalar::<i64>().unwrap(), 7);
        assert_eq!(read_metadata(&path).unwrap(), meta);
        // Only the file itself is left in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_failed_write_keeps_the_previous_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last.safetensors");
        let a = Tensor::new(&[1f32, 2.0], &Device::Cpu).unwrap();
        save_safetensors(&path, &[("a".into(), a)], HashMap::new()).unwrap();
        let before = std::fs::read(&path).unwrap();
        // A writer that dies half-way (like a full disk or an I/O error mid-save).
        let err = write_atomic(&path, |tmp| {
            let mut f = std::fs::File::create(tmp).unwrap();
            f.write_all(&before[..before.len() / 2]).unwrap();
            Err(OptimError::BadInput("simulated failure mid-write".into()))
        })
        .unwrap_err();
        assert!(err.to_string().contains("mid-write"));
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "the temporary file is removed");
        // A tensor that cannot be saved fails the save before anything is written.
        let bad_t = Tensor::new(&[1i16, 2], &Device::Cpu).unwrap();
        assert!(save_safetensors(&path, &[("a".into(), bad_t)], HashMap::new()).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), before);
        // And the previous file is still a valid checkpoint.
        let (t, _) = load_safetensors(&path, &Device::Cpu).unwrap();
        assert_eq!(t["a"].to_vec1::<f32>().unwrap(), vec![1.0, 2.0]);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("junk.safetensors");
        std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header").unwrap();
        let e = load_safetensors(&path, &Device::Cpu).unwrap_err().to_string();
        assert!(e.contains("junk.safetensors") && e.contains("not a safetensors file"), "{e}");
    }
}
