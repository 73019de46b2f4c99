//! The dependency rule of `ARCHITECTURE.md`, checked on the workspace's real graph (`cargo metadata`): which Sluice
//! crate may depend on which. A test here runs it on every `cargo test --workspace`, and `cargo xtask tidy` prints
//! the edges it forbids.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The Sluice crates each crate may depend on (normal, build and dev dependencies alike); a crate not listed may
/// depend on any Sluice crate but `sluice-cli`, on which nothing depends.
const ALLOWED: &[(&str, &[&str])] = &[
    ("sluice-core", &[]),
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
    ("xtask", &["sluice-core"]),
];

/// One package of the graph: its name and the names of the packages it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Package {
    pub(crate) name: String,
    pub(crate) deps: Vec<String>,
}

/// The edges between workspace packages that the rule forbids, one line each.
pub(crate) fn forbidden_edges(packages: &[Package]) -> Vec<String> {
    let ours = |n: &str| packages.iter().any(|p| p.name == n);
    let mut bad = Vec::new();
    for p in packages {
        for d in p.deps.iter().filter(|d| ours(d)) {
            let allowed = match ALLOWED.iter().find(|(n, _)| *n == p.name) {
                Some((_, list)) => list.contains(&d.as_str()),
                None => d != "sluice-cli",
            };
            if !allowed {
                let rule = match ALLOWED.iter().find(|(n, _)| *n == p.name) {
                    Some((_, [])) => "no Sluice crate".to_string(),
                    Some((_, list)) => list.join(", "),
                    None => "any Sluice crate but sluice-cli".to_string(),
                };
                bad.push(format!("{} depends on {d}; it may depend on {rule} (ARCHITECTURE.md)", p.name));
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
                .map(|d| d.iter().filter_map(|d| d["name"].as_str().map(str::to_string)).collect())
                .unwrap_or_default();
            Ok(Package { name, deps })
        })
        .collect()
}

/// `cargo xtask tidy`: fails naming every forbidden edge.
pub(crate) fn tidy(root: &Path) -> Result<()> {
    let bad = forbidden_edges(&workspace_packages(root)?);
    if !bad.is_empty() {
        bail!("the dependency rule is broken:\n  {}", bad.join("\n  "));
    }
    eprintln!("xtask: the crate graph keeps the dependency rule of ARCHITECTURE.md");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pkg(name: &str, deps: &[&str]) -> Package {
        Package { name: name.into(), deps: deps.iter().map(|d| d.to_string()).collect() }
    }

    #[test]
    fn the_workspace_keeps_the_dependency_rule() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root");
        let packages = workspace_packages(root).expect("cargo metadata");
        assert!(packages.iter().any(|p| p.name == "sluice-model"), "the workspace's packages were read");
        let bad = forbidden_edges(&packages);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn a_stage_crate_reaching_another_or_anything_reaching_the_cli_is_named() {
        let graph = [
            pkg("sluice-core", &[]),
            pkg("sluice-eval", &["sluice-core"]),
            pkg("sluice-model", &["sluice-core", "sluice-eval", "candle-core"]),
            pkg("sluice-cli", &["sluice-model"]),
            pkg("sluice-train", &["sluice-model", "sluice-cli"]),
        ];
        let bad = forbidden_edges(&graph);
        assert_eq!(bad.len(), 2, "{bad:?}");
        assert!(
            bad[0].starts_with("sluice-model depends on sluice-eval; it may depend on sluice-core, sluice-kernels")
        );
        assert!(bad[1].starts_with("sluice-train depends on sluice-cli"));
        // Crates outside the workspace (candle-core) are not Sluice's to rule.
        assert!(forbidden_edges(&graph[..2]).is_empty());
    }
}
