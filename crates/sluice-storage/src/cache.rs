//! `CachedReader<R>`: a RAM cache in front of any reader, shared by all threads, with a byte budget.
//!
//! Policy: keep the first samples read until the budget is spent, and never evict. Training reads every sample
//! once per epoch in a shuffled order, a pattern under which LRU eviction thrashes (a cache smaller than the
//! dataset would hit almost never); keeping a fixed subset hits `budget / dataset` of the reads from the second
//! epoch on, which is the best any policy can do there. Because entries are never evicted or moved, reads hand
//! out slices of the cache itself, without a copy and without holding a lock.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use sluice_core::{Reader, SampleId};

/// A snapshot of a cache's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheUsage {
    /// The byte budget.
    pub budget_bytes: usize,
    /// Bytes held.
    pub used_bytes: usize,
    /// Samples held.
    pub entries: usize,
    /// Reads served from the cache.
    pub hits: u64,
    /// Reads that went to the inner reader.
    pub misses: u64,
}

impl CacheUsage {
    /// Fraction of reads served from the cache (0 when nothing was read).
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 { 0.0 } else { self.hits as f64 / total as f64 }
    }
}

/// Caches the bytes of an inner reader in RAM, up to a byte budget. `Sync`: wrap it in an `Arc` and share it.
#[derive(Debug)]
pub struct CachedReader<R> {
    inner: R,
    slots: Vec<OnceLock<Box<[u8]>>>,
    budget: usize,
    used: AtomicUsize,
    entries: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl<R: Reader> CachedReader<R> {
    /// Caches `inner` with a budget of `budget_bytes` bytes of sample data.
    pub fn new(inner: R, budget_bytes: usize) -> Self {
        let slots = (0..inner.len()).map(|_| OnceLock::new()).collect();
        Self {
            inner,
            slots,
            budget: budget_bytes,
            used: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// What the cache holds and how it has served.
    pub fn usage(&self) -> CacheUsage {
        CacheUsage {
            budget_bytes: self.budget,
            used_bytes: self.used.load(Ordering::Relaxed),
            entries: self.entries.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }

    /// The wrapped reader.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Takes `n` bytes of the budget if they are left.
    fn reserve(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(n).filter(|&t| t <= self.budget))
            .is_ok()
    }
}

impl<R: Reader> Reader for CachedReader<R> {
    fn read<'a>(&'a self, id: SampleId, scratch: &'a mut Vec<u8>) -> sluice_core::Result<&'a [u8]> {
        let Some(slot) = usize::try_from(id).ok().and_then(|i| self.slots.get(i)) else {
            return self.inner.read(id, scratch); // The inner reader names the out-of-range id.
        };
        if let Some(bytes) = slot.get() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(bytes);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let bytes = self.inner.read(id, scratch)?;
        if !self.reserve(bytes.len()) {
            return Ok(bytes);
        }
        let mut stored = false;
        let cached = slot.get_or_init(|| {
            stored = true;
            bytes.into()
        });
        if stored {
            self.entries.fetch_add(1, Ordering::Relaxed);
        } else {
            // Another thread cached this sample first: give the reservation back.
            self.used.fetch_sub(bytes.len(), Ordering::AcqRel);
        }
        Ok(cached)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Serves `len` samples of `size` bytes each (sample `i` filled with `i`), counting reads.
    struct Counting {
        len: usize,
        size: usize,
        reads: AtomicU64,
    }

    impl Reader for Counting {
        fn read<'a>(&'a self, id: SampleId, scratch: &'a mut Vec<u8>) -> sluice_core::Result<&'a [u8]> {
            if id as usize >= self.len {
                return Err(sluice_core::Error::Invalid { what: "id", reason: format!("{id} out of range") });
            }
            self.reads.fetch_add(1, Ordering::Relaxed);
            scratch.clear();
            scratch.resize(self.size, id as u8);
            Ok(scratch)
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn keeps_samples_until_the_budget_is_spent() {
        let cache = CachedReader::new(Counting { len: 10, size: 100, reads: AtomicU64::new(0) }, 350);
        let mut scratch = Vec::new();
        for _epoch in 0..3 {
            for id in 0..10 {
                let bytes = cache.read(id, &mut scratch).expect("read");
                assert_eq!(bytes.len(), 100);
                assert!(bytes.iter().all(|&b| b == id as u8));
            }
        }
        let u = cache.usage();
        assert_eq!((u.entries, u.used_bytes, u.budget_bytes), (3, 300, 350));
        assert_eq!((u.hits, u.misses), (6, 24));
        assert_eq!(cache.inner().reads.load(Ordering::Relaxed), 24);
        assert!((u.hit_rate() - 0.2).abs() < 1e-12);
        assert!(cache.read(99, &mut scratch).is_err());
    }

    #[test]
    fn shared_by_threads_without_double_charging() {
        let cache = Arc::new(CachedReader::new(Counting { len: 64, size: 1000, reads: AtomicU64::new(0) }, 1 << 20));
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let cache = Arc::clone(&cache);
                std::thread::spawn(move || {
                    let mut scratch = Vec::new();
                    for i in 0..64u64 {
                        let id = (i * 7 + t) % 64;
                        assert!(cache.read(id, &mut scratch).expect("read").iter().all(|&b| b == id as u8));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("thread");
        }
        let u = cache.usage();
        assert_eq!((u.entries, u.used_bytes), (64, 64_000));
        assert_eq!(u.hits + u.misses, 256);
    }
}
