//! [`CountLock`]: the lock of a few counters that every call of a hot path
//! moves (the statistics layer's), held for a dozen additions and never
//! across anything else.
//!
//! # Why not `std::sync::Mutex`
//!
//! A pair through the statistics layer takes its lock twice, once for the
//! allocation and once for the free. `std`'s mutex takes with a
//! compare-and-swap and releases with a swap (it must learn, in the same
//! instruction, whether a thread sleeps on it), and checks for poisoning
//! both times: two atomic read-modify-writes a call, four a pair, each a
//! full barrier on x86 that the processor cannot run beside the rest.
//! This lock (`spin`'s mutex) takes with one compare-and-swap and releases
//! with a plain release store: one read-modify-write a call. What that
//! saves is in BENCHMARKS.md, "What the decorators add".
//!
//! # Waiting
//!
//! Nobody sleeps on it, so the release needs no read-modify-write: a
//! thread that finds it taken yields its time slice
//! ([`std::thread::yield_now`]) until it is free. A holder does a dozen
//! additions and never blocks, calls the driver or awaits while holding
//! it, so a waiter waits for those additions (or for a holder that the
//! scheduler pre-empted to run again, which yielding lets it do). No
//! poisoning: nothing under it can leave the counters half-updated in a
//! way a later caller must know of (each addition stands alone), and a
//! panic there releases it as it unwinds.
//!
//! Under `--cfg loom` it is loom's mutex, so that a model exploring code
//! that counts explores the lock too (see [`sync`](super::sync)).

/// A lock of counters held for a few additions: one atomic read-modify-
/// write to take it, a plain store to release it. See the module's essay.
#[derive(Debug, Default)]
pub(crate) struct CountLock<T>(Inner<T>);

#[cfg(not(loom))]
type Inner<T> = spin::mutex::SpinMutex<T, spin::relax::Yield>;
#[cfg(loom)]
type Inner<T> = loom::sync::Mutex<T>;

/// Access to what a [`CountLock`] holds, until dropped.
#[cfg(not(loom))]
pub(crate) type CountGuard<'a, T> = spin::mutex::SpinMutexGuard<'a, T, spin::relax::Yield>;
/// Access to what a [`CountLock`] holds, until dropped.
#[cfg(loom)]
pub(crate) type CountGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> CountLock<T> {
    /// A lock holding `value` (the crate's counters start from `Default`).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn new(value: T) -> Self {
        CountLock(Inner::new(value))
    }

    /// Takes the lock, yielding the thread while another holds it.
    #[inline(always)]
    pub(crate) fn lock(&self) -> CountGuard<'_, T> {
        #[cfg(not(loom))]
        return self.0.lock();
        #[cfg(loom)]
        return self.0.lock().unwrap_or_else(|p| p.into_inner());
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn threads_adding_under_it_lose_no_addition() {
        let lock = std::sync::Arc::new(CountLock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*lock.lock(), 40_000);
    }
}
