//! The runtime list of decode backends. Every backend has a variant whether or not it is compiled in; asking for
//! one that is not compiled in answers with a clear "built without feature X" error instead of changing the API.

use std::fmt;
use std::str::FromStr;

use sluice_core::Decoder;

use crate::error::{DecodeError, Result};

/// A decode backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Pure Rust through the `image` crate (zune-jpeg, png, bmp, image-webp). Feature `image` (default).
    Image,
    /// libjpeg-turbo through the `turbojpeg` crate, with DCT-domain scaling. Feature `turbojpeg`.
    TurboJpeg,
    /// NVIDIA nvJPEG on the GPU. Not implemented yet (the CUDA work); always answers "built without".
    NvJpeg,
}

impl Backend {
    /// Every backend Sluice knows, compiled in or not.
    pub const ALL: [Backend; 3] = [Backend::Image, Backend::TurboJpeg, Backend::NvJpeg];

    /// The backends compiled into this build, fastest JPEG decoder first.
    pub fn compiled() -> Vec<Backend> {
        let mut v: Vec<Backend> = Self::ALL.into_iter().filter(|b| b.is_compiled()).collect();
        v.sort_by_key(|b| match b {
            Backend::NvJpeg => 0,
            Backend::TurboJpeg => 1,
            Backend::Image => 2,
        });
        v
    }

    /// The preferred compiled-in backend (turbojpeg when present, else image), or an error when none is.
    pub fn preferred() -> Result<Backend> {
        Self::compiled().into_iter().next().ok_or(DecodeError::NotCompiled {
            backend: "image",
            feature: "image",
            note: "; enable at least one of the features `image`, `turbojpeg`",
        })
    }

    /// Whether this backend is compiled in.
    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Image => cfg!(feature = "image"),
            Backend::TurboJpeg => cfg!(feature = "turbojpeg"),
            Backend::NvJpeg => false,
        }
    }

    /// The backend's name (as accepted by [`FromStr`] and returned by [`Decoder::name`]).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Image => "image",
            Backend::TurboJpeg => "turbojpeg",
            Backend::NvJpeg => "nvjpeg",
        }
    }

    /// The cargo feature that compiles this backend in.
    pub fn feature(self) -> &'static str {
        self.name()
    }

    /// A decoder of this backend with default settings, shareable across threads.
    pub fn decoder(self) -> Result<Box<dyn Decoder>> {
        match self {
            #[cfg(feature = "image")]
            Backend::Image => Ok(Box::new(crate::ImageDecoder::new())),
            #[cfg(feature = "turbojpeg")]
            Backend::TurboJpeg => Ok(Box::new(crate::TurboJpegDecoder::new())),
            Backend::NvJpeg => Err(DecodeError::NotCompiled {
                backend: "nvjpeg",
                feature: "nvjpeg",
                note: " (the nvJPEG backend is not implemented yet)",
            }),
            #[allow(unreachable_patterns)]
            other => Err(DecodeError::NotCompiled { backend: other.name(), feature: other.feature(), note: "" }),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = DecodeError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|b| b.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| DecodeError::UnknownBackend(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_fail() {
        for b in Backend::ALL {
            assert_eq!(b.name().parse::<Backend>().expect("known"), b);
        }
        assert!(matches!("jpegli".parse::<Backend>(), Err(DecodeError::UnknownBackend(_))));
    }

    #[test]
    fn compiled_backends_build_and_others_say_which_feature() {
        for b in Backend::ALL {
            match b.decoder() {
                Ok(d) => {
                    assert!(b.is_compiled());
                    assert_eq!(d.name(), b.name());
                }
                Err(e) => {
                    assert!(!b.is_compiled());
                    let msg = e.to_string();
                    assert!(msg.contains(&format!("built without feature `{}`", b.feature())), "{msg}");
                }
            }
        }
        assert!(!Backend::NvJpeg.is_compiled());
        assert_eq!(Backend::compiled().contains(&Backend::Image), cfg!(feature = "image"));
    }
}
