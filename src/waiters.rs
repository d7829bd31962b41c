//! Every allocation waiting for memory in the process, so that memory coming
//! back anywhere reaches the waiters it can serve.
//!
//! One [`Budget`](crate::Budget) may be shared by resources on several
//! devices, and several resources may share one device: bytes given back by
//! one of them can serve an allocation waiting in another's queue. Each
//! futures layer (its queue of waiting allocations) [registers](register)
//! here while it lives; whoever gives memory back (a budget's release, a
//! drain of executed frees) calls [`memory_returned`], which wakes the head
//! of every queue that has waiters. A budget's relief that had a cache give
//! idle blocks back from inside a poll, where nothing may reap, calls
//! [`frees_queued`]: every layer gives the frees queued below it completion
//! points, so that their notifications reap them. A head that cannot be served tries, fails and waits again: that
//! costs one failed try per queue, only while someone waits anywhere.
//!
//! While no allocation waits anywhere, [`memory_returned`] is one atomic
//! load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A futures layer and its queue of waiting allocations, as this registry
/// sees it.
pub(crate) trait Waiters: Send + Sync {
    /// Memory came back somewhere: wake the head, if any waits.
    fn memory_returned(&self);

    /// Frees were queued below the layer without it (see
    /// [`frees_queued`]): give them completion points, so that their
    /// notifications reap them. Never blocks.
    fn frees_queued(&self);
}

/// Queues that have waiters now (maintained by the queues, through
/// [`now_waiting`] and [`none_waiting`]).
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Every registered queue.
static QUEUES: Mutex<Vec<(u64, Weak<dyn Waiters>)>> = Mutex::new(Vec::new());

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

fn queues() -> std::sync::MutexGuard<'static, Vec<(u64, Weak<dyn Waiters>)>> {
    QUEUES.lock().unwrap_or_else(|p| p.into_inner())
}

/// A registered queue; dropping it unregisters.
#[derive(Debug)]
pub(crate) struct Registration(u64);

impl Drop for Registration {
    fn drop(&mut self) {
        queues().retain(|(id, _)| *id != self.0);
    }
}

/// Registers `queue` until the returned registration is dropped.
pub(crate) fn register(queue: Weak<dyn Waiters>) -> Registration {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) as u64;
    queues().push((id, queue));
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

/// Memory came back: wakes the head of every queue with waiters. Never
/// called with a lock of a queue held (it takes them).
pub(crate) fn memory_returned() {
    if WAITING.load(Ordering::SeqCst) == 0 {
        return;
    }
    let live: Vec<Arc<dyn Waiters>> = queues().iter().filter_map(|(_, q)| q.upgrade()).collect();
    for q in live {
        q.memory_returned();
    }
}

/// Frees were queued below the futures layers without them, from inside a
/// poll where nothing may reap (a budget's relief had a cache on another
/// device give its idle blocks back): every registered layer gives the
/// frees queued below it completion points, whose notifications reap them
/// and so release what they held. Never blocks; never called with a lock
/// of a queue held.
pub(crate) fn frees_queued() {
    let live: Vec<Arc<dyn Waiters>> = queues().iter().filter_map(|(_, q)| q.upgrade()).collect();
    for q in live {
        q.frees_queued();
    }
}
