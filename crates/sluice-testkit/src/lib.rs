//! Development helpers shared by tests, benches and `xtask`, never by the product: [`locations`] finds the data
//! that lives outside the repository (the shared datasets, reference fixtures and peers' scripts); [`s3`] starts a
//! local S3-compatible server for the object-storage tests; [`helper`] starts a test's other processes from the
//! test binary itself. It bakes the
//! checkout's path in at build time and reads the environment, which is why it lives here and not in a library
//! crate the `sluice` binary ships.
#![warn(missing_docs)]

pub mod helper;
pub mod locations;
pub mod s3;
