//! Stage benchmarks on a real dataset, run from the binary (`sluice bench loader|decode|read`): the training and
//! validation loaders end to end ([`loader`]), image decoding from RAM ([`decode`]) and the byte readers
//! ([`read`]). Each returns a serialisable report (the binary prints it, or one JSON object with `--json`).
//!
//! These are throughput measurements on whatever machine runs them: compare figures taken in one run on a quiet
//! machine (`benches/loader_vs_ultralytics.sh` puts them next to Ultralytics' figures), never in a unit test.

pub mod decode;
pub mod loader;
pub mod read;

use std::path::PathBuf;

use serde::Serialize;

use crate::split::DataError;

/// What can go wrong in a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The dataset could not be indexed or packed, or the loader failed.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A decoder could not be built (e.g. a backend that is not compiled in) or failed.
    #[error(transparent)]
    Decode(#[from] sluice_decode::DecodeError),
    /// A reader failed.
    #[error(transparent)]
    Storage(#[from] sluice_storage::StorageError),
    /// A pipeline stage or decoder failed (the message names the sample).
    #[error(transparent)]
    Core(#[from] sluice_core::Error),
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The settings cannot be measured.
    #[error("{what}: {reason}")]
    Invalid {
        /// The setting.
        what: &'static str,
        /// Why.
        reason: String,
    },
}

/// This module's result type.
pub type Result<T> = std::result::Result<T, BenchError>;

/// The median of a set of measurements and their range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`, or `None` when there are none. NaNs sort last (`total_cmp`).
    pub fn of(values: &[f64]) -> Option<Self> {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
        };
        Some(Self { median, min: v[0], max: v[n - 1] })
    }
}

/// Reads one byte every `stride` bytes of `bytes` (and the last one) into a checksum, so a consumer really
/// touches the data it is handed.
pub(crate) fn touch(bytes: &[u8], stride: usize) -> u64 {
    let sum = bytes.iter().step_by(stride.max(1)).fold(0u64, |a, &b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    sum.wrapping_add(bytes.last().map_or(0, |&b| u64::from(b)))
}

/// `count / seconds`, guarding against a zero-length interval.
fn rate(count: f64, seconds: f64) -> f64 {
    count / seconds.max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_the_median_and_range() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(Spread::of(&[3.0]), Some(Spread { median: 3.0, min: 3.0, max: 3.0 }));
        assert_eq!(Spread::of(&[5.0, 1.0, 3.0]), Some(Spread { median: 3.0, min: 1.0, max: 5.0 }));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 10.0]), Some(Spread { median: 3.0, min: 1.0, max: 10.0 }));
    }

    #[test]
    fn touch_reads_strided_bytes_and_the_last() {
        assert_eq!(touch(&[], 64), 0);
        let a = vec![1u8; 200];
        let mut b = a.clone();
        b[64] = 2;
        assert_ne!(touch(&a, 64), touch(&b, 64));
        b[64] = 1;
        b[199] = 9;
        assert_ne!(touch(&a, 64), touch(&b, 64), "the last byte counts");
        assert_eq!(touch(&a, 0), touch(&a, 1));
    }
}
