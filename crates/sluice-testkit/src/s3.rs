//! A local S3-compatible server for the object-storage tests: moto's server (from PyPI's `moto[server]`, which
//! `.ci/run` installs) started on a free loopback port, one bucket created in it, stopped when dropped.
//!
//! Where moto is not installed the tests that need it are skipped with a message, unless
//! `SLUICE_REQUIRE_MOTO=1` (as CI sets), which makes its absence a failure.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running moto server with one bucket.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bucket created in it.
    pub bucket: String,
}

impl MotoServer {
    /// Starts a server and creates `bucket`; `None` (after saying why on stderr) when moto is not installed and
    /// CI does not require it.
    pub fn start(bucket: &str) -> Option<Self> {
        let required = std::env::var_os("SLUICE_REQUIRE_MOTO").is_some_and(|v| v == "1");
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port());
        let port = port.unwrap_or_else(|e| panic!("no free loopback port: {e}"));
        let probe = Command::new("python3").args(["-c", "import moto.server, boto3"]).stderr(Stdio::null()).status();
        if !probe.is_ok_and(|s| s.success()) {
            assert!(!required, "SLUICE_REQUIRE_MOTO=1 but python3 cannot import moto.server and boto3");
            eprintln!("skipped: python3 cannot import moto.server; `pip install 'moto[server]'` runs these tests");
            return None;
        }
        let mut child = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 -m moto.server: {e}"));
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("moto.server exited ({status}) before listening on port {port}");
            }
            assert!(t.elapsed() < Duration::from_secs(60), "moto.server did not listen on port {port} within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let server = Self { child, endpoint: format!("http://127.0.0.1:{port}"), bucket: bucket.to_string() };
        server.boto3(&format!("s3.create_bucket(Bucket='{bucket}')"));
        Some(server)
    }

    /// Writes `bytes` to object `key` of the bucket, with the S3 client users have (boto3, which comes with moto),
    /// not with the client under test.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let file = tempfile::NamedTempFile::new().expect("temporary file");
        std::fs::write(file.path(), bytes).expect("write");
        self.boto3(&format!("s3.upload_file({:?}, '{}', {key:?})", file.path().display().to_string(), self.bucket));
    }

    fn boto3(&self, call: &str) {
        let script = format!(
            "import boto3; s3 = boto3.client('s3', endpoint_url='{}', region_name='us-east-1', \
             aws_access_key_id='test', aws_secret_access_key='test'); {call}",
            self.endpoint
        );
        let status = Command::new("python3").args(["-c", &script]).status().expect("python3 runs");
        assert!(status.success(), "boto3 against moto failed: {call}");
    }

    /// The client settings (`object_store` keys) that reach this server.
    pub fn settings(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("aws_access_key_id", "test"),
            ("aws_secret_access_key", "test"),
            ("aws_region", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Stops the server (as a crash would: the process is killed); later requests find nothing listening.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `s3://<bucket>/<key>`.
    pub fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        self.stop();
    }
}
