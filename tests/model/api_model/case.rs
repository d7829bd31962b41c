//! A case: the stack the harness builds and the ops it runs on it.

use super::*;

/// One layer of the stack, as the builder adds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A budget with the limit `LIMITS[i]`.
    Budget(usize),
    /// The caching tier: the arena (where it sits right on the bottom
    /// resource) or size classes.
    Cache {
        arena: bool,
    },
    /// A debug guard keeping a freed block or two in quarantine.
    Guard,
    Retry,
    Stats,
    Tracing,
    /// A layer written by a user (its own `allocate`, the rest forwarded).
    User,
}

/// The stack under test and how the harness runs.
#[derive(Debug, Clone)]
pub(super) struct Stack {
    /// Outermost first.
    pub(super) kinds: Vec<Kind>,
    pub(super) granularity: usize,
    pub(super) reaper: bool,
    /// A second simulated device whose stack shares the outermost budget
    /// of this one (see [`twin`]).
    pub(super) twin: Option<TwinStack>,
}

/// Where something is dropped.
#[derive(Debug, Clone, Copy)]
pub(super) enum Place {
    Here,
    /// On a thread of its own.
    Thread,
    /// On a worker of another tokio runtime.
    Runtime,
}

/// What becomes of a completion future or free handle made by an op.
#[derive(Debug, Clone, Copy)]
pub(super) enum Then {
    /// Kept in a slot, for a later op.
    Keep,
    /// Dropped at once, maybe before it settled.
    Drop,
    /// Awaited (under the watchdog).
    Await,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// `allocate_buffer`: awaited, `try_`, or polled `polls` times and then
    /// dropped if still waiting.
    Alloc {
        size: usize,
        stream: usize,
        how: AllocHow,
    },
    /// A launch on `stream` writing one buffer and maybe reading another,
    /// its kernel touching both; `panic` makes the user's enqueue closure
    /// panic instead of launching.
    Launch {
        write: usize,
        read: Option<usize>,
        stream: usize,
        then: Then,
        panic: bool,
    },
    /// A buffer dropped (its free queued by the buffer).
    DropBuffer {
        slot: usize,
        at: Place,
    },
    /// A buffer given up as a block and freed through `deallocate`.
    Free {
        slot: usize,
        then: Then,
    },
    DropPoint {
        slot: usize,
        at: Place,
    },
    AwaitPoint {
        slot: usize,
    },
    DropFree {
        slot: usize,
        at: Place,
    },
    AwaitFree {
        slot: usize,
    },
    /// A request task: allocate, launch a write (and a read on `other`),
    /// await the completion, hold the buffer one more yield, drop it.
    Spawn {
        size: usize,
        stream: usize,
        other: usize,
    },
    /// `JoinHandle::abort` of a task, after running the executor `ticks`
    /// times: the task is cancelled at whatever await point it is.
    Abort {
        slot: usize,
        ticks: u8,
    },
    /// Runs the executor once and the device `n` operations.
    Tick {
        n: u8,
    },
    /// Runs the device `n` operations.
    Step {
        n: u8,
    },
    /// `reap_pending` of the futures layer, awaited.
    Reap,
    /// `release_idle` of the stack.
    ReleaseIdle,
    /// The `nth` next call of `FAULTS[call]` fails.
    Fault {
        call: usize,
        nth: u8,
    },
    /// A request no device can serve (`HUGE[which]` bytes), try and await.
    Huge {
        which: usize,
    },
    /// A step captured on `stream` through `capture_graph` (see
    /// [`graphs`]): `temps` temporaries of `size` bytes made, used and
    /// freed inside, maybe a block kept past the capture, maybe the buffer
    /// of slot `adopt` dropped on another thread while the stream captures.
    Capture {
        stream: usize,
        size: usize,
        temps: u8,
        keep: Keep,
        adopt: Option<usize>,
    },
    /// A replay of a graph on `stream`.
    Replay {
        slot: usize,
        stream: usize,
        then: Then,
    },
    DropGraph {
        slot: usize,
        at: Place,
    },
    /// An allocation on the second device (see [`twin`]); nothing when
    /// the stack has none.
    TwinAlloc {
        size: usize,
        how: AllocHow,
    },
    TwinDrop {
        slot: usize,
        at: Place,
    },
    /// A call given a stream of no pool of this resource (see
    /// [`foreign`]): refused, nothing changed.
    Foreign {
        from: Stranger,
        index: usize,
        call: Entry,
    },
    /// A reservation of two sizes on `stream` (see [`reserve`]), polled up
    /// to `polls` times; served, `take` of its blocks become buffers, and
    /// it is kept or dropped at once.
    Reserve {
        sizes: [usize; 2],
        stream: usize,
        polls: u8,
        take: u8,
        keep: bool,
    },
    /// A buffer taken from a kept reservation (its first block left).
    TakeReserved {
        slot: usize,
    },
    /// A kept reservation dropped, with the blocks it never handed out.
    DropReservation {
        slot: usize,
        at: Place,
    },
}

#[derive(Debug, Clone, Copy)]
pub(super) enum AllocHow {
    Await,
    Try,
    Cancel { polls: u8 },
}
