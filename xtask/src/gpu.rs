//! `gpu-build` and `gpu-check`: the CUDA build on a machine without a GPU, and the one prepared script that runs the
//! device checks on a machine with one.
//!
//! `gpu-build` installs NVIDIA's CUDA 13.0 PyPI wheels (compiler, runtime, cuBLAS, cuRAND, NVRTC, nvJPEG) in one pip
//! call into a cache folder, adds the unversioned `lib*.so` links the linker wants, generates a link-time stub
//! `libcuda.so` (SONAME `libcuda.so.1`) from cudarc's list of driver functions (the real driver comes with the
//! device), and builds `sluice` with `--features cuda` for compute capability 9.0 (H100/H200) into
//! `<target>/cuda`, then strips it. The toolkit is pinned to 13.0: the device's driver (580) is CUDA 13.0, and a
//! newer nvcc emits PTX it rejects.
//!
//! `gpu-check` prepares `<target>/gpu-check/` (binary, script, a small slice of coco128) and prints the device
//! tool command that runs it; see `gpu-check.sh` next to this file for what the script measures.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The compiler wheels of the CUDA 13.0 toolkit: enough to compile candle's kernels (nvcc, its headers) and so to
/// type-check every crate's `cuda` code, which is all `cargo xtask ci` needs.
const COMPILER_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.*",
    "nvidia-cuda-runtime==13.0.*",
    "nvidia-cuda-crt==13.0.*",
    "nvidia-nvvm==13.0.*",
    "nvidia-cuda-cccl==13.0.*",
];

/// The libraries the `sluice` binary links against or carries (`gpu-build`), pinned to the same toolkit.
const LIBRARY_WHEELS: &[&str] =
    &["nvidia-cuda-nvrtc==13.0.*", "nvidia-cublas==13.0.*", "nvidia-curand==10.4.0.*", "nvidia-nvjpeg==13.0.*"];

/// cuDNN for `--features cuda,cudnn`, installed into its own folder (pip `--target` will not merge into the
/// toolkit's `nvidia/` folder).
const CUDNN_WHEEL: &str = "nvidia-cudnn-cu13==9.*";
/// NCCL for `--features ...,nccl` (linked at build time; on the device the PyTorch wheels' libnccl.so.2 loads).
const NCCL_WHEEL: &str = "nvidia-nccl-cu13==2.*";

/// Where `gpu-build` caches the toolkit: `SLUICE_CUDA_SDK`, else `~/.cache/sluice/cuda-13.0`.
fn sdk_root() -> PathBuf {
    if let Some(p) = std::env::var_os("SLUICE_CUDA_SDK").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/sluice/cuda-13.0")
}

/// Where `cargo xtask ci` caches the compiler wheels: `<target>/cuda-sdk`, so a fresh clone downloads them once
/// and a warm target directory reuses them.
pub(crate) fn ci_sdk_root(root: &Path) -> PathBuf {
    crate::target_dir(root).join("cuda-sdk")
}

/// The toolkit folder inside the wheels' install (`nvidia/cu13`).
fn cuda_home(sdk: &Path) -> PathBuf {
    sdk.join("py/nvidia/cu13")
}

/// Installs `wheels` into `sdk` unless an earlier install there already holds all of them (one pip call: pip's
/// `--target --upgrade` replaces the whole `nvidia/` folder, so a second call must carry the first one's wheels
/// too); returns `CUDA_HOME`.
fn install_wheels(sdk: &Path, wheels: &[&str]) -> Result<PathBuf> {
    let home = cuda_home(sdk);
    let marker = sdk.join(".installed");
    let have = std::fs::read_to_string(&marker).unwrap_or_default();
    let mut all: Vec<&str> = have.lines().filter(|l| !l.is_empty()).collect();
    if wheels.iter().any(|w| !all.contains(w)) || !home.join("bin/nvcc").exists() {
        all.extend(wheels.iter().filter(|w| !have.lines().any(|l| l == **w)));
        eprintln!("xtask: installing {} CUDA 13.0 wheels into {} (pip)", all.len(), sdk.display());
        std::fs::create_dir_all(sdk).with_context(|| format!("creating {}", sdk.display()))?;
        let mut pip = Command::new("python3");
        pip.args(["-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target"])
            .arg(sdk.join("py"))
            .args(&all);
        crate::run(&mut pip)?;
        std::fs::write(&marker, all.join("\n")).context("writing the install marker")?;
    }
    Ok(home)
}

/// Installs the compiler and library wheels (once), the `.so` links and the driver stub; returns `CUDA_HOME`.
fn ensure_sdk(root: &Path) -> Result<PathBuf> {
    let home = install_wheels(&sdk_root(), &[COMPILER_WHEELS, LIBRARY_WHEELS].concat())?;
    let lib = home.join("lib");
    link_unversioned(&lib)?;
    driver_stub(root, &lib.join("stubs"))?;
    Ok(home)
}

/// `libX.so` → `libX.so.N` for every versioned library in `lib` (the linker looks for the unversioned name).
fn link_unversioned(lib: &Path) -> Result<()> {
    for entry in std::fs::read_dir(lib).with_context(|| format!("reading {}", lib.display()))? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((stem, _)) = name.split_once(".so.") else { continue };
        let link = lib.join(format!("{stem}.so"));
        if !link.exists() {
            std::os::unix::fs::symlink(name, &link).with_context(|| format!("linking {}", link.display()))?;
        }
    }
    Ok(())
}

/// The cudarc version in Cargo.lock.
fn cudarc_version(root: &Path) -> Result<String> {
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).context("reading Cargo.lock")?;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"cudarc\""
            && let Some(v) = lines.next().and_then(|v| v.trim().strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_string());
        }
    }
    bail!("cudarc is not in Cargo.lock")
}

/// Writes `stubs/libcuda.so`: every driver function cudarc declares, as an empty symbol, so the binary links
/// without a driver; at run time the device's real `libcuda.so.1` is loaded instead.
fn driver_stub(root: &Path, stubs: &Path) -> Result<()> {
    let out = stubs.join("libcuda.so");
    if out.exists() {
        return Ok(());
    }
    let version = cudarc_version(root)?;
    // Make sure the crate's source is downloaded, then find it in cargo's registry.
    crate::cargo(root, &["fetch", "--locked"])?;
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from).join(".cargo"));
    let registry = cargo_home.join("registry/src");
    let sys = std::fs::read_dir(&registry)
        .with_context(|| format!("reading {}", registry.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(format!("cudarc-{version}/src/driver/sys/mod.rs")))
        .find(|p| p.exists())
        .with_context(|| format!("cudarc {version}'s driver bindings not found under {}", registry.display()))?;
    let src = std::fs::read_to_string(&sys).with_context(|| format!("reading {}", sys.display()))?;
    let names = driver_functions(&src);
    if names.len() < 100 {
        bail!("only {} driver functions found in {}; cudarc's layout changed?", names.len(), sys.display());
    }
    std::fs::create_dir_all(stubs).with_context(|| format!("creating {}", stubs.display()))?;
    let c = stubs.join("cuda_stub.c");
    let body: String = names.iter().map(|n| format!("void {n}(void) {{}}\n")).collect();
    std::fs::write(&c, body).with_context(|| format!("writing {}", c.display()))?;
    crate::run(Command::new("gcc").args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"]).arg(&out).arg(&c))?;
    eprintln!("xtask: wrote the driver stub {} ({} functions)", out.display(), names.len());
    Ok(())
}

/// The driver functions (`pub unsafe fn cuXxx(`) of cudarc's bindings, sorted and unique.
fn driver_functions(src: &str) -> Vec<String> {
    let mut names: Vec<String> = src
        .lines()
        .filter_map(|l| l.strip_prefix("pub unsafe fn "))
        .filter_map(|l| l.split_once('(').map(|(n, _)| n.trim().to_string()))
        .filter(|n| n.starts_with("cu") && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// Installs one wheel into its own folder `dir` unless `present`, a file the wheel brings, is already there.
fn install_wheel_once(dir: &Path, wheel: &str, present: &Path) -> Result<()> {
    if !present.exists() {
        eprintln!("xtask: installing {wheel} into {}", dir.display());
        let mut pip = Command::new("python3");
        pip.args(["-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target"]).arg(dir).arg(wheel);
        crate::run(&mut pip)?;
    }
    Ok(())
}

/// Installs the cuDNN wheel (once) and its `.so` links; returns the folder cudarc's build looks in (`CUDNN_LIB`).
fn ensure_cudnn() -> Result<PathBuf> {
    let dir = sdk_root().join("cudnn");
    let root = dir.join("nvidia/cudnn");
    install_wheel_once(&dir, CUDNN_WHEEL, &root.join("lib/libcudnn.so.9"))?;
    link_unversioned(&root.join("lib"))?;
    Ok(root)
}

/// Installs the NCCL wheel (once) and links its library into the toolkit's `lib` folder, where cudarc's build
/// looks for the libraries a binary links (`-lnccl`).
fn ensure_nccl(home: &Path) -> Result<()> {
    let dir = sdk_root().join("nccl");
    let lib = dir.join("nvidia/nccl/lib");
    install_wheel_once(&dir, NCCL_WHEEL, &lib.join("libnccl.so.2"))?;
    let link = home.join("lib/libnccl.so");
    if !link.exists() {
        std::os::unix::fs::symlink(lib.join("libnccl.so.2"), &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// The environment of the CUDA build.
fn cuda_env(cmd: &mut Command, home: &Path) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![home.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let joined = std::env::join_paths(paths).unwrap_or(path);
    cmd.env("CUDA_HOME", home)
        .env("NVCC", home.join("bin/nvcc"))
        .env("CUDA_COMPUTE_CAP", "90")
        .env("CUDARC_CUDA_VERSION", "13000")
        .env("PATH", joined);
}

/// The CUDA build's target folder.
pub(crate) fn cuda_target(root: &Path) -> PathBuf {
    crate::target_dir(root).join("cuda")
}

/// A `cargo` command in the CUDA build environment of the compiler wheels cached in `sdk` (installed when
/// missing): what `cargo xtask ci` type-checks the `cuda` and `cudnn` features with. Checking runs candle-kernels'
/// build script, which compiles candle's kernels with nvcc (PTX, and a static library of quantized-matmul
/// kernels), but links nothing, so neither the CUDA libraries, nor the driver stub, nor the cuDNN wheel are needed
/// (cudarc loads them at run time; `cudnn` only adds a link flag). Nothing runs those kernels either, so nvcc
/// compiles their device code unoptimised (`NVCC_APPEND_FLAGS`, about half of nvcc's time on 2 cores); every
/// file is still compiled in full.
pub(crate) fn cuda_check_cargo(root: &Path, sdk: &Path) -> Result<Command> {
    let home = install_wheels(sdk, COMPILER_WHEELS)?;
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root).env("NVCC_APPEND_FLAGS", "-Xcicc -O0 -Xptxas -O0");
    cuda_env(&mut cmd, &home);
    Ok(cmd)
}

/// The CUDA C sources Sluice compiles with NVRTC at run time: every `.cu` file under `crates/*/src`, sorted.
pub(crate) fn kernel_sources(root: &Path) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, out)?;
            } else if path.extension().is_some_and(|e| e == "cu") {
                out.push(path);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        let src = krate?.path().join("src");
        if src.is_dir() {
            walk(&src, &mut out)?;
        }
    }
    out.sort();
    Ok(out)
}

/// `nvcc -cubin` of every kernel source for sm_90 (the H100/H200), through the compiler wheels in `sdk`: the front
/// end NVRTC shares and ptxas, so a typo or an unresolved name fails here, not on the device. The cubins go to
/// `<target>/ptx` (nothing loads them: the binary compiles the same sources with NVRTC).
pub(crate) fn compile_kernels(root: &Path, sdk: &Path) -> Result<Vec<PathBuf>> {
    let home = install_wheels(sdk, COMPILER_WHEELS)?;
    let out = crate::target_dir(root).join("ptx");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let sources = kernel_sources(root)?;
    for src in &sources {
        let rel = src.strip_prefix(root).unwrap_or(src);
        let name = rel.to_string_lossy().replace('/', "_").replace(".cu", ".cubin");
        let mut cmd = Command::new(home.join("bin/nvcc"));
        cmd.args(["-cubin", "-arch=sm_90", "-std=c++17", "-Werror", "all-warnings", "-o"]).arg(out.join(name)).arg(src);
        cuda_env(&mut cmd, &home);
        eprintln!("xtask: nvcc -cubin -arch=sm_90 {}", rel.display());
        crate::run(&mut cmd).with_context(|| format!("compiling {}", rel.display()))?;
    }
    Ok(sources)
}

/// `cargo xtask gpu-build`: the toolkit (cached), then the release `sluice` with `features`; returns the binary.
pub(crate) fn gpu_build(root: &Path, features: &str) -> Result<PathBuf> {
    let home = ensure_sdk(root)?;
    let target = cuda_target(root);
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--release", "--locked", "-p", crate::CLI_PACKAGE, "--bin", "sluice", "--features", features])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(root);
    cuda_env(&mut cmd, &home);
    if features.split(',').any(|f| f.trim() == "cudnn") {
        cmd.env("CUDNN_LIB", ensure_cudnn()?);
    }
    if features.split(',').any(|f| f.trim() == "nccl") {
        ensure_nccl(&home)?;
    }
    eprintln!("xtask: cargo build --release -p {} --features {features} (CUDA 13.0, sm_90)", crate::CLI_PACKAGE);
    crate::run(&mut cmd)?;
    let bin = target.join("release/sluice");
    crate::run(Command::new("strip").arg(&bin))?;
    let size = std::fs::metadata(&bin).with_context(|| format!("reading {}", bin.display()))?.len();
    eprintln!("xtask: {} ({:.1} MiB stripped)", bin.display(), size as f64 / (1 << 20) as f64);
    Ok(bin)
}

/// The device check's script and its Ultralytics driver, copied into the prepared folder.
const SCRIPT: &str = include_str!("../gpu-check.sh");
const UL_SCRIPT: &str = include_str!("../gpu-check-ultralytics.py");
const CONVS_SCRIPT: &str = include_str!("../gpu-check-convs.py");
const AMP_SCRIPT: &str = include_str!("../gpu-check-amp.py");
const UL_MATRIX_SCRIPT: &str = include_str!("../gpu-check-ul-matrix.py");
/// The PyTorch side of the step-cost ledger; on the device it also counts Ultralytics' real CUDA kernels per phase.
const STEP_COST_SCRIPT: &str = include_str!("../../benches/step_cost_pytorch.py");
/// Images of coco128 carried to the device (about 11 MB of JPEGs).
const CHECK_IMAGES: usize = 64;
/// The Ultralytics release the peers' figures were made with.
const ULTRALYTICS: &str = "ultralytics==8.4.190";

fn copy(from: &Path, to: &Path) -> Result<u64> {
    std::fs::copy(from, to).with_context(|| format!("copying {} to {}", from.display(), to.display()))
}

/// The first `n` images of coco128's train split (sorted by name) with their labels, and a `data.yaml` that uses
/// them as train and val (as coco128's own does).
fn dataset_slice(src: &Path, dst: &Path, n: usize) -> Result<u64> {
    let images = src.join("images/train2017");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&images)
        .with_context(|| format!("reading {} (set SLUICE_COCO128)", images.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    names.sort();
    names.truncate(n);
    let (di, dl) = (dst.join("images/train2017"), dst.join("labels/train2017"));
    std::fs::create_dir_all(&di).and_then(|()| std::fs::create_dir_all(&dl)).context("creating the dataset")?;
    let mut bytes = 0;
    for img in &names {
        let Some(file) = img.file_name() else { continue };
        bytes += copy(img, &di.join(file))?;
        let label = src.join("labels/train2017").join(Path::new(file).with_extension("txt"));
        if label.exists() {
            bytes += copy(&label, &dl.join(Path::new(file).with_extension("txt")))?;
        }
    }
    let yaml = std::fs::read_to_string(src.join("data.yaml")).context("reading coco128's data.yaml")?;
    let names_block = yaml.find("names:").map_or("", |i| &yaml[i..]);
    let text = format!(
        "# The first {n} images of coco128 (train and val, as coco128 itself), for Sluice's device check.\n\
         train: images/train2017\nval: images/train2017\n\n{names_block}"
    );
    std::fs::write(dst.join("data.yaml"), text).context("writing data.yaml")?;
    Ok(bytes)
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(|e| e.ok())
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => folder_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

/// Bytes of the files git tracks (what a copy of the repository to the device machine holds).
fn tracked_bytes(root: &Path) -> Result<u64> {
    let out = Command::new("git").args(["ls-files", "-z"]).current_dir(root).output().context("cannot start git")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(out
        .stdout
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum())
}

/// The test executable cargo names for `source` (`tests/conformance.rs`) when `cmd` (a `cargo test --no-run`)
/// builds it.
fn test_executable(cmd: &mut Command, root: &Path, source: &str) -> Result<PathBuf> {
    let out = cmd.current_dir(root).output().context("cannot start cargo")?;
    let text = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("cargo test --no-run failed:\n{text}");
    }
    // cargo prints `Executable tests/conformance.rs (target/release/deps/conformance-<hash>)`.
    let prefix = format!("Executable {source} (");
    let exe = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .filter_map(|l| l.strip_suffix(')'))
        .next_back()
        .with_context(|| format!("cargo did not name the executable of {source}"))?;
    Ok(root.join(exe))
}

/// Builds `sluice-decode`'s conformance suite with `nvjpeg` (release) and returns the test executable.
fn conformance_binary(root: &Path) -> Result<PathBuf> {
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--release", "--locked", "-p", "sluice-decode", "--features", "nvjpeg"]).args([
        "--test",
        "conformance",
        "--no-run",
    ]);
    test_executable(&mut cmd, root, "tests/conformance.rs")
}

/// Builds the device checks (`sluice-infer`'s `gpu` test: `smoke`, `h2d`, `convs`) with CUDA in release, with the
/// CUDA features of `features` that `sluice-infer` has, and returns the test executable.
fn device_checks_binary(root: &Path, features: &str) -> Result<PathBuf> {
    let home = ensure_sdk(root)?;
    let wanted: Vec<&str> = features.split(',').map(str::trim).filter(|f| ["cuda", "cudnn"].contains(f)).collect();
    let infer = if wanted.is_empty() { "cuda".to_string() } else { wanted.join(",") };
    let mut cmd = Command::new("cargo");
    cmd.args(["test", "--release", "--locked", "-p", "sluice-infer", "--features", &infer])
        .args(["--test", "gpu", "--no-run", "--target-dir"])
        .arg(cuda_target(root));
    cuda_env(&mut cmd, &home);
    if wanted.contains(&"cudnn") {
        cmd.env("CUDNN_LIB", ensure_cudnn()?);
    }
    eprintln!("xtask: cargo test --release -p sluice-infer --features {infer} --test gpu --no-run (the device checks)");
    test_executable(&mut cmd, root, "tests/gpu/main.rs")
}

/// `cargo xtask gpu-check`: prepares `<target>/gpu-check/` and prints how to run it. With `max_mib`, the folder and
/// the repository's tracked files together are kept under that many MiB (for a machine that receives both as one
/// copy), leaving behind what the check can do without.
pub(crate) fn gpu_check(root: &Path, sluice: Option<PathBuf>, features: &str, max_mib: Option<u64>) -> Result<()> {
    let bin = match sluice {
        Some(b) => b,
        None => gpu_build(root, features)?,
    };
    let dir = crate::target_dir(root).join("gpu-check");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir.join("lib")).with_context(|| format!("creating {}", dir.display()))?;
    copy(&bin, &dir.join("sluice"))?;
    // nvJPEG and the CUDA runtime travel with the binary (small); cuBLAS, cuRAND and NVRTC (hundreds of MB) are
    // taken from the device's own Python wheels by the script.
    let lib = cuda_home(&sdk_root()).join("lib");
    for name in ["libnvjpeg.so.13", "libcudart.so.13"] {
        let from = lib.join(name);
        if from.exists() {
            copy(&from, &dir.join("lib").join(name))?;
        } else {
            eprintln!("xtask: {} not found; run `cargo xtask gpu-build` first", from.display());
        }
    }
    let data = dataset_slice(&sluice_testkit::locations::coco128_dir(), &dir.join("data"), CHECK_IMAGES)?;
    // The decode conformance suite with nvJPEG, prebuilt; on the device it reads the fixtures of the carried
    // working tree (`SLUICE_DECODE_TEST_DATA`).
    match conformance_binary(root) {
        Ok(bin) => {
            copy(&bin, &dir.join("conformance"))?;
            crate::run(Command::new("strip").arg(dir.join("conformance")))?;
        }
        Err(e) => eprintln!("xtask: the nvjpeg conformance suite was not built ({e:#}); that step will be skipped"),
    }
    // The device checks (GPU against CPU results, the transfer's bandwidth, the convolutions' speed), prebuilt.
    match device_checks_binary(root, features) {
        Ok(bin) => {
            copy(&bin, &dir.join("gpu"))?;
            crate::run(Command::new("strip").arg(dir.join("gpu")))?;
        }
        Err(e) => eprintln!("xtask: the device checks were not built ({e:#}); their steps will be skipped"),
    }
    std::fs::write(dir.join("run.sh"), SCRIPT).context("writing run.sh")?;
    std::fs::write(dir.join("ul_train.py"), UL_SCRIPT).context("writing ul_train.py")?;
    std::fs::write(dir.join("convs_torch.py"), CONVS_SCRIPT).context("writing convs_torch.py")?;
    std::fs::write(dir.join("amp_torch.py"), AMP_SCRIPT).context("writing amp_torch.py")?;
    std::fs::write(dir.join("ul_matrix.py"), UL_MATRIX_SCRIPT).context("writing ul_matrix.py")?;
    std::fs::write(dir.join("step_cost_torch.py"), STEP_COST_SCRIPT).context("writing step_cost_torch.py")?;
    let wheels = dir.join("wheels");
    let mut pip = Command::new("python3");
    pip.args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"]).arg(&wheels).arg(ULTRALYTICS);
    if let Err(e) = crate::run(&mut pip) {
        eprintln!("xtask: could not fetch the Ultralytics wheel ({e:#}); the side-by-side step will be skipped");
    }
    xz_pack(&dir)?;
    let tree = tracked_bytes(root)?;
    let mib = |b: u64| b as f64 / 1048576.0;
    let cap = max_mib.map_or(u64::MAX, |m| m << 20);
    fit_under(&dir, tree, cap)?;
    let total = folder_bytes(&dir);
    let data_now = if dir.join("data").exists() { data } else { 0 };
    eprintln!(
        "xtask: prepared {} ({:.1} MiB in all, dataset {:.1} MiB; the working tree adds {:.1} MiB)",
        dir.display(),
        mib(total),
        mib(data_now),
        mib(tree)
    );
    if total + tree > cap {
        bail!(
            "{} ({:.1} MiB) and the working tree ({:.1} MiB) are over the {} MiB asked for",
            dir.display(),
            mib(total),
            mib(tree),
            cap >> 20
        );
    }
    print_how_to_run(dir.strip_prefix(root).unwrap_or(&dir));
    Ok(())
}

/// The executables and libraries travel xz-compressed (a third of their size; `run.sh` unpacks them).
fn xz_pack(dir: &Path) -> Result<()> {
    let mut packed = vec![dir.join("sluice")];
    for name in ["conformance", "gpu"] {
        if dir.join(name).exists() {
            packed.push(dir.join(name));
        }
    }
    for entry in std::fs::read_dir(dir.join("lib")).context("reading the prepared lib folder")? {
        packed.push(entry?.path());
    }
    crate::run(Command::new("xz").args(["-T0", "-6", "--force"]).args(&packed))
}

/// Under a size cap (`cap` bytes for the folder and the tracked tree's `tree` bytes together), what does not fit is
/// left behind, the least needed first: the coco128 slice (the script then generates a synthetic 640 px set on the
/// device), the nvJPEG conformance suite and nvJPEG itself (their steps are then skipped), and last the device
/// checks' executable.
fn fit_under(dir: &Path, tree: u64, cap: u64) -> Result<()> {
    let optional = [
        (dir.join("data"), "the coco128 slice: the device generates a synthetic set instead"),
        (dir.join("conformance.xz"), "the nvJPEG conformance suite"),
        (dir.join("lib/libnvjpeg.so.13.xz"), "nvJPEG: the nvJPEG steps are skipped"),
        (dir.join("gpu.xz"), "the device checks: the smoke, h2d and convs steps are skipped"),
    ];
    for (path, what) in optional {
        if folder_bytes(dir) + tree <= cap {
            break;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path).with_context(|| format!("removing {}", path.display()))?;
        } else if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        } else {
            continue;
        }
        eprintln!("xtask: left out to fit {} MiB: {what}", cap >> 20);
    }
    Ok(())
}

/// How to run the prepared folder `rel` (relative to the repository's root) on a CUDA machine.
fn print_how_to_run(rel: &Path) {
    println!(
        "Copy the repository with {} to a CUDA machine (Python with PyTorch for the peers), then from the",
        rel.display()
    );
    println!("repository's root run:");
    println!("  bash {}/run.sh", rel.display());
    println!(
        "Every step is time-boxed within GPU_CHECK_BUDGET seconds (500 by default). The results land in $OUT \
         (default {}/out): gpu-check.tgz (every step's output, weights left out) and, beside it, log.txt, \
         steps.jsonl, paths.json (which opt-in device paths passed), smoke.json, amp_torch.json, convs.json and \
         convs_torch.json.",
        rel.display()
    );
    println!(
        "The training matrix (Sluice and Ultralytics, f32 and AMP, batch 32 and 64) runs on its own:\n  \
         GPU_CHECK_ONLY=matrix bash {}/run.sh   (matrix.jsonl)",
        rel.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_functions_are_read_from_bindings() {
        let src = "pub unsafe fn cuInit(Flags: u32) -> CUresult {\n    x\n}\n\
                   pub unsafe fn cuMemAlloc_v2(p: *mut u64) -> CUresult {}\n\
                   pub unsafe fn cuInit(Flags: u32) -> CUresult {}\n\
                   pub fn helper() {}\n    pub unsafe fn cuNested() {}\n";
        assert_eq!(driver_functions(src), vec!["cuInit".to_string(), "cuMemAlloc_v2".to_string()]);
    }

    #[test]
    fn unversioned_links_point_at_the_versioned_files() {
        let dir = std::env::temp_dir().join(format!("sluice-xtask-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("libcublas.so.13"), b"x").expect("file");
        std::fs::write(dir.join("libnvrtc-builtins.so.13.0"), b"x").expect("file");
        link_unversioned(&dir).expect("links");
        link_unversioned(&dir).expect("idempotent");
        assert_eq!(std::fs::read_link(dir.join("libcublas.so")).expect("link"), PathBuf::from("libcublas.so.13"));
        assert!(dir.join("libnvrtc-builtins.so").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
