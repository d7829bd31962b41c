//! Every allocation waiting for memory in the process, by what can serve
//! it, so that memory coming back reaches the waiters it can serve and no
//! others.
//!
//! # State
//!
//! One [`Budget`](crate::Budget) may be shared by resources on several
//! devices, and several resources may share one device: bytes given back by
//! one of them can serve an allocation waiting in another's queue. Each
//! futures layer (its queue of waiting allocations) [registers](register)
//! here while it lives, with its [`Scope`]s: the device memory it
//! allocates from (an ordinal in one context) and the budgets its stack
//! charges. A process-wide count says how many registered queues have
//! waiters now.
//!
//! # Who wakes whom
//!
//! Whoever gives memory back calls [`memory_returned`] with the scope the
//! memory came back to: a drain of executed frees names its device, as does
//! a futures layer whose stack unmapped pages (an awaited sleep, a
//! shutdown), and a budget's release names the budget. That wakes the head
//! of each queue registered with that scope, and only those: a queue on
//! another device, or under other budgets, could not use the memory, and
//! waking it would only cost it a refused try (and, where tests or services
//! count their tries, a wake-up they cannot explain). A budget's relief
//! that had a cache give idle blocks back from inside a poll, where nothing
//! may reap, calls [`frees_queued`] with the budget's scope: every layer
//! over a stack charging it gives the frees queued below it completion
//! points, so that their notifications reap them.
//!
//! A head that cannot be served tries, fails and waits again: one failed
//! try per queue of the scope, only while someone waits there. Memory that
//! comes back where no scope reports it (another process, another context
//! on the same device, pages a cache unmaps on its own, a decorator that
//! does not report the budget it charges) is tried for by each queue's
//! watchdog once a [`FALLBACK_PERIOD`](crate::FALLBACK_PERIOD).
//!
//! # Cancellation
//!
//! Scoping changes who is woken, never how a wake is kept: a queue passes
//! the wake of a head dropped before it ran on to the next head (the
//! essay of `futures::wait_queue`), whichever scope woke it.
//!
//! # Bounded
//!
//! While no allocation waits anywhere, [`memory_returned`] is one atomic
//! load. Otherwise it takes the registry's lock to copy out the queues of
//! the scope, and wakes them after releasing it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What memory comes back to, and what a waiting allocation can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The memory of one device as one context sees it: the device's
    /// ordinal and the backend's [`context_id`](crate::gpu::Gpu::context_id)
    /// (a simulated device's host, a CUDA context).
    Device {
        /// The device ordinal.
        ordinal: u32,
        /// The context's identity.
        context: u64,
    },
    /// The bytes of one budget: the id of its relief list, unique in the
    /// process.
    Budget(u64),
}

/// A futures layer and its queue of waiting allocations, as this registry
/// sees it.
pub(crate) trait Waiters: Send + Sync {
    /// Memory came back to one of the queue's scopes: wake the head, if
    /// any waits.
    fn memory_returned(&self);

    /// Frees were queued below the layer without it (see
    /// [`frees_queued`]): give them completion points, so that their
    /// notifications reap them. Never blocks.
    fn frees_queued(&self);
}

/// A registered queue, with the scopes whose memory it can use.
struct Registered {
    id: u64,
    scopes: Vec<Scope>,
    queue: Weak<dyn Waiters>,
}

/// Queues that have waiters now (maintained by the queues, through
/// [`now_waiting`] and [`none_waiting`]).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Every registered queue.
static QUEUES: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn queues() -> std::sync::MutexGuard<'static, Vec<Registered>> {
    QUEUES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered queue; dropping it unregisters.
#[derive(Debug)]
pub(crate) struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        queues().retain(|r| r.id != self.0);
    }
}

/// Registers `queue`, woken by memory coming back to any of `scopes`,
/// until the returned registration is dropped.
pub(crate) fn register(queue: Weak<dyn Waiters>, scopes: Vec<Scope>) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    queues().push(Registered { id, scopes, queue });
    Registration(id)
}

/// A registered queue went from no waiter to one.
pub(crate) fn now_waiting() {
    WAITING.fetch_add(1, Ordering::SeqCst);
}

/// A registered queue went from one waiter to none.
pub(crate) fn none_waiting() {
    WAITING.fetch_sub(1, Ordering::SeqCst);
}

/// The live queues registered with `scope`, copied out of the lock.
fn of_scope(scope: Scope) -> Vec<Arc<dyn Waiters>> {
    queues()
        .iter()
        .filter(|r| r.scopes.contains(&scope))
        .filter_map(|r| r.queue.upgrade())
        .collect()
}

/// Memory came back to `scope`: wakes the head of every queue of that
/// scope with waiters. Never called with a lock of a queue held (it takes
/// them).
pub(crate) fn memory_returned(scope: Scope) {
    if WAITING.load(Ordering::SeqCst) == 0 {
        return;
    }
    for q in of_scope(scope) {
        q.memory_returned();
    }
}

/// Frees were queued below the futures layers without them, from inside a
/// poll where nothing may reap (a budget's relief had a cache on another
/// device give its idle blocks back): every layer registered with `scope`
/// (the budget) gives the frees queued below it completion points, whose
/// notifications reap them and so release what they held. Never blocks;
/// never called with a lock of a queue held.
pub(crate) fn frees_queued(scope: Scope) {
    for q in of_scope(scope) {
        q.frees_queued();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Weak};

    use super::{
        Scope, Waiters, frees_queued, memory_returned, none_waiting, now_waiting, register,
    };

    /// A queue that counts what it was told.
    #[derive(Default)]
    struct Counted {
        returned: AtomicUsize,
        queued: AtomicUsize,
    }

    impl Waiters for Counted {
        fn memory_returned(&self) {
            self.returned.fetch_add(1, Ordering::SeqCst);
        }

        fn frees_queued(&self) {
            self.queued.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts this test as a queue with waiters while it lives.
    struct Waiting;

    impl Drop for Waiting {
        fn drop(&mut self) {
            none_waiting();
        }
    }

    fn counts(q: &Counted) -> (usize, usize) {
        (
            q.returned.load(Ordering::SeqCst),
            q.queued.load(Ordering::SeqCst),
        )
    }

    /// Scopes no other test of the process uses (budget ids come from a
    /// counter that starts at 1; no device has this context).
    const DEVICE: Scope = Scope::Device {
        ordinal: 7,
        context: u64::MAX - 1,
    };
    const OTHER_DEVICE: Scope = Scope::Device {
        ordinal: 7,
        context: u64::MAX - 2,
    };
    const BUDGET: Scope = Scope::Budget(u64::MAX - 1);
    const OTHER_BUDGET: Scope = Scope::Budget(u64::MAX - 2);
    /// The scope of the second test alone (the tests run in parallel).
    const DROPPED: Scope = Scope::Budget(u64::MAX - 3);

    #[test]
    fn a_return_reaches_the_queues_of_its_scope_only() {
        let on_device = Arc::new(Counted::default());
        let under_budget = Arc::new(Counted::default());
        let _a = register(
            Arc::downgrade(&on_device) as Weak<dyn Waiters>,
            vec![DEVICE],
        );
        let _b = register(
            Arc::downgrade(&under_budget) as Weak<dyn Waiters>,
            vec![OTHER_DEVICE, BUDGET],
        );
        now_waiting();
        let _waiting = Waiting;

        memory_returned(DEVICE);
        assert_eq!(
            (counts(&on_device), counts(&under_budget)),
            ((1, 0), (0, 0))
        );
        memory_returned(BUDGET);
        memory_returned(OTHER_DEVICE);
        assert_eq!(
            (counts(&on_device), counts(&under_budget)),
            ((1, 0), (2, 0))
        );
        memory_returned(OTHER_BUDGET);
        frees_queued(BUDGET);
        frees_queued(OTHER_BUDGET);
        assert_eq!(
            (counts(&on_device), counts(&under_budget)),
            ((1, 0), (2, 1))
        );
    }

    #[test]
    fn a_dropped_registration_is_told_nothing() {
        let q = Arc::new(Counted::default());
        let registration = register(Arc::downgrade(&q) as Weak<dyn Waiters>, vec![DROPPED]);
        now_waiting();
        let _waiting = Waiting;
        drop(registration);
        memory_returned(DROPPED);
        frees_queued(DROPPED);
        assert_eq!(counts(&q), (0, 0));
    }
}
