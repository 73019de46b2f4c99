//! The CPU collective engine: MPI through the `mpi` crate.
