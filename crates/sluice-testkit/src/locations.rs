//! Where the data that lives outside the repository is found: the shared datasets, the reference fixtures and the
//! peers' scripts. Every bench, end-to-end check and tool asks here, so there is one rule, set by environment
//! variables whose defaults are relative to the repository:
//!
//! | variable | default |
//! |---|---|
//! | `SLUICE_SHARED` | `../shared` beside the repository |
//! | `SLUICE_DATASETS` | `$SLUICE_SHARED/datasets` |
//! | `SLUICE_COCO128` | `$SLUICE_DATASETS/coco128` |
//! | `SLUICE_FIXTURES` | `$SLUICE_SHARED/fixtures` |
//! | `PEERS_DIR` | `$SLUICE_SHARED/peers` |
//!
//! Tests never need any of them: the files a test reads are committed beside it.

use std::path::PathBuf;

/// The repository root, from this crate's location at build time (`crates/sluice-testkit` → two levels up).
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().and_then(|p| p.parent()).map(PathBuf::from).unwrap_or(manifest)
}

fn from_env(var: &str, default: impl FnOnce() -> PathBuf) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => default(),
    }
}

/// `SLUICE_SHARED`, else `../shared` beside the repository.
pub fn shared_dir() -> PathBuf {
    from_env("SLUICE_SHARED", || repo_root().join("..").join("shared"))
}

/// `SLUICE_DATASETS`, else `datasets` under [`shared_dir`].
pub fn datasets_dir() -> PathBuf {
    from_env("SLUICE_DATASETS", || shared_dir().join("datasets"))
}

/// `SLUICE_COCO128`, else `coco128` under [`datasets_dir`].
pub fn coco128_dir() -> PathBuf {
    from_env("SLUICE_COCO128", || datasets_dir().join("coco128"))
}

/// `SLUICE_FIXTURES`, else `fixtures` under [`shared_dir`].
pub fn fixtures_dir() -> PathBuf {
    from_env("SLUICE_FIXTURES", || shared_dir().join("fixtures"))
}

/// `PEERS_DIR`, else `peers` under [`shared_dir`].
pub fn peers_dir() -> PathBuf {
    from_env("PEERS_DIR", || shared_dir().join("peers"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_root_holds_the_workspace_manifest() {
        assert!(repo_root().join("Cargo.toml").is_file());
        assert!(repo_root().join("crates").join("sluice-testkit").is_dir());
    }

    #[test]
    fn defaults_nest_under_shared() {
        // Only checks the nesting when no override is set, so the test holds on any machine.
        if std::env::var_os("SLUICE_SHARED").is_none() && std::env::var_os("SLUICE_DATASETS").is_none() {
            assert_eq!(datasets_dir(), shared_dir().join("datasets"));
            assert!(shared_dir().ends_with("shared"));
        }
    }
}
