//! Packed shards in object storage (`s3://`, `gs://`, `az://`, `https://`), staged onto the node's local disk.
//!
//! [`stage_shard`] copies one shard object into a local folder by parallel ranged reads through the `object_store`
//! crate (its retries with exponential back-off cover transient errors; a permanent one, such as a missing object or
//! a refused credential, is an error naming the object). The copy is written under a temporary name, synced and
//! renamed, so a killed transfer is never taken for a shard, and it is validated as a shard (header, index checksum,
//! bounds) before it is used; its records keep their per-record checksums, checked on every read. The local name
//! carries a key of the URL, the object's size and its ETag (or modification time), so a later run reuses the copy
//! after one metadata request, and a rewritten object is fetched again.
//!
//! Why staged rather than read record by record while training: a shard stores each record's labels beside its
//! image, so indexing the split (labels, image sizes) reads every record anyway; one sequential pass of large
//! ranged reads is the cheapest way to do that, and every later epoch then reads the local copy through the page
//! cache.
//!
//! Client settings come in explicitly ([`RemoteOptions::settings`]): this crate reads no environment variable.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ObjectStore, ObjectStoreExt, ObjectStoreScheme, RetryConfig};

use crate::error::{Result, StorageError};
use crate::shard::PackedReader;

/// How to reach the store and how hard to pull.
#[derive(Debug, Clone)]
pub struct RemoteOptions {
    /// Client settings as `(key, value)`: `object_store`'s configuration keys (`aws_access_key_id`,
    /// `aws_secret_access_key`, `aws_region`, `aws_endpoint`, `aws_allow_http`, `google_service_account`,
    /// `azure_storage_account_name`, ...). The `sluice` binary passes the process's `AWS_*`, `GOOGLE_*` and
    /// `AZURE_*` variables, lowercased, as the client libraries of those clouds read them.
    pub settings: Vec<(String, String)>,
    /// Ranged reads in flight at once.
    pub parallel: usize,
    /// Bytes per ranged read.
    pub chunk_bytes: u64,
    /// How long a failing request is retried before the copy fails.
    pub retry: Retry,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self { settings: Vec::new(), parallel: 8, chunk_bytes: 8 << 20, retry: Retry::default() }
    }
}

/// Retries of a request that fails with a transient error (a refused or dropped connection, a timeout, a 5xx or 429
/// status), with exponential back-off from `first_backoff` up to `max_backoff` between tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Tries after the first (0: none).
    pub max_retries: usize,
    /// No retry starts later than this after the first try.
    pub timeout: Duration,
    /// The wait before the first retry; each later wait doubles, up to `max_backoff`.
    pub first_backoff: Duration,
    /// The longest wait between two tries.
    pub max_backoff: Duration,
}

/// `object_store`'s own defaults: 10 retries within 3 minutes, waits from 100 ms up to 15 s.
impl Default for Retry {
    fn default() -> Self {
        Self {
            max_retries: 10,
            timeout: Duration::from_secs(180),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
        }
    }
}

impl Retry {
    fn config(self) -> RetryConfig {
        RetryConfig {
            backoff: BackoffConfig { init_backoff: self.first_backoff, max_backoff: self.max_backoff, base: 2.0 },
            max_retries: self.max_retries,
            retry_timeout: self.timeout,
        }
    }
}

/// The store of `url` with `settings` (as `object_store::parse_url_opts` applies them: unknown keys are ignored)
/// and `retry`, and the object's path in it.
fn open_store(
    url: &url::Url,
    settings: &[(String, String)],
    retry: Retry,
) -> std::result::Result<(Box<dyn ObjectStore>, ObjectPath), object_store::Error> {
    macro_rules! build {
        ($builder:ty, $url:expr) => {{
            let builder = settings.iter().fold(<$builder>::new().with_url($url), |b, (key, value)| {
                match key.to_ascii_lowercase().parse() {
                    Ok(k) => b.with_config(k, value.clone()),
                    Err(_) => b,
                }
            });
            Box::new(builder.with_retry(retry.config()).build()?) as Box<dyn ObjectStore>
        }};
    }
    let (scheme, path) = ObjectStoreScheme::parse(url)?;
    let path = ObjectPath::parse(path)?;
    let store = match scheme {
        ObjectStoreScheme::AmazonS3 => build!(object_store::aws::AmazonS3Builder, url.to_string()),
        ObjectStoreScheme::GoogleCloudStorage => build!(object_store::gcp::GoogleCloudStorageBuilder, url.to_string()),
        ObjectStoreScheme::MicrosoftAzure => build!(object_store::azure::MicrosoftAzureBuilder, url.to_string()),
        ObjectStoreScheme::Http => build!(object_store::http::HttpBuilder, &url[..url::Position::BeforePath]),
        other => {
            return Err(object_store::Error::NotSupported {
                source: format!("{other:?} is not an object store Sluice reads shards from").into(),
            });
        }
    };
    Ok((store, path))
}

/// A shard object copied to local disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// The local copy, a valid shard.
    pub path: PathBuf,
    /// The object's size in bytes.
    pub bytes: u64,
    /// Bytes read from the store now (0 when a previous copy was reused).
    pub fetched: u64,
}

/// Copies the shard at `url` into `dir` (created if missing) unless a copy of the same object is there already;
/// `progress(done, total)` is called as bytes arrive.
pub fn stage_shard(url: &str, dir: &Path, opts: &RemoteOptions, progress: &mut dyn FnMut(u64, u64)) -> Result<Staged> {
    let remote = |reason: String| StorageError::Remote { url: url.to_string(), reason };
    let parsed = url::Url::parse(url).map_err(|e| remote(format!("not a valid URL: {e}")))?;
    let (store, location) = open_store(&parsed, &opts.settings, opts.retry).map_err(|e| remote(e.to_string()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sluice-remote")
        .enable_all()
        .build()
        .map_err(|e| remote(format!("cannot start the I/O runtime: {e}")))?;
    let meta = runtime.block_on(store.head(&location)).map_err(|e| remote(e.to_string()))?;
    let version = meta.e_tag.clone().unwrap_or_else(|| meta.last_modified.to_rfc3339());
    let path = dir.join(local_name(url, meta.size, &version));
    if let Ok(reader) = PackedReader::open(&path)
        && reader.file_bytes() as u64 == meta.size
    {
        return Ok(Staged { path, bytes: meta.size, fetched: 0 });
    }
    std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
    crate::space::ensure_free_space(dir, meta.size, "the shard's local copy")?;
    let part = tempfile::Builder::new()
        .prefix(".staging-")
        .suffix(".part")
        .tempfile_in(dir)
        .map_err(|e| StorageError::io(dir, e))?;
    part.as_file().set_len(meta.size).map_err(|e| StorageError::io(part.path(), e))?;
    let chunk = opts.chunk_bytes.max(1);
    let ranges: Vec<Range<u64>> =
        (0..meta.size.div_ceil(chunk)).map(|i| i * chunk..((i + 1) * chunk).min(meta.size)).collect();
    runtime.block_on(fetch_ranges(
        &*store,
        &location,
        ranges,
        opts.parallel.max(1),
        part.as_file(),
        &remote,
        |done| progress(done, meta.size),
    ))?;
    part.as_file().sync_all().map_err(|e| StorageError::io(part.path(), e))?;
    part.persist(&path).map_err(|e| StorageError::io(&path, e.error))?;
    if let Err(e) = PackedReader::open(&path) {
        // Never left where a later run would take it for a shard.
        let _ = std::fs::remove_file(&path);
        return Err(remote(format!("the copy is not usable: {e}")));
    }
    Ok(Staged { path, bytes: meta.size, fetched: meta.size })
}

/// Reads `ranges` of the object, `parallel` at a time, writing each at its offset of `out`.
async fn fetch_ranges(
    store: &dyn ObjectStore,
    location: &ObjectPath,
    ranges: Vec<Range<u64>>,
    parallel: usize,
    out: &File,
    remote: &dyn Fn(String) -> StorageError,
    mut progress: impl FnMut(u64),
) -> Result<()> {
    let mut pending = futures::stream::iter(ranges)
        .map(|r| async move {
            let bytes = store.get_range(location, r.clone()).await;
            (r, bytes)
        })
        .buffer_unordered(parallel);
    let mut done = 0u64;
    while let Some((r, bytes)) = pending.next().await {
        let bytes = bytes.map_err(|e| remote(format!("bytes {}..{}: {e}", r.start, r.end)))?;
        if bytes.len() as u64 != r.end - r.start {
            return Err(remote(format!(
                "bytes {}..{}: the store returned {} bytes (the object changed while it was read?)",
                r.start,
                r.end,
                bytes.len()
            )));
        }
        out.write_all_at(&bytes, r.start).map_err(|e| remote(format!("writing the local copy: {e}")))?;
        done += bytes.len() as u64;
        progress(done);
    }
    Ok(())
}

/// `<object file stem>-<key>.sluice`, the key a digest of the URL, the size and the version.
fn local_name(url: &str, size: u64, version: &str) -> String {
    let stem = url.rsplit('/').next().and_then(|n| n.strip_suffix(".sluice").or(Some(n))).unwrap_or("shard");
    let stem: String =
        stem.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let a = crc32fast::hash(url.as_bytes());
    let b = crc32fast::hash(format!("{size}\n{version}").as_bytes());
    format!("{stem}-{a:08x}{b:08x}.sluice")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_name_changes_with_the_object() {
        let a = local_name("s3://b/coco/train.sluice", 100, "\"etag1\"");
        assert!(a.starts_with("train-") && a.ends_with(".sluice"), "{a}");
        assert_eq!(a, local_name("s3://b/coco/train.sluice", 100, "\"etag1\""));
        assert_ne!(a, local_name("s3://b/coco/train.sluice", 100, "\"etag2\""));
        assert_ne!(a, local_name("s3://b/coco/train.sluice", 101, "\"etag1\""));
        assert_ne!(a, local_name("s3://b/other/train.sluice", 100, "\"etag1\""));
    }
}
