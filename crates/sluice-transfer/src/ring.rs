//! The slot ring behind the CUDA transfer, generic over what marks a slot as free again.
//!
//! A transfer writes batch `i` into slot `i mod n` (pinned host staging + device staging), starts the copy, and
//! marks the slot with a [`Fence`] that completes once the device has consumed it. When the slot comes round again
//! its fence is asked first: finished fences cost nothing; an unfinished one means the host got `n` batches ahead
//! of the device, so it waits, and the wait is counted ([`Ring::blocking_waits`], and
//! [`sluice_core::syncs::Site::TransferSlot`] by the CUDA caller). With `n >= 3` one batch can be filled while one is
//! copied and one is computed on, so in steady state nothing waits.
//!
//! The CUDA transfer's fences are CUDA events; the tests here drive the same ring with host fences, which is the
//! CPU twin of that code path.

use sluice_core::{Error, Result};

/// The smallest ring that overlaps fill, copy and compute.
pub const MIN_SLOTS: usize = 3;

/// Whether the device has finished with a slot.
pub trait Fence {
    /// `true` once the work recorded on the fence is done (never blocks).
    fn is_done(&self) -> Result<bool>;
    /// Blocks until the work recorded on the fence is done.
    fn wait(&self) -> Result<()>;
}

/// A slot's fence, if it has been used yet.
pub trait Slot {
    /// The fence of the slot's last use (`None` before its first use).
    fn fence(&self) -> Option<&dyn Fence>;
}

/// A fixed ring of reusable slots, handed out in order.
#[derive(Debug)]
pub struct Ring<S> {
    slots: Vec<S>,
    next: usize,
    blocking_waits: u64,
    acquired: u64,
}

impl<S: Slot> Ring<S> {
    /// A ring over `slots` (at least [`MIN_SLOTS`]).
    pub fn new(slots: Vec<S>) -> Result<Self> {
        if slots.len() < MIN_SLOTS {
            return Err(Error::Invalid {
                what: "transfer ring",
                reason: format!(
                    "{} slots; at least {MIN_SLOTS} are needed to overlap fill, copy and compute",
                    slots.len()
                ),
            });
        }
        Ok(Self { slots, next: 0, blocking_waits: 0, acquired: 0 })
    }

    /// The next slot, once the device has finished with its previous use; returns it with its index and whether
    /// the host had to wait for it.
    pub fn acquire(&mut self) -> Result<(usize, &mut S, bool)> {
        let i = self.next;
        self.next = (self.next + 1) % self.slots.len();
        self.acquired += 1;
        let slot = &mut self.slots[i];
        let mut waited = false;
        if let Some(f) = slot.fence()
            && !f.is_done()?
        {
            f.wait()?;
            waited = true;
            self.blocking_waits += 1;
        }
        Ok((i, slot, waited))
    }

    /// Slots in the ring.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Always `false` (a ring has at least [`MIN_SLOTS`] slots).
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Acquisitions that had to wait for the device.
    pub fn blocking_waits(&self) -> u64 {
        self.blocking_waits
    }

    /// Acquisitions so far.
    pub fn acquired(&self) -> u64 {
        self.acquired
    }

    /// The slots, for inspection.
    pub fn slots(&self) -> &[S] {
        &self.slots
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A host fence: done after `remaining` polls, or at once when waited on.
    #[derive(Debug)]
    struct HostFence {
        remaining: Cell<u32>,
        waited: Cell<u32>,
    }

    impl Fence for HostFence {
        fn is_done(&self) -> Result<bool> {
            let r = self.remaining.get();
            if r > 0 {
                self.remaining.set(r - 1);
            }
            Ok(r == 0)
        }
        fn wait(&self) -> Result<()> {
            self.remaining.set(0);
            self.waited.set(self.waited.get() + 1);
            Ok(())
        }
    }

    #[derive(Debug)]
    struct TestSlot {
        fence: Option<HostFence>,
        uses: u32,
    }

    impl Slot for TestSlot {
        fn fence(&self) -> Option<&dyn Fence> {
            self.fence.as_ref().map(|f| f as &dyn Fence)
        }
    }

    fn ring(n: usize) -> Result<Ring<TestSlot>> {
        Ring::new((0..n).map(|_| TestSlot { fence: None, uses: 0 }).collect())
    }

    /// One simulated transfer: take a slot, use it, and leave a fence that finishes after `busy` polls.
    fn step(r: &mut Ring<TestSlot>, busy: u32) -> (usize, bool) {
        let (i, s, waited) = r.acquire().expect("acquire");
        s.uses += 1;
        s.fence = Some(HostFence { remaining: Cell::new(busy), waited: Cell::new(0) });
        (i, waited)
    }

    #[test]
    fn fewer_than_three_slots_is_an_error() {
        let err = ring(2).expect_err("must fail");
        assert!(err.to_string().contains("at least 3"), "{err}");
        assert_eq!(ring(3).expect("ring").len(), 3);
    }

    #[test]
    fn slots_come_round_in_order_and_every_one_is_reused() {
        let mut r = ring(3).expect("ring");
        let order: Vec<usize> = (0..7).map(|_| step(&mut r, 0).0).collect();
        assert_eq!(order, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(r.slots().iter().map(|s| s.uses).collect::<Vec<_>>(), vec![3, 2, 2]);
        assert_eq!(r.acquired(), 7);
        assert_eq!(r.blocking_waits(), 0);
    }

    #[test]
    fn an_unfinished_slot_is_waited_for_and_counted() {
        let mut r = ring(3).expect("ring");
        // Batches 0..3 leave fences that are still busy on the first poll.
        for _ in 0..3 {
            assert!(!step(&mut r, 1).1);
        }
        // Slot 0 comes round while its fence is busy: the ring waits once and counts it.
        let (i, waited) = step(&mut r, 0);
        assert_eq!((i, waited), (0, true));
        assert_eq!(r.blocking_waits(), 1);
        // Slot 1's fence was polled by nobody yet; it is still busy for one poll, so it is waited for too.
        assert!(step(&mut r, 0).1);
        // A fence finished before the slot comes round costs nothing.
        let mut r = ring(4).expect("ring");
        for _ in 0..8 {
            assert!(!step(&mut r, 0).1);
        }
        assert_eq!(r.blocking_waits(), 0);
    }
}
