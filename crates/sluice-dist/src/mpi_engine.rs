//! The CPU collective engine: MPI through the `mpi` crate (Open MPI from Debian's packages in CI), one process per
//! rank under `mpirun`. MPI's sum all-reduce gives every rank the same bits (its algorithms reduce each element in
//! one order and send the result), which keeps the replicas' weights bit-equal step after step.
//!
//! MPI's default error handler aborts the whole job on a failed operation, with MPI's own message naming the
//! process; the checks here name the rank for what MPI would not catch (ranks that disagree on a length).

use std::sync::{Mutex, MutexGuard};

use mpi::Threading;
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};

use crate::collective::Collective;
use crate::error::{DistError, Result};

/// MPI's `MPI_COMM_WORLD`, owning the MPI environment (finalized on drop).
pub struct Mpi {
    inner: Mutex<Inner>,
    rank: usize,
    size: usize,
}

struct Inner {
    world: SimpleCommunicator,
    /// The receive side of the all-reduce, kept between calls (no allocation per step).
    scratch: Vec<f32>,
    // Dropped last: finalizes MPI.
    _universe: Universe,
}

// SAFETY: MPI is initialized with `MPI_THREAD_SERIALIZED` (checked in `Mpi::init`), which allows calls from any
// thread as long as no two overlap; every call goes through the `Mutex` around `Inner`, so they never overlap.
unsafe impl Send for Inner {}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mpi").field("rank", &self.rank).field("world", &self.size).finish()
    }
}

impl Mpi {
    /// Initializes MPI (once per process, at the level that lets any one thread at a time call it) and takes its
    /// world communicator.
    pub fn init() -> Result<Self> {
        let engine = |reason: String| DistError::Engine { engine: "mpi", rank: 0, reason };
        let (universe, level) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| engine("MPI is already initialized in this process".into()))?;
        let world = universe.world();
        let (rank, size) = (usize::try_from(world.rank()).unwrap_or(0), usize::try_from(world.size()).unwrap_or(1));
        if level < Threading::Serialized {
            return Err(DistError::Engine {
                engine: "mpi",
                rank,
                reason: format!("the MPI library offers thread level {level:?}; Sluice needs Serialized"),
            });
        }
        Ok(Self { inner: Mutex::new(Inner { world, scratch: Vec::new(), _universe: universe }), rank, size })
    }

    /// This process's host name, as MPI knows it (where rank 0's rendezvous listens).
    pub fn processor_name(&self) -> Result<String> {
        let _serialized = self.lock();
        mpi::environment::processor_name().map_err(|e| DistError::Engine {
            engine: "mpi",
            rank: self.rank,
            reason: format!("processor name: {e}"),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked while calling MPI; the handle itself is still valid.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_len(&self, n: usize) -> Result<i32> {
        i32::try_from(n).map_err(|_| DistError::Mismatch {
            rank: self.rank,
            reason: format!("a buffer of {n} elements is past MPI's count limit"),
        })
    }
}

impl Collective for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()> {
        self.check_len(buf.len())?;
        let mut inner = self.lock();
        let Inner { world, scratch, .. } = &mut *inner;
        scratch.clear();
        scratch.resize(buf.len(), 0.0);
        world.all_reduce_into(&*buf, &mut scratch[..], SystemOperation::sum());
        buf.copy_from_slice(scratch);
        Ok(())
    }

    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()> {
        self.check_len(buf.len())?;
        let root = self.root(root)?;
        self.lock().world.process_at_rank(root).broadcast_into(buf);
        Ok(())
    }

    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()> {
        let root = self.root(root)?;
        let inner = self.lock();
        let root = inner.world.process_at_rank(root);
        let mut len = buf.len() as u64;
        root.broadcast_into(&mut len);
        let n = usize::try_from(len).map_err(|_| DistError::Mismatch { rank: self.rank, reason: "length".into() })?;
        self.check_len(n)?;
        buf.resize(n, 0);
        root.broadcast_into(&mut buf[..]);
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.check_len(mine.len())?;
        let inner = self.lock();
        let mut lens = vec![0i32; self.size];
        inner.world.all_gather_into(&(mine.len() as i32), &mut lens[..]);
        let total: usize = lens.iter().map(|&n| n.max(0) as usize).sum();
        self.check_len(total)?;
        let displs: Vec<i32> = lens
            .iter()
            .scan(0i32, |acc, &n| {
                let d = *acc;
                *acc += n;
                Some(d)
            })
            .collect();
        let mut all = vec![0u8; total];
        {
            let mut part = PartitionMut::new(&mut all[..], &lens[..], &displs[..]);
            inner.world.all_gather_varcount_into(mine, &mut part);
        }
        Ok(lens.iter().zip(&displs).map(|(&n, &d)| all[d as usize..(d + n) as usize].to_vec()).collect())
    }

    fn barrier(&self) -> Result<()> {
        self.lock().world.barrier();
        Ok(())
    }
}

impl Mpi {
    fn root(&self, root: usize) -> Result<i32> {
        if root >= self.size {
            return Err(DistError::Mismatch {
                rank: self.rank,
                reason: format!("root {root} is not in 0..{}", self.size),
            });
        }
        self.check_len(root)
    }
}
