//! The FIFO queue of allocations waiting for memory.
//!
//! # State
//!
//! [`AllocQueue`] holds one ticket per waiting
//! [`AllocFuture`](super::AllocFuture), in arrival order (tickets increase),
//! with the waker of its task, in an ordered map: finding the head, a
//! ticket's waker or removing a ticket costs O(log n), so ten thousand
//! waiters cost no more per poll or cancel than ten. An `epoch` counter
//! moves every time memory may have come back.
//!
//! # Who adds, who drains
//!
//! An allocation that finds the device full (or a budget exhausted) takes a
//! ticket at the tail. A newcomer never overtakes: while anyone waits, it
//! queues without trying. Only the **head** tries again, when it is woken by
//! [`memory_returned`](AllocQueue::memory_returned) (a reap drained bytes, a
//! free was queued — memory freed on a stream is reusable on that stream at
//! once — or a stream failed). When the head succeeds, it leaves and wakes
//! the next head, which tries in turn: one return of memory can serve several
//! waiters, in order.
//!
//! # Cancellation
//!
//! A dropped waiter removes its ticket. If it was the head, it passes the
//! wake-up on to the next head, so that a wake delivered to a task that was
//! cancelled before it ran is never lost (tokio's `Acquire::drop` does the
//! same for semaphore permits). A waiter holds no memory while it waits, so
//! dropping it leaks nothing.
//!
//! A lost wake-up between a failed try and taking the ticket is prevented by
//! the epoch: the waiter reads it before trying, and tries again at once if
//! it moved.
//!
//! # Failing a waiter
//!
//! Each ticket names the task that waits. When the core finds the queue in
//! hold-and-wait (see [`hold_wait`](super::hold_wait)), it marks the newest
//! waiter that holds memory with the error and wakes it
//! ([`fail`](AllocQueue::fail)); that waiter's next poll takes the error
//! and leaves. A marked ticket no longer counts as waiting.
//!
//! # Memory coming back elsewhere
//!
//! The queue is also one of the process's [waiters]: while
//! it has waiters, memory given back where it can use it (a
//! [`Budget`](crate::Budget) its stack charges, shared with another
//! resource or device; frees drained by another resource on its device)
//! wakes its head, and memory given back anywhere else does not. The first
//! waiter to take a ticket tries once more after counting itself as
//! waiting, so that memory given back between its failed try and its ticket
//! is not missed.

use std::collections::BTreeMap;
use std::task::Waker;
use std::time::{Duration, Instant};

use super::hold_wait::Owner;
use super::queue_stats::QueueStats;
use crate::adaptors::QueueOutcome;
use crate::error::ResourceError;
use crate::util::sync::{AtomicU64, Mutex, MutexGuard, Ordering, fence};
use crate::waiters;

/// One waiting allocation.
#[derive(Debug)]
struct Entry {
    waker: Waker,
    /// The task that waits (see [`hold_wait`](super::hold_wait)).
    owner: Option<Owner>,
    /// Set when the core chose this waiter to fail
    /// ([`AllocQueue::fail`]); taken by its next poll.
    failed: Option<ResourceError>,
    /// When it queued.
    since: Instant,
}

#[derive(Debug, Default)]
struct QueueState {
    next_ticket: u64,
    /// Waiting tickets in arrival order, with their tasks' wakers.
    waiting: BTreeMap<u64, Entry>,
    /// How the requests that waited left (`waiting` and `oldest_wait`
    /// are filled in when read).
    left: QueueStats,
}

/// Allocations waiting for memory, first come first served. See the
/// [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct AllocQueue {
    state: Mutex<QueueState>,
    epoch: AtomicU64,
    /// `waiting.len()`, stored under the lock after every change, so that
    /// the hot paths (every allocation asks whether anyone waits, every free
    /// whether to wake someone) read it without taking the lock.
    waiting_len: AtomicU64,
}

impl AllocQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Number of waiting allocations.
    pub(crate) fn len(&self) -> usize {
        self.waiting_len.load(Ordering::SeqCst) as usize
    }

    /// The queue now, and how the requests that waited left it.
    pub(crate) fn stats(&self) -> QueueStats {
        let st = self.lock();
        QueueStats {
            waiting: st.waiting.len(),
            oldest_wait: st.waiting.values().map(|e| e.since.elapsed()).max(),
            ..st.left
        }
    }

    /// Moves whenever memory may have come back: read before a try, and
    /// compared after it fails, so that no wake-up is lost in between.
    pub(crate) fn epoch(&self) -> u64 {
        fence(Ordering::SeqCst);
        self.epoch.load(Ordering::SeqCst)
    }

    /// Memory may have come back: wakes the head (after unlocking).
    pub(crate) fn memory_returned(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // Nobody queued: no lock. A waiter that queues after this load
        // reads the epoch after it queued and tries once more (see
        // `AllocFuture::poll`), so it sees the memory given back. The
        // fences (here and in `epoch`) order the bump before the load and
        // the waiter's count before its epoch read: one of the two sees
        // the other.
        fence(Ordering::SeqCst);
        if self.waiting_len.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_head();
    }

    /// Wakes the head without moving the epoch: it tries again, and judges
    /// hold-and-wait again when refused (a task that holds memory has just
    /// queued behind it).
    pub(crate) fn wake_head(&self) {
        let head = self
            .lock()
            .waiting
            .first_key_value()
            .map(|(_, e)| e.waker.clone());
        if let Some(w) = head {
            w.wake();
        }
    }

    /// Wakes every waiter (the resource was closed: each fails at its
    /// next poll).
    pub(crate) fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .lock()
            .waiting
            .values()
            .map(|e| e.waker.clone())
            .collect();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Queues a ticket of `owner` at the tail; returns it and whether it is
    /// the head (its position, the requests ahead of it, is
    /// `len() - 1` right after).
    pub(crate) fn enqueue(&self, waker: &Waker, owner: Option<Owner>) -> (u64, bool) {
        let (ticket, head) = {
            let mut st = self.lock();
            st.next_ticket += 1;
            let ticket = st.next_ticket;
            let entry = Entry {
                waker: waker.clone(),
                owner,
                failed: None,
                since: Instant::now(),
            };
            st.waiting.insert(ticket, entry);
            self.waiting_len
                .store(st.waiting.len() as u64, Ordering::SeqCst);
            (ticket, st.waiting.len() == 1)
        };
        if head {
            waiters::now_waiting();
        }
        (ticket, head)
    }

    /// Refreshes the ticket's waker; whether it is the head.
    pub(crate) fn refresh(&self, ticket: u64, waker: &Waker) -> bool {
        let mut st = self.lock();
        let head = st
            .waiting
            .first_key_value()
            .is_some_and(|(t, _)| *t == ticket);
        if let Some(e) = st.waiting.get_mut(&ticket)
            && !e.waker.will_wake(waker)
        {
            e.waker = waker.clone();
        }
        head
    }

    /// The error the core chose this waiter to fail with, if it did.
    pub(crate) fn take_failure(&self, ticket: u64) -> Option<ResourceError> {
        self.lock()
            .waiting
            .get_mut(&ticket)
            .and_then(|e| e.failed.take())
    }

    /// The waiting tickets not chosen to fail, oldest first, with their
    /// owners.
    pub(crate) fn owners(&self) -> Vec<(u64, Option<Owner>)> {
        self.lock()
            .waiting
            .iter()
            .filter(|(_, e)| e.failed.is_none())
            .map(|(t, e)| (*t, e.owner))
            .collect()
    }

    /// Makes `ticket`'s next poll fail with `error`, and wakes it. A ticket
    /// that left meanwhile is not there to fail: nothing happens.
    pub(crate) fn fail(&self, ticket: u64, error: ResourceError) {
        let waker = {
            let mut st = self.lock();
            st.waiting.get_mut(&ticket).map(|e| {
                e.failed = Some(error);
                e.waker.clone()
            })
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Removes the ticket, counting how it left; if it was the head, wakes
    /// the next head. Returns how long it waited (`None` for a ticket that
    /// left already).
    pub(crate) fn leave(&self, ticket: u64, outcome: QueueOutcome) -> Option<Duration> {
        let (next, emptied, waited) = {
            let mut st = self.lock();
            let was_head = st
                .waiting
                .first_key_value()
                .is_some_and(|(t, _)| *t == ticket);
            let entry = st.waiting.remove(&ticket)?;
            let waited = entry.since.elapsed();
            let left = &mut st.left;
            match outcome {
                QueueOutcome::Served => {
                    left.served += 1;
                    left.wait_total += waited;
                    left.wait_max = left.wait_max.max(waited);
                }
                QueueOutcome::Failed => left.failed += 1,
                QueueOutcome::Cancelled => left.cancelled += 1,
            }
            self.waiting_len
                .store(st.waiting.len() as u64, Ordering::SeqCst);
            let next = was_head
                .then(|| st.waiting.first_key_value().map(|(_, e)| e.waker.clone()))
                .flatten();
            (next, st.waiting.is_empty(), waited)
        };
        if emptied {
            waiters::none_waiting();
        }
        if let Some(w) = next {
            w.wake();
        }
        Some(waited)
    }
}

/// Loom model of cancellation (`scripts/model-check.sh`).
#[cfg(all(test, loom))]
mod loom_tests {
    use std::sync::Arc as StdArc;
    use std::task::Wake;

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize as LoomUsize;

    // A path from the crate root: a `super::` here would read as an import
    // of the folder above (tools/import-cycles.py sees the file).
    use std::task::Waker;

    use crate::futures::wait_queue::AllocQueue;
    use crate::util::sync::Ordering;

    struct Count(LoomUsize);

    impl Wake for Count {
        fn wake(self: StdArc<Self>) {
            self.0.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The head of the queue is cancelled while memory is released: the
    /// next waiter is woken (by the release, or by the head passing its
    /// wake-up on), so the memory is not left unclaimed.
    #[test]
    fn a_waiter_cancelled_while_memory_is_released_passes_the_wake_on() {
        loom::model(|| {
            let q = Arc::new(AllocQueue::default());
            let head = StdArc::new(Count(LoomUsize::new(0)));
            let next = StdArc::new(Count(LoomUsize::new(0)));
            let (first, was_head) = q.enqueue(&Waker::from(head.clone()), None);
            assert!(was_head);
            let (_second, _) = q.enqueue(&Waker::from(next.clone()), None);
            let release = {
                let q = q.clone();
                loom::thread::spawn(move || q.memory_returned())
            };
            q.leave(first, crate::adaptors::QueueOutcome::Cancelled);
            release.join().unwrap();
            assert!(
                next.0.load(Ordering::Acquire) >= 1,
                "the next waiter was never woken"
            );
            assert_eq!(q.len(), 1);
        });
    }

    /// Memory comes back while an allocation that just failed queues
    /// itself (the free takes no lock when it sees nobody queued): the
    /// waiter sees the epoch moved since its failed try (and tries again,
    /// as `AllocFuture::poll` does after queuing), or is woken. Never
    /// neither.
    #[test]
    fn memory_returned_while_a_waiter_queues_is_never_lost() {
        loom::model(|| {
            let q = Arc::new(AllocQueue::default());
            let woken = StdArc::new(Count(LoomUsize::new(0)));
            // The waiter read the epoch, then its try failed.
            let before = q.epoch();
            let release = {
                let q = q.clone();
                loom::thread::spawn(move || q.memory_returned())
            };
            let (_t, head) = q.enqueue(&Waker::from(woken.clone()), None);
            assert!(head);
            let moved = q.epoch() != before;
            release.join().unwrap();
            assert!(
                moved || woken.0.load(Ordering::Acquire) >= 1,
                "memory came back, and the waiter neither saw it nor was woken"
            );
        });
    }
}
