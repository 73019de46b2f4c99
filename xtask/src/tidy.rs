//! The rules of `ARCHITECTURE.md` that code can check, on the workspace as it is: which Sluice crate may depend on
//! which (`cargo metadata`), and that no library crate's source reads an environment variable (configuration comes
//! in as values; only the `sluice` binary, tests, benches, `sluice-testkit` and `xtask` read the environment), and that no source file but a test file is longer than [`MAX_LINES`]. The tests
//! here run them on every `cargo test --workspace`; `cargo xtask tidy` prints what they forbid.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The development helpers: any crate may take them as a dev-dependency, none but `xtask` as a normal one.
const TESTKIT: &str = "sluice-testkit";

/// The Sluice crates each crate may depend on (normal and build dependencies; dev-dependencies too, besides
/// [`TESTKIT`]); a crate not listed may depend on any Sluice crate but `sluice-cli`, on which nothing depends.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sluice-core", &[]),
    ("sluice-testkit", &[]),
    ("sluice-kernels", &["sluice-core"]),
    ("sluice-dataset", &["sluice-core"]),
    ("sluice-storage", &["sluice-core"]),
    ("sluice-decode", &["sluice-core"]),
    ("sluice-augment", &["sluice-core"]),
    ("sluice-transfer", &["sluice-core", "sluice-kernels"]),
    ("sluice-model", &["sluice-core", "sluice-kernels"]),
    ("sluice-eval", &["sluice-core", "sluice-kernels"]),
    ("sluice-loader", &["sluice-core", "sluice-dataset", "sluice-storage", "sluice-decode", "sluice-augment"]),
    ("sluice-dist", &["sluice-core"]),
    ("sluice-export", &["sluice-core", "sluice-model"]),
    ("sluice-optim", &["sluice-core", "sluice-kernels", "sluice-model"]),
    (
        "sluice-infer",
        &[
            "sluice-core",
            "sluice-augment",
            "sluice-dataset",
            "sluice-decode",
            "sluice-eval",
            "sluice-kernels",
            "sluice-loader",
            "sluice-model",
            "sluice-optim",
            "sluice-transfer",
        ],
    ),
    (
        "sluice-ledger",
        &[
            "sluice-core",
            "sluice-eval",
            "sluice-infer",
            "sluice-kernels",
            "sluice-model",
            "sluice-optim",
            "sluice-transfer",
        ],
    ),
    ("xtask", &[TESTKIT]),
];

/// The crates whose library source may read the environment: the binary a user runs and the development helpers.
const READS_ENV: &[&str] = &["sluice-cli", TESTKIT];

/// The longest a source file may be (test files apart: `tests/`, and a module's `tests.rs`): a room a reader
/// takes in whole.
const MAX_LINES: usize = 800;

/// One package of the graph: its name and its dependencies, each with whether it is a dev-dependency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) deps: Vec<(String, bool)>,
}

/// The edges between workspace packages that the rule forbids, one line each.
pub(crate) fn forbidden_edges(packages: &[Package]) -> Vec<String> {
    let ours = |n: &str| packages.iter().any(|p| p.name == n);
    let mut bad = Vec::new();
    for p in packages {
        let rule = ALLOWED.iter().find(|(n, _)| *n == p.name).map(|(_, list)| *list);
        for (d, dev) in p.deps.iter().filter(|(d, _)| ours(d)) {
            let allowed = match rule {
                _ if *dev && d == TESTKIT => true,
                Some(list) => list.contains(&d.as_str()),
                None => d != "sluice-cli" && d != TESTKIT,
            };
            if !allowed {
                let may = match rule {
                    Some([]) => "no Sluice crate".to_string(),
                    Some(list) => list.join(", "),
                    None => format!("any Sluice crate but sluice-cli ({TESTKIT} as a dev-dependency only)"),
                };
                bad.push(format!("{} depends on {d}; it may depend on {may} (ARCHITECTURE.md)", p.name));
            }
        }
    }
    bad
}

/// The workspace's packages with their dependencies, from `cargo metadata --no-deps`.
pub(crate) fn workspace_packages(root: &Path) -> Result<Vec<Package>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("reading cargo metadata's JSON")?;
    let packages = v["packages"].as_array().context("cargo metadata: no packages")?;
    packages
        .iter()
        .map(|p| {
            let name = p["name"].as_str().context("a package without a name")?.to_string();
            let deps = p["dependencies"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .filter_map(|d| Some((d["name"].as_str()?.to_string(), d["kind"].as_str() == Some("dev"))))
                        .collect()
                })
                .unwrap_or_default();
            Ok(Package { name, deps })
        })
        .collect()
}

/// Every `file:line` of `text` (the source of `file`) that reads an environment variable.
fn env_reads(file: &Path, text: &str) -> Vec<String> {
    const READS: [&str; 4] = ["env::var(", "env::var_os(", "env::vars(", "env::vars_os("];
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//") && READS.iter().any(|r| l.contains(r)))
        .map(|(i, l)| format!("{}:{}: {}", file.display(), i + 1, l.trim()))
        .collect()
}

/// The `.rs` files under `dir`, recursively.
fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The environment reads in library crates' sources (`crates/*/src`, but the crates of [`READS_ENV`]), relative
/// to `root`.
pub(crate) fn library_env_reads(root: &Path) -> Result<Vec<String>> {
    let mut files = Vec::new();
    for krate in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        let krate = krate?.path();
        let name = krate.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if krate.join("src").is_dir() && !READS_ENV.contains(&name.as_str()) {
            rust_sources(&krate.join("src"), &mut files)?;
        }
    }
    files.sort();
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        found.extend(env_reads(f.strip_prefix(root).unwrap_or(&f), &text));
    }
    Ok(found)
}

/// Whether a source file is longer than [`MAX_LINES`]: `file: N lines` if so.
fn oversized(file: &Path, text: &str) -> Option<String> {
    let n = text.lines().count();
    (n > MAX_LINES).then(|| format!("{}: {n} lines (at most {MAX_LINES}; split it by concern)", file.display()))
}

/// The non-test sources of the crates and of `xtask` (everything under `src/` but files named `tests.rs`) longer
/// than [`MAX_LINES`], relative to `root`.
pub(crate) fn oversized_sources(root: &Path) -> Result<Vec<String>> {
    let mut dirs: Vec<PathBuf> = vec![root.join("xtask/src")];
    for krate in std::fs::read_dir(root.join("crates")).context("reading crates/")? {
        dirs.push(krate?.path().join("src"));
    }
    let mut files = Vec::new();
    for d in dirs.iter().filter(|d| d.is_dir()) {
        rust_sources(d, &mut files)?;
    }
    files.retain(|f| f.file_name().is_none_or(|n| n != "tests.rs"));
    files.sort();
    let mut found = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        found.extend(oversized(f.strip_prefix(root).unwrap_or(&f), &text));
    }
    Ok(found)
}

/// `cargo xtask tidy`: fails naming every forbidden edge, every environment read in a library crate and every
/// source file over [`MAX_LINES`].
pub(crate) fn tidy(root: &Path) -> Result<()> {
    let mut bad = forbidden_edges(&workspace_packages(root)?);
    bad.extend(library_env_reads(root)?.into_iter().map(|r| format!("a library crate reads the environment: {r}")));
    bad.extend(oversized_sources(root)?.into_iter().map(|r| format!("a source file too long to read whole: {r}")));
    if !bad.is_empty() {
        bail!("the rules of ARCHITECTURE.md are broken:\n  {}", bad.join("\n  "));
    }
    eprintln!("xtask: the crate graph and the library sources keep the rules of ARCHITECTURE.md");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root")
    }

    fn pkg(name: &str, deps: &[&str]) -> Package {
        let dep = |d: &&str| d.strip_prefix("dev:").map_or((d.to_string(), false), |d| (d.to_string(), true));
        Package { name: name.into(), deps: deps.iter().map(dep).collect() }
    }

    #[test]
    fn the_workspace_keeps_the_dependency_rule() {
        let packages = workspace_packages(root()).expect("cargo metadata");
        assert!(packages.iter().any(|p| p.name == "sluice-model"), "the workspace's packages were read");
        let bad = forbidden_edges(&packages);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn a_stage_crate_reaching_another_or_anything_reaching_the_cli_is_named() {
        let graph = [
            pkg("sluice-core", &[]),
            pkg("sluice-testkit", &[]),
            pkg("sluice-eval", &["sluice-core", "dev:sluice-testkit"]),
            pkg("sluice-model", &["sluice-core", "sluice-eval", "candle-core"]),
            pkg("sluice-cli", &["sluice-model"]),
            pkg("sluice-train", &["sluice-model", "sluice-cli", "sluice-testkit"]),
        ];
        let bad = forbidden_edges(&graph);
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(
            bad[0].starts_with("sluice-model depends on sluice-eval; it may depend on sluice-core, sluice-kernels")
        );
        assert!(bad[1].starts_with("sluice-train depends on sluice-cli"));
        assert!(bad[2].starts_with("sluice-train depends on sluice-testkit"));
        // Crates outside the workspace (candle-core) are not Sluice's to rule; a dev-dependency on the testkit is
        // fine anywhere.
        assert!(forbidden_edges(&graph[..3]).is_empty());
    }

    #[test]
    fn no_library_crate_reads_the_environment() {
        let found = library_env_reads(root()).expect("reading the sources");
        assert!(found.is_empty(), "configuration comes in as values:\n{}", found.join("\n"));
    }

    #[test]
    fn no_source_file_is_longer_than_a_room() {
        let found = oversized_sources(root()).expect("reading the sources");
        assert!(found.is_empty(), "split these by concern (tests may go to a `tests.rs`):\n{}", found.join("\n"));
    }

    #[test]
    fn a_long_file_is_named_with_its_length() {
        let text = "fn f() {}\n".repeat(MAX_LINES);
        assert_eq!(oversized(Path::new("a.rs"), &text), None);
        let longer = format!("{text}// one more\n");
        assert_eq!(
            oversized(Path::new("a.rs"), &longer).as_deref(),
            Some("a.rs: 801 lines (at most 800; split it by concern)")
        );
    }

    #[test]
    fn environment_reads_are_found_and_comments_are_not() {
        let text = "fn f() {\n    // std::env::var(\"A\") in a comment\n    let a = std::env::var_os(\"B\");\n}\n";
        assert_eq!(env_reads(Path::new("x.rs"), text), ["x.rs:3: let a = std::env::var_os(\"B\");"]);
    }
}
