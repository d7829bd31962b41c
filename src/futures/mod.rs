//! The futures layer: await the GPU without blocking a thread.
//!
//! [`AsyncResource`] wraps any [`DeviceMemoryResource`](crate::DeviceMemoryResource)
//! so that async code can
//!
//! - **allocate and wait** for memory when the device or a budget is full
//!   ([`AsyncResource::allocate`] → [`AllocFuture`], first come first served);
//! - **reserve a request's memory as one unit**
//!   ([`AsyncResource::reserve`] → [`ReserveFuture`] → [`MemoryReservation`],
//!   in the same queue, all or nothing), and take buffers from it without
//!   waiting; a queue where every byte is held by tasks that wait for more
//!   fails its newest holder instead of waiting forever
//!   ([`AsyncResource::set_hold_and_wait_check`]);
//! - **await completion** of work it queued on a stream
//!   ([`AsyncResource::finish_block_use`], [`AsyncResource::completion`] →
//!   [`EventFuture`]);
//! - **free** and optionally await the memory's return to the accounting
//!   ([`AsyncResource::deallocate`] → [`DeallocHandle`],
//!   [`AsyncResource::reap_pending`] → [`ReapFuture`]);
//!
//! with a [`Reaper`] task that applies completed frees in the background.
//!
//! # How a completion reaches a task
//!
//! ```text
//!  user stream S:   ... work ... [record E_point] ... [record E_notify] ...
//!                                                         │ wait
//!  notifier lane L:                                       └─► [host fn: "S reached n"]
//! ```
//!
//! 1. **Sequence numbers.** Every awaited point and every free on stream S
//!    takes the next sequence number of S's notifier, after its
//!    work was queued. An `EventFuture` also records a pooled event at its
//!    point, unless it is lazy ([`AsyncResource::completion_lazy`]): that
//!    one asks S itself (`cuStreamQuery`) on its first poll and spin, and
//!    records its event only when S is still busy after them. An idle S
//!    settles every point marked before the query, with no event at all;
//!    the price is that the late event also covers whatever was queued on
//!    S between the point and the record.
//! 2. **Query first.** Polling an `EventFuture` queries its event (a
//!    fraction of a microsecond) and keeps querying for a bounded few
//!    microseconds ([`WaitPolicy`]: spinning on the first poll, then
//!    yielding to the executor): a host-function wake-up costs tens of
//!    microseconds (`docs/DESIGN.md`, "What the hardware costs"), so short
//!    work is caught here. Only then does it park. A point behind
//!    an earlier pending point of its stream does not query (it cannot be
//!    reached first): by default it yields until that point settles, or
//!    parks at once ([`WhenBehind`]). A done query
//!    settles every earlier point of the stream too (stream order), and one
//!    more query of the stream's newest point with an event may settle all
//!    of them: awaiting many finished points costs two queries, not one
//!    each.
//! 3. **One notification in flight per stream, off the user's stream.** A
//!    parked point (or a free) makes the notifier take an event at the end
//!    of S (the newest point's own, or one it records), make its own lane L
//!    wait on it, and queue a host function on L
//!    that says "S reached n", n being the last sequence number handed out.
//!    S never runs the host function, so it is not stalled (a host function
//!    after every 8 MiB memset costs 7× on the user's stream); each S has its
//!    own L, so a slow stream does not hold back a fast one's notifications.
//!    While one is in flight, new points wait for the next one. A future
//!    that yields behind earlier points ([`WhenBehind::Yield`], the default) is
//!    notified at its own point instead: L waits on its event and n is its
//!    sequence number, so the oldest parked future wakes when S reaches it,
//!    not when S has run everything queued after it (tasks sharing a
//!    stream then send their next work before it runs dry); if that point
//!    is reached already, the notification covers S's end as above.
//! 4. **One cut.** The host function locks S's points, settles every point
//!    ≤ n, unlocks, and only then wakes the parked ones. It
//!    makes no driver call and owns no GPU state. If more is pending, it
//!    kicks the dispatcher.
//! 5. **Dispatch** ([`Reaper`], or the watchdog thread when no reaper runs):
//!    applies the frees known done to the inner resource with one
//!    `reap_through(S, seq)`, wakes the head of the allocation queue if bytes
//!    came back, and queues the next notification of every stream with
//!    something pending.
//!
//! # When the device faults
//!
//! A host function is never called after a device fault. The
//! [watchdog](mod@self::watchdog) thread, parked with no timeout while nothing is
//! pending, wakes every [`FALLBACK_PERIOD`] while something is: it queries each
//! stream's in-flight notification event, delivers completed ones (so a
//! late or failed host function loses nothing) and fails every waiter of a
//! stream whose query errors with that driver error. Waiting allocations then
//! retry and get the device's error. No future hangs forever.
//!
//! # Dropping
//!
//! Dropping any future or handle never blocks, never frees early and never
//! leaks: the GPU work and frees it stands for go on, its waiter is removed,
//! and a free's accounting is still applied by the dispatcher. Dropping the
//! last [`AsyncResource`] (and every future of it) stops the watchdog and any
//! reaper, and releases the notifier streams and events.
//!
//! # Auto traits
//!
//! Every public future and handle is `Send + Sync + Unpin + 'static`, so it
//! can be spawned on any executor, moved between threads and polled without
//! pinning.

// The driver calls on the notifier's own handles (`notifier`, `event_future`)
// are the only unsafe code here; each is argued where it is.
#![deny(unsafe_code)]

// Floors from the bottom; each file imports only from floors below it.
//
// 0. Plain data: the points ring, the wait policy and stats, the allocation
//    wait queue, the kick (the dispatcher's wake-up callback), where an
//    owned buffer's block is known done with.
mod done_at;
mod hold_wait;
mod kick;
mod points;
mod queue_stats;
mod wait_policy;
mod wait_queue;
mod wait_stats;
// 1. The notifier: per-stream state; it kicks, it does not name `Core`.
mod notifier;
// 2. The watchdog: patrols what it is handed (`watchdog::Patrolled`).
pub(crate) mod watchdog;
// 3. `Core`: owns the notifiers, the wait queue and the watchdog's kick.
mod core;
// 4. The futures and handles, made over `Core` (a waiter's place in the
//    queue first); the free path, awaited or not.
mod alloc_future;
mod dealloc;
mod event_future;
mod frees;
mod reserve;
mod waiter;
// 5. `AsyncResource`, which makes them (its essay maps the files of its
//    methods): its uses and completions, what it can tell, its layers'
//    handles and its shutdown, its sleep over a cache.
mod async_resource;
mod completions;
mod observing;
mod shutdown;
mod sleep;
// 6. `Reaper`, the background dispatcher of an `AsyncResource`.
#[cfg(feature = "tokio")]
mod reaper;

pub use alloc_future::AllocFuture;
pub use async_resource::{AnyResource, AsyncResource};
pub use shutdown::ShutdownReport;
// For owned buffers, which hold only the core of their resource.
pub(crate) use self::core::Core;
pub use dealloc::{DeallocHandle, ReapFuture};
pub(crate) use done_at::DoneAt;
pub use event_future::EventFuture;
pub(crate) use frees::deallocate_detached;
pub use queue_stats::QueueStats;
#[cfg(feature = "tokio")]
pub use reaper::Reaper;
pub use reserve::{MemoryReservation, ReserveFuture};
pub use wait_policy::{WaitPolicy, WhenBehind};
pub use wait_stats::WaitStats;
pub use waiter::WAIT_TARGET;
pub use watchdog::FALLBACK_PERIOD;
