//! Helper processes of a test without a binary in the product: the test binary runs itself again with only one
//! `#[ignore]`d helper test selected, and that helper does the other process's work when it finds the marker
//! variable this module sets (run on its own, by `cargo test -- --ignored`, it does nothing).
//!
//! ```ignore
//! #[test]
//! fn two_processes() {
//!     let out = sluice_testkit::helper::command("peer").output().unwrap();
//!     // ... read the lines `peer` printed
//! }
//!
//! /// The peer process of `two_processes`.
//! #[test]
//! #[ignore = "a helper process of `two_processes`, which runs it"]
//! fn peer() {
//!     if !sluice_testkit::helper::is("peer") {
//!         return;
//!     }
//!     // ... print lines, then `std::process::exit(code)`
//! }
//! ```

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

/// The variable that marks a helper process; its value is the helper's name.
const MARKER: &str = "SLUICE_TEST_HELPER";

/// The running test binary and the arguments that select the helper test `name` alone, its output not captured
/// and the harness's own lines kept apart from the helper's (`--quiet`): what to start (directly, or under a
/// launcher such as `mpirun`) with [`env`](fn@env) set.
pub fn program(name: &str) -> (PathBuf, Vec<OsString>) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test binary's path: {e}"));
    let args = ["--ignored", "--exact", name, "--nocapture", "--test-threads", "1", "--quiet"];
    (exe, args.iter().map(OsString::from).collect())
}

/// The marker variable for the helper `name`, to set on its process.
pub fn env(name: &str) -> (&'static str, String) {
    (MARKER, name.to_string())
}

/// The helper `name` started directly: [`program`] with [`env`](fn@env) set.
pub fn command(name: &str) -> Command {
    let (exe, args) = program(name);
    let (k, v) = env(name);
    let mut cmd = Command::new(exe);
    cmd.args(args).env(k, v);
    cmd
}

/// Whether this process is the helper `name` (started by [`command`] or with [`env`](fn@env) set).
pub fn is(name: &str) -> bool {
    std::env::var_os(MARKER).is_some_and(|v| v == name)
}
