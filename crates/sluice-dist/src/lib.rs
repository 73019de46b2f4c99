//! Data-parallel plumbing for Sluice's trainer: which rank a process is ([`launch`]), the collectives the training
//! step and validation need ([`collective`]: [`Solo`] for one rank, MPI on the CPU with feature `mpi`, NCCL on GPUs
//! with feature `nccl`), the TCP rendezvous with its heartbeat that ends every rank when one is lost
//! ([`rendezvous`]), and the local launcher that starts one worker process per device ([`spawn`]).

pub mod collective;
pub mod error;
pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi_engine;
pub mod mpirun;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod rendezvous;
pub mod signals;
pub mod spawn;

pub use collective::{Collective, Solo, contiguous_share};
pub use error::{DistError, Result};
pub use launch::{DEFAULT_PORT, Launch, Launcher};
#[cfg(feature = "mpi")]
pub use mpi_engine::Mpi;
#[cfg(feature = "nccl")]
pub use nccl::Nccl;
pub use rendezvous::{Progress, Rendezvous, RendezvousConfig};
pub use spawn::{LocalLaunch, free_port, run_local};
