//! The decode crate's error type. Decoders see bytes only, so messages name the backend, the detected format and
//! the input size; the pipeline adds the sample id or path when it wraps the error.

/// What went wrong while decoding or resizing an image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The requested backend is not compiled into this build.
    #[error("decode backend `{backend}` is not available: sluice-decode was built without feature `{feature}`{note}")]
    NotCompiled {
        /// The backend's name.
        backend: &'static str,
        /// The cargo feature that would enable it.
        feature: &'static str,
        /// Extra explanation (empty, or starting with "; ").
        note: &'static str,
    },
    /// The backend is compiled in but cannot run on this machine (a shared library that does not load, no GPU,
    /// a device that refuses to initialise).
    #[error("decode backend `{backend}` is unavailable on this machine: {reason}")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// What was tried and what failed (library name and dlopen error, or the CUDA / nvJPEG error).
        reason: String,
    },
    /// The GPU or its runtime failed while decoding (out of device memory, a failed copy or kernel); the input may be
    /// fine.
    #[error("{backend}: GPU error: {reason}")]
    Device {
        /// The backend's name.
        backend: &'static str,
        /// The CUDA / nvJPEG call and its error.
        reason: String,
    },
    /// The backend name is not one Sluice knows.
    #[error("unknown decode backend `{0}` (known: image, turbojpeg, nvjpeg)")]
    UnknownBackend(String),
    /// The input is empty.
    #[error("{backend}: empty input (0 bytes)")]
    Empty {
        /// The backend's name.
        backend: &'static str,
    },
    /// The bytes are not in a format the backend can decode.
    #[error("{backend}: unsupported or unrecognised image format ({len} bytes, starts with {head})")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// Input size in bytes.
        len: usize,
        /// The first bytes, in hex.
        head: String,
    },
    /// The image is larger than the configured pixel limit (a decompression bomb or a corrupt header).
    #[error("{backend}: {width}x{height} image exceeds the limit of {limit} pixels")]
    TooLarge {
        /// The backend's name.
        backend: &'static str,
        /// Width from the header.
        width: u64,
        /// Height from the header.
        height: u64,
        /// The limit in pixels.
        limit: u64,
    },
    /// The bytes are malformed (truncated, corrupt, or an unsupported variant of the format).
    #[error("{backend}: corrupt or truncated {format} data ({len} bytes): {reason}")]
    Corrupt {
        /// The backend's name.
        backend: &'static str,
        /// The detected format.
        format: &'static str,
        /// Input size in bytes.
        len: usize,
        /// The backend's own message.
        reason: String,
    },
    /// Resizing failed (zero-sized target, or an internal error of the resizer).
    #[error("resize {from_w}x{from_h} -> {to_w}x{to_h}: {reason}")]
    Resize {
        /// Source width.
        from_w: u32,
        /// Source height.
        from_h: u32,
        /// Target width.
        to_w: u32,
        /// Target height.
        to_h: u32,
        /// Why.
        reason: String,
    },
}

impl DecodeError {
    /// `Err(TooLarge)` when a `w × h` image is over `limit` pixels (checked before any pixel buffer exists).
    pub fn check_pixels(backend: &'static str, w: u32, h: u32, limit: u64) -> Result<(), DecodeError> {
        if u64::from(w) * u64::from(h) > limit {
            return Err(DecodeError::TooLarge { backend, width: w.into(), height: h.into(), limit });
        }
        Ok(())
    }

    /// Hex of the first (at most 8) bytes of `bytes`, for messages about unrecognised input.
    pub(crate) fn head(bytes: &[u8]) -> String {
        let n = bytes.len().min(8);
        let mut s = String::with_capacity(n * 2);
        for b in &bytes[..n] {
            s.push_str(&format!("{b:02x}"));
        }
        if s.is_empty() { "nothing".to_owned() } else { s }
    }
}

impl From<DecodeError> for sluice_core::Error {
    fn from(err: DecodeError) -> Self {
        let what = match &err {
            DecodeError::NotCompiled { backend, .. } | DecodeError::Unavailable { backend, .. } => {
                format!("backend {backend}")
            }
            DecodeError::UnknownBackend(name) => format!("backend {name}"),
            DecodeError::Empty { backend }
            | DecodeError::Unsupported { backend, .. }
            | DecodeError::TooLarge { backend, .. }
            | DecodeError::Corrupt { backend, .. }
            | DecodeError::Device { backend, .. } => format!("{backend} decoder"),
            DecodeError::Resize { .. } => "resize".to_owned(),
        };
        sluice_core::Error::Decode { what, reason: err.to_string() }
    }
}

/// Result alias of this crate.
pub type Result<T, E = DecodeError> = std::result::Result<T, E>;
