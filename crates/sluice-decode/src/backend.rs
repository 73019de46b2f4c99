//! The runtime list of decode backends. Every backend has a variant whether or not it is compiled in; asking for
//! one that is not compiled in answers with a clear "built without feature X" error instead of changing the API.
//! A backend can also be compiled in but unavailable on this machine (nvjpeg without libnvjpeg/libcudart or a
//! GPU): [`Backend::decoder`] then answers [`DecodeError::Unavailable`], and [`Backend::available`] /
//! [`Backend::preferred`] skip it, so the CPU backends are the fallback.

use std::fmt;
use std::str::FromStr;

use sluice_core::Decoder;

use crate::error::{DecodeError, Result};

/// A decode backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Pure Rust through the `image` crate (zune-jpeg, png, bmp, image-webp), with jpeg-decoder's scaled IDCT for
    /// JPEGs reduced by 4 or 8. Feature `image` (default).
    Image,
    /// libjpeg-turbo through the `turbojpeg` crate, with DCT-domain scaling. Feature `turbojpeg`.
    TurboJpeg,
    /// NVIDIA nvJPEG on the GPU, full-size decodes (no DCT scaling). Feature `nvjpeg`; needs libnvjpeg and
    /// libcudart 13 loadable at run time and a CUDA device, else it is unavailable.
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

    /// The compiled-in backends that can run on this machine ([`Backend::probe`] succeeds), in the order of
    /// [`Backend::compiled`].
    pub fn available() -> Vec<Backend> {
        Self::compiled().into_iter().filter(|b| b.is_available()).collect()
    }

    /// The preferred backend that can run here: the first of [`Backend::available`] (nvjpeg when it loads, else
    /// turbojpeg when compiled in, else image). Errors when no backend is compiled in, or with the first
    /// compiled-in backend's [`DecodeError::Unavailable`] when none can run.
    pub fn preferred() -> Result<Backend> {
        let compiled = Self::compiled();
        let Some(&first) = compiled.first() else {
            return Err(DecodeError::NotCompiled {
                backend: "image",
                feature: "image",
                note: "; enable at least one of the features `image`, `turbojpeg`, `nvjpeg`",
            });
        };
        match compiled.into_iter().find(|b| b.is_available()) {
            Some(b) => Ok(b),
            None => first.probe().map(|()| first),
        }
    }

    /// A decoder of the preferred backend: tries the [`Backend::available`] backends in order and returns the
    /// first decoder that constructs (so a GPU backend that fails at this point still falls back to the CPU).
    pub fn preferred_decoder() -> Result<Box<dyn Decoder>> {
        let mut first_err = None;
        for b in Self::available() {
            match b.decoder() {
                Ok(d) => return Ok(d),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Self::preferred().and_then(Backend::decoder),
        }
    }

    /// Whether this backend is compiled in.
    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Image => cfg!(feature = "image"),
            Backend::TurboJpeg => cfg!(feature = "turbojpeg"),
            Backend::NvJpeg => cfg!(feature = "nvjpeg"),
        }
    }

    /// `Ok` when a decoder of this backend can be constructed on this machine; otherwise the error
    /// [`Backend::decoder`] would give ([`DecodeError::NotCompiled`] or [`DecodeError::Unavailable`]). The CPU
    /// backends are available whenever compiled in; nvjpeg is probed once per process (its libraries are loaded
    /// and a decoder is created and dropped), later calls answer from that.
    pub fn probe(self) -> Result<()> {
        match self {
            #[cfg(feature = "nvjpeg")]
            Backend::NvJpeg => crate::nvjpeg::probe(),
            b if b.is_compiled() => Ok(()),
            b => b.decoder().map(drop),
        }
    }

    /// Whether [`Backend::probe`] succeeds.
    pub fn is_available(self) -> bool {
        self.probe().is_ok()
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

    /// A decoder of this backend with default settings, shareable across threads. A compiled-in backend that
    /// cannot run here answers [`DecodeError::Unavailable`] (nvjpeg: which library failed to load, or the CUDA
    /// error).
    pub fn decoder(self) -> Result<Box<dyn Decoder>> {
        match self {
            #[cfg(feature = "image")]
            Backend::Image => Ok(Box::new(crate::ImageDecoder::new())),
            #[cfg(feature = "turbojpeg")]
            Backend::TurboJpeg => Ok(Box::new(crate::TurboJpegDecoder::new())),
            #[cfg(feature = "nvjpeg")]
            Backend::NvJpeg => Ok(Box::new(crate::NvJpegDecoder::new()?)),
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
                    assert!(b.is_compiled() && b.is_available());
                    assert_eq!(d.name(), b.name());
                }
                Err(e) => {
                    assert!(!b.is_available());
                    let msg = e.to_string();
                    if b.is_compiled() {
                        // Only nvjpeg can be compiled in and still not run (no libnvjpeg or no GPU here).
                        assert_eq!(b, Backend::NvJpeg, "{msg}");
                        assert!(matches!(e, DecodeError::Unavailable { backend: "nvjpeg", .. }), "{msg}");
                        assert_eq!(b.probe().map_err(|e| e.to_string()), Err(msg));
                    } else {
                        assert!(msg.contains(&format!("built without feature `{}`", b.feature())), "{msg}");
                    }
                }
            }
        }
        assert_eq!(Backend::NvJpeg.is_compiled(), cfg!(feature = "nvjpeg"));
        assert_eq!(Backend::compiled().contains(&Backend::Image), cfg!(feature = "image"));
    }

    #[test]
    fn preferred_is_the_first_available_backend() {
        let available = Backend::available();
        assert!(available.iter().all(|b| Backend::compiled().contains(b)));
        match Backend::preferred() {
            Ok(b) => {
                assert_eq!(Some(&b), available.first());
                let d = Backend::preferred_decoder().expect("preferred decoder");
                assert_eq!(d.name(), b.name());
            }
            Err(e) => assert!(available.is_empty(), "{e}"),
        }
        if cfg!(any(feature = "image", feature = "turbojpeg")) {
            // The CPU backends always run: with nvjpeg unavailable, one of them is preferred.
            let b = Backend::preferred().expect("a CPU backend");
            assert!(b == Backend::NvJpeg || Backend::NvJpeg.probe().is_err());
            assert!(b != Backend::NvJpeg || Backend::NvJpeg.is_available());
        }
    }
}
