//! One module per `sluice` subcommand: its clap `Args` and its `run`.

#[cfg(feature = "object-store")]
mod aws_files;
pub(crate) mod bench;
pub(crate) mod data;
pub(crate) mod eval_coco;
pub(crate) mod export;
pub(crate) mod info;
pub(crate) mod model;
pub(crate) mod pack;
pub(crate) mod predict;
pub(crate) mod step_cost;
pub(crate) mod train;
pub(crate) mod val;

/// The object-store client's settings from the process's environment: every `AWS_*`, `GOOGLE_*` and `AZURE_*`
/// variable, its name lowercased, as the client libraries of those clouds read them (`AWS_ACCESS_KEY_ID`,
/// `AWS_ENDPOINT_URL`, `AWS_REGION`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...), and with
/// object storage built in, what the AWS shared configuration files add for the profile (`aws_files`).
pub(crate) fn store_settings_from_env() -> anyhow::Result<Vec<(String, String)>> {
    let mut out: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| ["AWS_", "GOOGLE_", "AZURE_"].iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    #[cfg(feature = "object-store")]
    {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        let files = aws_files::settings(&out, home.as_deref())?;
        out.extend(files);
    }
    out.sort();
    Ok(out)
}

/// How a command that reads a dataset reaches splits in object storage: the client's settings from the environment,
/// the copies beside the data YAML.
pub(crate) fn remote_from_env() -> anyhow::Result<sluice_loader::RemoteConfig> {
    Ok(sluice_loader::RemoteConfig { cache_dir: None, settings: store_settings_from_env()? })
}
