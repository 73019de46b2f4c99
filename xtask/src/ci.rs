//! `cargo xtask ci`: every check CI runs, one after the other, each timed (the figures are printed at the end).
//!
//! 1. `cargo fmt --check` of the workspace and of `fuzz/` (its own workspace).
//! 2. clippy `-D warnings` of the workspace, then its tests, with object storage (feature `object-store`) on, and
//!    data-parallel training on CPU ranks (feature `mpi`) where Open MPI is installed (`SLUICE_REQUIRE_MPI=1` makes
//!    its absence an error, as `.ci/run` does): the object-storage tests run against a local moto server where
//!    python3 has `moto[server]` (`SLUICE_REQUIRE_MOTO=1` makes its absence an error, as `.ci/run` does), and the
//!    MPI engine's tests (`sluice-dist`) and the two-rank tests of `sluice-train` and `sluice-cli` under `mpirun`
//!    run with the rest, from the same build. Between clippy and the tests, the workspace's docs are built
//!    (`cargo doc --no-deps`, default features) with rustdoc's warnings denied: a broken intra-doc link fails.
//! 3. `sluice-decode`'s other backends, in one build: `nvjpeg` (it loads its libraries at run time, so it builds
//!    and its no-GPU paths are tested everywhere) and `turbojpeg` where CMake and NASM are installed
//!    (`SLUICE_REQUIRE_TURBOJPEG=1` makes their absence an error, as `.ci/run` does): clippy and tests.
//! 4. The builds without a feature where the code differs: `sluice-loader` without object storage (clippy and its
//!    URL-split error test), and `sluice-eval` without candle (clippy).
//! 5. `fuzz/`: clippy, and `cargo test` there, which replays the seed corpus and the regressions through the fuzz
//!    targets on stable (no libFuzzer), with its own `Cargo.lock`.
//! 6. The vendored candle-core's own tests (`vendor/candle-core`, a `[patch.crates-io]` of the workspace and
//!    excluded from it): its unit tests, `tests/grad_tests.rs`, the patches' tests and its doctests, with its own
//!    `Cargo.lock`; then the patches' tests whose op-ledger checks need the `ledger` feature, with it.
//! 7. clippy `-D warnings` of the whole workspace with `--features cuda,cudnn,nvjpeg,nccl` (every crate that has
//!    one of these features gets it): NVIDIA's CUDA 13.0 compiler wheels are installed from PyPI into
//!    `<target>/cuda-sdk` (once per target directory), no GPU is needed ([`crate::gpu::cuda_check_cargo`]).
//! 8. Every CUDA C source the crates compile with NVRTC at run time (`crates/*/src/**/*.cu`) compiled for sm_90 by
//!    the same wheels' nvcc and ptxas, warnings as errors ([`crate::gpu::compile_kernels`]).
//!
//! The steps share the workspace's target directory and its `dev` profile where they can (steps 2 to 4 and 7; the
//! CUDA clippy, without `mpi`, also lints the code that builds without it);
//! `fuzz/` and `vendor/candle-core` are other workspaces with other profiles and lock files, so they build into
//! `<target>/fuzz` and `<target>/vendor`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Runs the steps in order, stopping at the first failure; prints each step's wall time at the end.
struct Steps {
    done: Vec<(String, Duration)>,
    started: Instant,
}

impl Steps {
    fn new() -> Self {
        Self { done: Vec::new(), started: Instant::now() }
    }

    /// Runs `cmd` as the step `name`.
    fn run(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        eprintln!("xtask: == {name}");
        let t = Instant::now();
        let r = crate::run(cmd);
        self.done.push((name.to_string(), t.elapsed()));
        if r.is_err() {
            self.report();
        }
        r
    }

    /// Runs `cargo args` in `dir` as the step `name`.
    fn cargo(&mut self, name: &str, dir: &Path, args: &[&str]) -> Result<()> {
        eprintln!("xtask: cargo {}", args.join(" "));
        self.run(name, Command::new("cargo").args(args).current_dir(dir))
    }

    fn report(&self) {
        eprintln!("xtask: ci step times (wall clock):");
        for (name, d) in &self.done {
            eprintln!("xtask:   {:>7.1} s  {name}", d.as_secs_f64());
        }
        eprintln!("xtask:   {:>7.1} s  in all", self.started.elapsed().as_secs_f64());
    }
}

/// Clippy's arguments after the selection: every target, the lock file as committed, warnings denied.
const CLIPPY_TAIL: &[&str] = &["--all-targets", "--locked", "--", "-D", "warnings"];

pub(crate) fn ci(root: &Path, tests_only: bool) -> Result<()> {
    let checks = !tests_only;
    let mut s = Steps::new();
    if checks {
        crate::ensure_component("rustfmt", &["fmt", "--version"])?;
        crate::ensure_component("clippy", &["clippy", "--version"])?;
        s.cargo("fmt", root, &["fmt", "--all", "--check"])?;
        s.cargo("fmt fuzz/", root, &["fmt", "--all", "--check", "--manifest-path", "fuzz/Cargo.toml"])?;
    }
    let features = if mpi_found()? { format!("{OBJECT_STORE},{MPI}") } else { OBJECT_STORE.to_string() };
    if checks {
        s.cargo("clippy", root, &[&["clippy", "--workspace", "--features", &features][..], CLIPPY_TAIL].concat())?;
        let args = ["doc", "--workspace", "--no-deps", "--locked"];
        eprintln!("xtask: RUSTDOCFLAGS='-D warnings' cargo {}", args.join(" "));
        s.run("doc", Command::new("cargo").args(args).env("RUSTDOCFLAGS", "-D warnings").current_dir(root))?;
    }
    s.cargo("test", root, &["test", "--workspace", "--locked", "--features", &features])?;

    decode_backends(root, checks, &mut s)?;
    without_object_store(root, checks, &mut s)?;
    if checks {
        // The host crate of evaluation alone, as a user of its metrics builds it: no candle.
        s.cargo(
            "clippy sluice-eval without candle",
            root,
            &[&["clippy", "-p", "sluice-eval"][..], CLIPPY_TAIL].concat(),
        )?;
    }

    let target = crate::target_dir(root);
    let fuzz_target = target.join("fuzz").to_string_lossy().into_owned();
    let fuzz = ["--manifest-path", "fuzz/Cargo.toml", "--target-dir", &fuzz_target];
    if checks {
        s.cargo("clippy fuzz/", root, &[&["clippy"][..], &fuzz, CLIPPY_TAIL].concat())?;
    }
    s.cargo("test fuzz/ (corpus replay)", root, &[&["test", "--locked"][..], &fuzz].concat())?;

    // candle-core's tests as vendored: the published crate ships only `tests/grad_tests.rs` of candle's test
    // folder here (vendor/README.md), plus the unit tests and doctests in `src/`. Nothing is excluded: none of
    // them needs a GPU, Metal or the network (the `cuda`/`metal` features are off).
    let vendor_target = target.join("vendor").to_string_lossy().into_owned();
    let candle = ["--manifest-path", "vendor/candle-core/Cargo.toml", "--target-dir", &vendor_target];
    s.cargo("test vendor/candle-core", root, &[&["test", "--locked"][..], &candle].concat())?;
    let ledger = [
        "--features",
        "ledger",
        "--test",
        "scalar_ops",
        "--test",
        "narrow_grads",
        "--test",
        "cat_runs",
        "--test",
        "max_min_grads",
    ];
    s.cargo("test vendor/candle-core, ledger", root, &[&["test", "--locked"][..], &candle, &ledger].concat())?;

    if checks {
        let sdk = crate::gpu::ci_sdk_root(root);
        let t = Instant::now();
        let mut cmd = crate::gpu::cuda_check_cargo(root, &sdk)?;
        s.done.push(("CUDA 13.0 compiler wheels (pip)".into(), t.elapsed()));
        let args = [&["clippy", "--workspace", "--features", "cuda,cudnn,nvjpeg,nccl"][..], CLIPPY_TAIL].concat();
        eprintln!("xtask: cargo {} (CUDA 13.0 from {}, no GPU)", args.join(" "), sdk.display());
        s.run("clippy cuda,cudnn,nvjpeg,nccl", cmd.args(&args))?;
        let t = Instant::now();
        let n = crate::gpu::compile_kernels(root, &sdk)?.len();
        s.done.push((format!("nvcc -cubin sm_90 of the {n} kernel sources"), t.elapsed()));
    }
    s.report();
    Ok(())
}

/// `sluice-decode`'s optional backends, linted and tested in one build: `nvjpeg` everywhere (it loads NVIDIA's
/// libraries at run time), and `turbojpeg`, whose bundled library is built with CMake and NASM, wherever those tools
/// are (required where CI says so). The decode conformance suite runs against every backend compiled in.
fn decode_backends(root: &Path, checks: bool, s: &mut Steps) -> Result<()> {
    let missing: Vec<&str> = ["cmake", "nasm"].into_iter().filter(|t| !tool_found(t)).collect();
    let features = if missing.is_empty() {
        "nvjpeg,turbojpeg"
    } else if std::env::var_os("SLUICE_REQUIRE_TURBOJPEG").is_some_and(|v| v == "1") {
        bail!(
            "SLUICE_REQUIRE_TURBOJPEG=1 but {} not found: the turbojpeg backend cannot be built",
            missing.join(" and ")
        );
    } else {
        eprintln!(
            "xtask: the turbojpeg backend is not checked ({} not found; install them, e.g. `apt-get install cmake nasm`)",
            missing.join(" and ")
        );
        "nvjpeg"
    };
    let args = ["-p", "sluice-decode", "--features", features];
    if checks {
        s.cargo(&format!("clippy {features}"), root, &[&["clippy"][..], &args, CLIPPY_TAIL].concat())?;
    }
    s.cargo(&format!("test {features}"), root, &[&["test", "--locked"][..], &args].concat())
}

/// The MPI engine needs an MPI library and `mpirun` (and libclang for its bindings): built, linted and tested with the
/// workspace wherever `mpicc` and `mpirun` are, required where CI says so.
fn mpi_found() -> Result<bool> {
    let missing: Vec<&str> = ["mpicc", "mpirun"].into_iter().filter(|t| !tool_found(t)).collect();
    if missing.is_empty() {
        return Ok(true);
    }
    if std::env::var_os("SLUICE_REQUIRE_MPI").is_some_and(|v| v == "1") {
        bail!("SLUICE_REQUIRE_MPI=1 but {} not found: the MPI engine cannot be built", missing.join(" and "));
    }
    eprintln!(
        "xtask: the workspace is built without the MPI engine ({} not found; install Open MPI and libclang, e.g. \
         `apt-get install libopenmpi-dev openmpi-bin libclang-dev`)",
        missing.join(" and ")
    );
    Ok(false)
}

/// The `mpi` feature of every crate that has one.
const MPI: &str = "sluice-dist/mpi,sluice-train/mpi,sluice-cli/mpi";

/// The object-storage feature of every crate that has one. The workspace is linted and tested with it on, so that it
/// builds once with everything else; its tests start a local
/// moto server (PyPI's `moto[server]`) and skip where python3 cannot import it, unless `SLUICE_REQUIRE_MOTO=1`.
const OBJECT_STORE: &str = "sluice-storage/object-store,sluice-loader/object-store,sluice-train/object-store,\
                            sluice-cli/object-store";

/// The build without object storage, where the code differs: `sluice-loader`'s error for a URL split (linted, and
/// its test run).
fn without_object_store(root: &Path, checks: bool, s: &mut Steps) -> Result<()> {
    if checks {
        s.cargo(
            "clippy sluice-loader without object-store",
            root,
            &[&["clippy", "-p", "sluice-loader"][..], CLIPPY_TAIL].concat(),
        )?;
    }
    s.cargo(
        "test sluice-loader without object-store",
        root,
        &["test", "--locked", "-p", "sluice-loader", "--test", "remote"],
    )
}

/// Whether `tool --version` runs.
fn tool_found(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}
