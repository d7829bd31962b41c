//! [`WaitPolicy`]: how an [`EventFuture`](super::EventFuture) waits before
//! it parks on a notification.

use std::time::Duration;

use crate::util::sync::{AtomicBool, AtomicU64, Ordering};

/// How an [`EventFuture`](super::EventFuture) waits before relying on a
/// host-function notification.
///
/// A completed event answers a query in a fraction of a microsecond, while a
/// wake-up by host function costs tens of microseconds (`docs/DESIGN.md`,
/// "What the hardware costs"). So a short operation is
/// best caught by querying: first by busy-querying for `spin` on the first
/// poll, then by yielding to the executor and querying on each poll until
/// `yield_for` after the first poll (other tasks run meanwhile). Only then
/// does the future queue a notification and park. A future queued behind an
/// earlier, still pending point of its stream cannot be done either (stream
/// order), so it never queries while it is behind; [`behind`](Self::behind)
/// says whether it parks at once or yields until the earlier point settles.
///
/// Both phases are bounded, and nothing spins while no future is being
/// polled. Within them the event is queried at most once per
/// `query_every`: every query takes the driver's locks, and a tight loop of
/// them slows the threads that are submitting work (the 8 MiB memset
/// stream in BENCHMARKS.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy-querying on the first poll.
    pub spin: Duration,
    /// Yield-and-query until this long after the first poll.
    pub yield_for: Duration,
    /// Least time between two queries of the event while spinning or
    /// yielding.
    pub query_every: Duration,
    /// What a future does while an earlier point of its stream is pending.
    pub behind: WhenBehind,
}

/// What an [`EventFuture`](super::EventFuture) does while an earlier point of
/// its stream is still pending (it cannot be reached first, so querying its
/// own event would be wasted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenBehind {
    /// Park at once and ask for a host-function notification: least CPU,
    /// but every such future can cost a notification, and queuing host
    /// functions slows threads that submit to the same context. A parked
    /// future of this policy is notified when the stream reaches its end
    /// as of the notification's launch: one notification covers every
    /// point made so far (fewest host functions), and each parked future
    /// waits until the stream ran all of it.
    Park,
    /// Yield to the executor without querying until the earlier point
    /// settles (usually by its own future's query, which settles every
    /// point up to it), then query as a first poll would; park only when
    /// [`yield_for`](WaitPolicy::yield_for) since the first poll has passed.
    ///
    /// A parked future of this policy is notified at its own point: the
    /// notification waits on its event, so the oldest parked future wakes
    /// as soon as the stream reaches it, while the stream still runs what
    /// was queued after it (clients sharing a stream send their next
    /// request before it runs dry), and the landing queues the next one for
    /// the points parked after it. When that point turns out reached
    /// already (the notifications lag behind many short waits), one
    /// notification covers the stream's end instead.
    Yield,
}

impl WaitPolicy {
    /// 4 µs of spinning, then yielding up to 20 µs, querying every 0.5 µs,
    /// and yielding behind a pending point: covers a tiny operation on an
    /// idle stream, and a stream of operations awaited one task each,
    /// without host functions.
    ///
    /// Yielding behind rather than parking: parked futures queue host
    /// functions, which a future behind a pending point does not need (the
    /// point ahead settles it), so with a spawned task awaiting each
    /// operation [`WhenBehind::Park`] runs slower than [`WhenBehind::Yield`]
    /// (BENCHMARKS.md, "Figures the code's comments cite").
    pub const DEFAULT: WaitPolicy = WaitPolicy {
        spin: Duration::from_micros(4),
        yield_for: Duration::from_micros(20),
        query_every: Duration::from_nanos(500),
        behind: WhenBehind::Yield,
    };

    /// Park on a notification right after one query: least CPU, most
    /// latency (and deterministic wake-ups for tests).
    pub const PARK_AT_ONCE: WaitPolicy = WaitPolicy {
        spin: Duration::ZERO,
        yield_for: Duration::ZERO,
        query_every: Duration::ZERO,
        behind: WhenBehind::Park,
    };
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::DEFAULT
    }
}

/// A policy that can be changed while futures are made from it.
#[derive(Debug)]
pub(crate) struct SharedPolicy {
    spin_ns: AtomicU64,
    yield_ns: AtomicU64,
    every_ns: AtomicU64,
    behind_yields: AtomicBool,
}

impl Default for SharedPolicy {
    fn default() -> Self {
        let p = SharedPolicy {
            spin_ns: AtomicU64::new(0),
            yield_ns: AtomicU64::new(0),
            every_ns: AtomicU64::new(0),
            behind_yields: AtomicBool::new(true),
        };
        p.set(WaitPolicy::DEFAULT);
        p
    }
}

impl SharedPolicy {
    pub(crate) fn set(&self, policy: WaitPolicy) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.spin_ns.store(ns(policy.spin), Ordering::Relaxed);
        self.yield_ns.store(ns(policy.yield_for), Ordering::Relaxed);
        self.every_ns
            .store(ns(policy.query_every), Ordering::Relaxed);
        self.behind_yields
            .store(policy.behind == WhenBehind::Yield, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> WaitPolicy {
        WaitPolicy {
            spin: Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed)),
            yield_for: Duration::from_nanos(self.yield_ns.load(Ordering::Relaxed)),
            query_every: Duration::from_nanos(self.every_ns.load(Ordering::Relaxed)),
            behind: if self.behind_yields.load(Ordering::Relaxed) {
                WhenBehind::Yield
            } else {
                WhenBehind::Park
            },
        }
    }
}
