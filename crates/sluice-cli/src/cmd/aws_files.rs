//! The AWS shared configuration files as object-store settings, read as the AWS CLI and SDKs read them: the
//! credentials file (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`) and the config file
//! (`AWS_CONFIG_FILE`, else `~/.aws/config`), in the profile `AWS_PROFILE` names (`default` otherwise; a section
//! `[NAME]` in the credentials file, `[profile NAME]` or `[default]` in the config file). A variable of the environment
//! wins over the files, and the credentials file over the config file. An `http://` endpoint in the config file
//! allows plain HTTP, as the AWS CLI connects to it (the client library asks for that setting separately).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The keys taken from the files, and the setting each becomes.
const KEYS: [(&str, &str); 5] = [
    ("aws_access_key_id", "aws_access_key_id"),
    ("aws_secret_access_key", "aws_secret_access_key"),
    ("aws_session_token", "aws_session_token"),
    ("region", "aws_region"),
    ("endpoint_url", "aws_endpoint_url"),
];

/// The settings the files add to `env` (the `AWS_*` variables, names lowercased as the client reads them), for the
/// profile and files that `env` names, with `home` for the default paths. A file named by a variable must exist; a
/// default file may be absent.
pub(crate) fn settings(env: &[(String, String)], home: Option<&Path>) -> Result<Vec<(String, String)>> {
    let var = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let profile = var("aws_profile").unwrap_or("default");
    let file = |named: &str, default: &str| -> Option<(PathBuf, bool)> {
        match var(named) {
            Some(p) => Some((PathBuf::from(p), true)),
            None => home.map(|h| (h.join(".aws").join(default), false)),
        }
    };
    let config_section = if profile == "default" { "default".to_string() } else { format!("profile {profile}") };
    let mut out: Vec<(String, String)> = Vec::new();
    for (named, default, section) in [
        ("aws_shared_credentials_file", "credentials", profile.to_string()),
        ("aws_config_file", "config", config_section),
    ] {
        let Some((path, required)) = file(named, default) else { continue };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let ini = ini::Ini::load_from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        let Some(props) = ini.section(Some(section.as_str())) else { continue };
        for (key, setting) in KEYS {
            let taken = |s: &str| var(s).is_some() || out.iter().any(|(k, _)| k == s);
            if let Some(v) = props.get(key).filter(|_| !taken(setting)) {
                out.push((setting.to_string(), v.trim().to_string()));
            }
        }
    }
    let http = out.iter().any(|(k, v)| k == "aws_endpoint_url" && v.starts_with("http://"));
    if http && var("aws_allow_http").is_none() {
        out.push(("aws_allow_http".into(), "true".into()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_profile_is_read_from_both_files_with_the_environment_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let aws = dir.path().join(".aws");
        std::fs::create_dir_all(&aws).expect("mkdir");
        std::fs::write(
            aws.join("credentials"),
            "[default]\naws_access_key_id = AKDEFAULT\naws_secret_access_key = s0\n\n[lab]\naws_access_key_id = \
             AKLAB\naws_secret_access_key = s1\n",
        )
        .expect("credentials");
        std::fs::write(
            aws.join("config"),
            "[default]\nregion = eu-west-1\n\n[profile lab]\nregion = us-east-2\nendpoint_url = http://127.0.0.1:9000\n\
             aws_access_key_id = AKCONFIG\ns3 =\n    addressing_style = path\n",
        )
        .expect("config");
        let home = Some(dir.path());
        let got = settings(&env(&[]), home).expect("default");
        assert_eq!(
            got,
            env(&[("aws_access_key_id", "AKDEFAULT"), ("aws_secret_access_key", "s0"), ("aws_region", "eu-west-1")])
        );
        // Another profile; its credentials file wins over the config file's key, and its http endpoint is allowed.
        let got = settings(&env(&[("aws_profile", "lab")]), home).expect("lab");
        assert_eq!(
            got,
            env(&[
                ("aws_access_key_id", "AKLAB"),
                ("aws_secret_access_key", "s1"),
                ("aws_region", "us-east-2"),
                ("aws_endpoint_url", "http://127.0.0.1:9000"),
                ("aws_allow_http", "true"),
            ])
        );
        // The environment wins: a key set there is not taken from the files.
        let got = settings(&env(&[("aws_profile", "lab"), ("aws_region", "ap-south-1")]), home).expect("env");
        assert!(!got.iter().any(|(k, _)| k == "aws_region"), "{got:?}");
        // No home and no files named: nothing; a file named by a variable must exist.
        assert!(settings(&env(&[]), None).expect("none").is_empty());
        let named = env(&[("aws_config_file", "/nonexistent/aws-config")]);
        let err = settings(&named, None).expect_err("missing named file");
        assert!(format!("{err:#}").contains("/nonexistent/aws-config"), "{err:#}");
    }
}
