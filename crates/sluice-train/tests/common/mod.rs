//! Helpers shared by the integration tests of sluice-train.
#![allow(dead_code)] // Each test binary uses a part.

pub(crate) mod npz;
