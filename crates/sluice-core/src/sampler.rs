//! The deterministic sampler. An epoch's order is a pure function of `(seed, epoch)`; shards follow PyTorch's
//! `DistributedSampler` exactly (wrap-around padding, or truncation with `drop_last`); and the randomness of sample
//! `index` of epoch `epoch` comes from its own counter-based stream, so results never depend on how many workers
//! run or in which order they finish.
//!
//! Streams are ChaCha8 (`rand_chacha`): the key comes from the seed, the 64-bit stream id from the epoch (even ids
//! for samples, odd ids for the epoch: block 0 for the shuffle, block `1 + k` for batch `k`'s decisions, such as
//! its multi-scale size), and each sample index owns a disjoint block of 2^36 words of its stream. Counter-based
//! means any sample's generator is reached in O(1), without drawing the ones before it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// The generator type of every per-sample stream.
pub type RngStream = ChaCha8Rng;

/// Words of the ChaCha stream reserved for each sample (2^36 words = 256 GiB of randomness).
const WORDS_PER_SAMPLE_LOG2: u32 = 36;

fn stream(seed: u64, stream_id: u64, index: u64) -> RngStream {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream_id);
    rng.set_word_pos(u128::from(index) << WORDS_PER_SAMPLE_LOG2);
    rng
}

/// The random stream of sample position `index` in epoch `epoch` of a run seeded with `seed`.
/// `index` must be below 2^32 (so streams never overlap).
pub fn sample_rng(seed: u64, epoch: u64, index: u64) -> RngStream {
    debug_assert!(index < 1 << 32, "sample index {index} too large for a disjoint stream");
    stream(seed, epoch.wrapping_mul(2), index)
}

/// The random stream of batch `batch` in epoch `epoch` of a run seeded with `seed`: for decisions that hold for a
/// whole batch (its multi-scale size). Disjoint from the epoch's shuffle and from every sample stream; it does not
/// depend on the rank, so every rank's batch `k` draws the same. `batch` must be below 2^32 - 1.
pub fn batch_rng(seed: u64, epoch: u64, batch: u64) -> RngStream {
    debug_assert!(batch < (1 << 32) - 1, "batch index {batch} too large for a disjoint stream");
    stream(seed, epoch.wrapping_mul(2).wrapping_add(1), batch + 1)
}

/// Epoch orders and rank shards over a dataset of `len` samples, with PyTorch `DistributedSampler` semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistributedSampler {
    len: usize,
    seed: u64,
    shuffle: bool,
    rank: usize,
    world_size: usize,
    drop_last: bool,
}

impl DistributedSampler {
    /// A single-process sampler that shuffles every epoch.
    pub fn new(len: usize, seed: u64) -> Self {
        Self { len, seed, shuffle: true, rank: 0, world_size: 1, drop_last: false }
    }

    /// Shards the epoch for process `rank` of `world_size`; fails when `rank >= world_size`.
    pub fn shard(mut self, rank: usize, world_size: usize) -> Result<Self> {
        if world_size == 0 || rank >= world_size {
            return Err(Error::Invalid {
                what: "sampler shard",
                reason: format!("rank {rank} is not in 0..world_size ({world_size})"),
            });
        }
        self.rank = rank;
        self.world_size = world_size;
        Ok(self)
    }

    /// Whether the order is shuffled (default `true`); unshuffled epochs are `0..len`.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle;
        self
    }

    /// With `drop_last`, the tail that does not divide evenly across ranks is dropped instead of padded.
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Samples this rank gets per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last && !self.len.is_multiple_of(self.world_size) {
            (self.len - self.world_size).div_ceil(self.world_size)
        } else {
            self.len.div_ceil(self.world_size)
        }
    }

    /// Samples all ranks get per epoch, together.
    pub fn total_size(&self) -> usize {
        self.num_samples() * self.world_size
    }

    /// Writes this rank's sample indices for `epoch` into `out` (cleared first; its allocation is reused).
    pub fn epoch_into(&self, epoch: u64, out: &mut Vec<usize>) {
        out.clear();
        if self.len == 0 {
            return;
        }
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = stream(self.seed, epoch.wrapping_mul(2).wrapping_add(1), 0);
            for i in (1..order.len()).rev() {
                let j = rng.random_range(0..=i as u64) as usize;
                order.swap(i, j);
            }
        }
        let total = self.total_size();
        // Pad by wrapping around the order (repeating it as often as needed), or truncate.
        out.extend((self.rank..total).step_by(self.world_size).map(|k| order[k % self.len]));
    }

    /// This rank's sample indices for `epoch`.
    pub fn epoch(&self, epoch: u64) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.num_samples());
        self.epoch_into(epoch, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngCore;

    fn ranks(s: DistributedSampler, world: usize, epoch: u64) -> Vec<Vec<usize>> {
        (0..world).map(|r| s.shard(r, world).expect("rank").epoch(epoch)).collect()
    }

    #[test]
    fn epoch_is_a_permutation_and_a_pure_function_of_seed_and_epoch() {
        let s = DistributedSampler::new(1000, 7);
        let e3 = s.epoch(3);
        let mut sorted = e3.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..1000).collect::<Vec<_>>());
        assert_eq!(e3, DistributedSampler::new(1000, 7).epoch(3));
        assert_ne!(e3, s.epoch(4));
        assert_ne!(e3, DistributedSampler::new(1000, 8).epoch(3));
    }

    // Expected shards written out from PyTorch's DistributedSampler (shuffle=False) semantics.
    #[test]
    fn shards_pad_by_wrapping_like_pytorch() {
        let s = DistributedSampler::new(10, 0).shuffle(false);
        assert_eq!(ranks(s, 3, 0), vec![vec![0, 3, 6, 9], vec![1, 4, 7, 0], vec![2, 5, 8, 1]]);
        // More padding than samples: the order repeats as often as needed.
        let s = DistributedSampler::new(2, 0).shuffle(false);
        assert_eq!(ranks(s, 5, 0), vec![vec![0], vec![1], vec![0], vec![1], vec![0]]);
    }

    #[test]
    fn shards_drop_the_tail_with_drop_last() {
        let s = DistributedSampler::new(10, 0).shuffle(false).drop_last(true);
        assert_eq!(s.shard(0, 3).expect("rank").num_samples(), 3);
        assert_eq!(ranks(s, 3, 0), vec![vec![0, 3, 6], vec![1, 4, 7], vec![2, 5, 8]]);
        // An even split drops nothing.
        let s = DistributedSampler::new(9, 0).shuffle(false).drop_last(true);
        assert_eq!(ranks(s, 3, 0).concat().len(), 9);
    }

    #[test]
    fn shuffled_shards_together_cover_the_epoch() {
        let s = DistributedSampler::new(103, 42);
        let full = s.epoch(5);
        let shards = ranks(s, 4, 5);
        assert!(shards.iter().all(|r| r.len() == 26));
        // Interleaving the shards gives the full order followed by wrap-around padding.
        let interleaved: Vec<usize> = (0..26).flat_map(|i| shards.iter().map(move |r| r[i])).collect();
        assert_eq!(&interleaved[..103], &full[..]);
        assert_eq!(&interleaved[103..], &full[..1]);
    }

    #[test]
    fn invalid_rank_is_an_error() {
        assert!(DistributedSampler::new(10, 0).shard(3, 3).is_err());
        assert!(DistributedSampler::new(10, 0).shard(0, 0).is_err());
    }

    #[test]
    fn sample_streams_are_independent_of_access_order() {
        let a: Vec<u64> = (0..50).map(|i| sample_rng(1, 2, i).next_u64()).collect();
        let b: Vec<u64> = (0..50).rev().map(|i| sample_rng(1, 2, i).next_u64()).rev().collect();
        assert_eq!(a, b);
        let mut unique = a.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 50);
        assert_ne!(sample_rng(1, 2, 0).next_u64(), sample_rng(1, 3, 0).next_u64());
        assert_ne!(sample_rng(1, 2, 0).next_u64(), sample_rng(2, 2, 0).next_u64());
    }

    #[test]
    fn batch_streams_are_disjoint_from_sample_and_shuffle_streams() {
        let batches: Vec<u64> = (0..20).map(|k| batch_rng(1, 2, k).next_u64()).collect();
        let mut all = batches.clone();
        all.extend((0..20).map(|i| sample_rng(1, 2, i).next_u64()));
        all.push(stream(1, 2 * 2 + 1, 0).next_u64());
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 41);
        assert_eq!(batches[3], batch_rng(1, 2, 3).next_u64());
        assert_ne!(batch_rng(1, 2, 3).next_u64(), batch_rng(1, 3, 3).next_u64());
    }
}
