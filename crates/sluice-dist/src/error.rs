//! The error type of the distributed plumbing: every variant names the rank, address, variable or engine at fault.

/// Result alias of this crate.
pub type Result<T, E = DistError> = std::result::Result<T, E>;

/// What went wrong between ranks.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// A launcher's environment variable is missing or malformed.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The rendezvous did not complete: a rank that did not answer, or a handshake that did not match.
    #[error("rendezvous at {addr}: rank {rank}: {reason}")]
    Rendezvous {
        /// The rank at fault: one that did not connect or answer (rank 0, for a rank that could not reach it), or
        /// whose handshake did not match.
        rank: usize,
        /// The address of the rendezvous (rank 0's listener).
        addr: String,
        /// What happened.
        reason: String,
    },
    /// A rank stopped answering during the run (its heartbeat timed out or its connection closed).
    #[error("rank {rank} ({peer}) is lost: {reason}")]
    PeerLost {
        /// The rank that was lost.
        rank: usize,
        /// Its host and process, as it announced them at the rendezvous.
        peer: String,
        /// What happened.
        reason: String,
    },
    /// A collective failed in its engine.
    #[error("{engine} on rank {rank}: {reason}")]
    Engine {
        /// The engine (`mpi`, `nccl`).
        engine: &'static str,
        /// The rank that saw the failure.
        rank: usize,
        /// The engine's message.
        reason: String,
    },
    /// The ranks disagree on something that must be equal (buffer lengths, the world size).
    #[error("rank {rank}: {reason}")]
    Mismatch {
        /// The rank that noticed it.
        rank: usize,
        /// What differs.
        reason: String,
    },
    /// A worker process of the local launcher failed.
    #[error("rank {rank}: {reason}")]
    Worker {
        /// The rank whose process failed.
        rank: usize,
        /// How it failed.
        reason: String,
    },
    /// An engine that this build does not include.
    #[error("{what} needs Sluice built with the `{feature}` feature ({hint})")]
    NotBuilt {
        /// What was asked for.
        what: String,
        /// The cargo feature.
        feature: &'static str,
        /// How to get it.
        hint: &'static str,
    },
    /// A setting that cannot work (a rank outside the world, a heartbeat slower than its timeout, no workers).
    #[error("{what}: {reason}")]
    Invalid {
        /// What the setting belongs to.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An I/O error with what was being done.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        source: std::io::Error,
    },
}
