//! The nvjpeg backend where it cannot run (feature `nvjpeg` on a machine without libnvjpeg/libcudart on the loader
//! path, or without a GPU): construction fails with a clear `Unavailable` error that names the library or the CUDA
//! call, `Backend::decoder` errors without panicking, and the preferred backend is a CPU one. On a machine where
//! nvjpeg does run, the same tests check that it constructs and is preferred; the decode path itself is covered by
//! the conformance suite (`SLUICE_REQUIRE_NVJPEG=1`).
#![cfg(feature = "nvjpeg")]

use sluice_decode::{Backend, DecodeError, DecodeHint, Decoder, ImageRgb8, NvJpegDecoder};

const PREFIX: &str = "decode backend `nvjpeg` is unavailable on this machine: ";

/// Whether an `Unavailable` message says what failed: the library names and dlopen errors with where to get them,
/// or (libraries loaded) the CUDA / nvJPEG call that failed.
fn is_clear(msg: &str) -> bool {
    let load = msg.contains("could not load libnvjpeg.so.13 nor libnvjpeg.so (")
        || msg.contains("could not load libcudart.so.13 nor libcudart.so (");
    let load = load && msg.contains("nvidia-nvjpeg") && msg.contains("LD_LIBRARY_PATH");
    let cuda = ["cudaGetDeviceCount", "no CUDA device", "nvjpegCreateSimple", "nvjpegJpegStateCreate", "cudaStream"]
        .iter()
        .any(|k| msg.contains(k));
    msg.starts_with(PREFIX) && (load || cuda)
}

#[test]
fn new_names_the_library_or_cuda_error_when_unavailable() {
    match NvJpegDecoder::new() {
        Ok(d) => {
            eprintln!("nvjpeg runs here: {d:?}");
            assert_eq!(d.name(), "nvjpeg");
            assert_eq!(d.libraries()[0].split(".so").next(), Some("libnvjpeg"));
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!("{msg}");
            assert!(matches!(e, DecodeError::Unavailable { backend: "nvjpeg", .. }), "{e:?}");
            assert!(is_clear(&msg), "unclear message: {msg}");
            // Converted for the pipeline, the message survives.
            let core: sluice_core::Error = e.into();
            assert!(core.to_string().contains("libnvjpeg") || core.to_string().contains("CUDA"), "{core}");
        }
    }
}

#[test]
fn backend_decoder_errors_without_panicking() {
    assert!(Backend::NvJpeg.is_compiled());
    match Backend::NvJpeg.decoder() {
        Ok(d) => {
            assert!(Backend::NvJpeg.is_available());
            let mut out = ImageRgb8::default();
            let err = d.decode(&[], DecodeHint::default(), &mut out).expect_err("empty input");
            assert!(err.to_string().contains("nvjpeg: empty input"), "{err}");
        }
        Err(e) => {
            assert!(is_clear(&e.to_string()), "{e}");
            assert!(!Backend::NvJpeg.is_available());
            assert!(!Backend::available().contains(&Backend::NvJpeg));
            // The probe answers the same, every time.
            let probe = Backend::NvJpeg.probe().expect_err("unavailable");
            assert_eq!(probe.to_string(), e.to_string());
            assert_eq!(Backend::NvJpeg.probe().expect_err("unavailable").to_string(), e.to_string());
        }
    }
}

#[test]
fn preferred_falls_back_to_a_cpu_backend() {
    // nvjpeg is compiled first, whether or not it can run.
    assert_eq!(Backend::compiled().first(), Some(&Backend::NvJpeg));
    let preferred = Backend::preferred();
    if Backend::NvJpeg.is_available() {
        assert_eq!(preferred.expect("nvjpeg"), Backend::NvJpeg);
        return;
    }
    if cfg!(any(feature = "image", feature = "turbojpeg")) {
        let b = preferred.expect("a CPU backend");
        assert!(matches!(b, Backend::TurboJpeg | Backend::Image), "{b}");
        let d = Backend::preferred_decoder().expect("a CPU decoder");
        assert_eq!(d.name(), b.name());
        // And it decodes.
        let jpeg = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/coco_643.jpg")).expect("fixture");
        let mut out = ImageRgb8::default();
        let info = d.decode(&jpeg, DecodeHint::default(), &mut out).expect("decode");
        assert_eq!((out.width(), out.height(), info.scale), (500, 375, 1.0));
    } else {
        // nvjpeg alone and unable to run: the error says why.
        let e = preferred.expect_err("nothing can run");
        assert!(is_clear(&e.to_string()), "{e}");
        assert!(Backend::preferred_decoder().is_err());
    }
}
