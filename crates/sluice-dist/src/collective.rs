//! The collectives a data-parallel run needs, on host buffers: sum all-reduce (gradients), broadcast (weights and
//! buffers from rank 0), all-gather of bytes (validation metric state) and a barrier. [`Solo`] is the one-rank
//! engine (every operation is the identity); `Mpi` (feature `mpi`) and `Nccl` (feature `nccl`) are the real ones.

use crate::error::Result;

/// A communicator of `world()` ranks. Every rank calls the same operations in the same order with buffers of the
/// same length; the engines check what they cheaply can and name the rank that disagrees. `Send + Sync`: the
/// trainer's optimizer step runs on a worker of its compute pool, so the engine is called from there; engines
/// serialize their own calls.
pub trait Collective: Send + Sync {
    /// The engine's name (`solo`, `mpi`, `nccl`).
    fn name(&self) -> &'static str;

    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world(&self) -> usize;

    /// Replaces `buf` on every rank with the element-wise sum over ranks. Every rank gets bit-identical values.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<()>;

    /// Replaces `buf` on every rank with `root`'s.
    fn broadcast(&self, buf: &mut [f32], root: usize) -> Result<()>;

    /// Replaces `buf` on every rank with `root`'s bytes (the length travels too).
    fn broadcast_bytes(&self, buf: &mut Vec<u8>, root: usize) -> Result<()>;

    /// Every rank's `mine`, in rank order, on every rank.
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Returns once every rank has called it.
    fn barrier(&self) -> Result<()>;

    /// Whether this is rank 0, the one that writes logs, plots and checkpoints.
    fn is_main(&self) -> bool {
        self.rank() == 0
    }
}

/// The engine of a run with one rank.
#[derive(Debug, Default, Clone, Copy)]
pub struct Solo;

impl Collective for Solo {
    fn name(&self) -> &'static str {
        "solo"
    }

    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }

    fn broadcast(&self, _buf: &mut [f32], _root: usize) -> Result<()> {
        Ok(())
    }

    fn broadcast_bytes(&self, _buf: &mut Vec<u8>, _root: usize) -> Result<()> {
        Ok(())
    }

    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// The contiguous share of `n` items that `rank` of `world` takes: the first `n % world` ranks take one more, and
/// the shares in rank order are `0..n` in order (so results gathered in rank order are in the original order).
pub fn contiguous_share(n: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    let world = world.max(1);
    let (base, extra) = (n / world, n % world);
    let start = rank * base + rank.min(extra);
    let len = base + usize::from(rank < extra);
    start.min(n)..(start + len).min(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once_in_order() {
        for n in [0, 1, 5, 128, 131] {
            for world in 1..=7 {
                let all: Vec<usize> = (0..world).flat_map(|r| contiguous_share(n, r, world)).collect();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "n {n} world {world}");
                let lens: Vec<usize> = (0..world).map(|r| contiguous_share(n, r, world).len()).collect();
                assert!(lens.iter().max().unwrap_or(&0) - lens.iter().min().unwrap_or(&0) <= 1);
            }
        }
    }

    #[test]
    fn solo_is_the_identity() {
        let mut v = vec![1.0, 2.0];
        Solo.all_reduce_sum(&mut v).unwrap();
        Solo.broadcast(&mut v, 0).unwrap();
        assert_eq!(v, [1.0, 2.0]);
        assert_eq!(Solo.all_gather_bytes(b"ab").unwrap(), vec![b"ab".to_vec()]);
        assert!(Solo.is_main());
    }
}
