//! A bounded pool of reusable buffers (batches, images, scratch vectors). Items are created lazily up to the
//! pool's capacity, handed out as [`Pooled`] guards and returned on drop, so a pipeline in steady state allocates
//! nothing. An empty pool blocks the caller, which is a second form of back-pressure; the wait is cancellable.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender, select};

use crate::error::{Error, Result};
use crate::runner::CancelToken;

type Factory<T> = Box<dyn Fn() -> T + Send + Sync>;

struct Inner<T> {
    free_tx: Sender<T>,
    free_rx: Receiver<T>,
    created: AtomicUsize,
    capacity: usize,
    factory: Factory<T>,
}

/// A pool of at most `capacity` items of `T`. Cheap to clone (shared).
pub struct Pool<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for Pool<T> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("capacity", &self.inner.capacity)
            .field("created", &self.inner.created.load(Ordering::Relaxed))
            .field("free", &self.inner.free_rx.len())
            .finish()
    }
}

impl<T: Send + 'static> Pool<T> {
    /// A pool that creates up to `capacity` items with `factory` (at least one).
    pub fn new(capacity: usize, factory: impl Fn() -> T + Send + Sync + 'static) -> Self {
        let capacity = capacity.max(1);
        let (free_tx, free_rx) = crossbeam_channel::bounded(capacity);
        Self {
            inner: Arc::new(Inner {
                free_tx,
                free_rx,
                created: AtomicUsize::new(0),
                capacity,
                factory: Box::new(factory),
            }),
        }
    }

    /// An item: a returned one if any, a new one while under capacity, else waits for a return.
    /// Fails with [`Error::Cancelled`] if `cancel` fires while waiting.
    pub fn acquire(&self, cancel: &CancelToken) -> Result<Pooled<T>> {
        if let Some(item) = self.try_acquire() {
            return Ok(item);
        }
        select! {
            recv(self.inner.free_rx) -> item => match item {
                Ok(item) => Ok(self.wrap(item)),
                Err(_) => Err(Error::Cancelled),
            },
            recv(cancel.receiver()) -> _ => Err(Error::Cancelled),
        }
    }

    /// An item if one is free or may still be created, without waiting.
    pub fn try_acquire(&self) -> Option<Pooled<T>> {
        if let Ok(item) = self.inner.free_rx.try_recv() {
            return Some(self.wrap(item));
        }
        let mut created = self.inner.created.load(Ordering::Relaxed);
        while created < self.inner.capacity {
            match self.inner.created.compare_exchange_weak(created, created + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(self.wrap((self.inner.factory)())),
                Err(now) => created = now,
            }
        }
        None
    }

    /// How many items exist (free or in use).
    pub fn created(&self) -> usize {
        self.inner.created.load(Ordering::Relaxed)
    }

    /// The most items this pool will create.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    fn wrap(&self, item: T) -> Pooled<T> {
        Pooled { item: Some(item), pool: Arc::clone(&self.inner) }
    }
}

/// An item on loan from a [`Pool`]; returns to it when dropped.
pub struct Pooled<T> {
    item: Option<T>,
    pool: Arc<Inner<T>>,
}

impl<T: std::fmt::Debug> std::fmt::Debug for Pooled<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.item.fmt(f)
    }
}

impl<T> Deref for Pooled<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // The item is only taken out in `drop`.
        self.item.as_ref().unwrap_or_else(|| unreachable!("pooled item taken before drop"))
    }
}

impl<T> DerefMut for Pooled<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.item.as_mut().unwrap_or_else(|| unreachable!("pooled item taken before drop"))
    }
}

impl<T> Drop for Pooled<T> {
    fn drop(&mut self) {
        if let Some(item) = self.item.take() {
            // The channel holds `capacity` slots and at most `capacity` items exist, so this never fails.
            let _ = self.pool.free_tx.try_send(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::CancelSource;

    #[test]
    fn reuses_items_and_respects_capacity() {
        let pool = Pool::new(2, || Vec::<u8>::with_capacity(16));
        let cancel = CancelSource::new();
        let a = pool.acquire(&cancel.token()).expect("a");
        let ptr = a.as_ptr();
        let b = pool.acquire(&cancel.token()).expect("b");
        assert!(pool.try_acquire().is_none());
        drop(a);
        let c = pool.acquire(&cancel.token()).expect("c");
        assert_eq!(c.as_ptr(), ptr);
        assert_eq!(pool.created(), 2);
        drop((b, c));
    }

    #[test]
    fn waiting_acquire_is_cancelled() {
        let pool = Pool::new(1, || 0u32);
        let cancel = CancelSource::new();
        let token = cancel.token();
        let held = pool.acquire(&token).expect("first");
        let waiter = {
            let pool = pool.clone();
            std::thread::spawn(move || pool.acquire(&token).map(|_| ()))
        };
        cancel.cancel();
        assert!(matches!(waiter.join().expect("join"), Err(Error::Cancelled)));
        drop(held);
    }
}
