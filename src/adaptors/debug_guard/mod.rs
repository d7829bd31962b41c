//! DebugGuardResource: hold deallocated blocks in quarantine before the real free,
//! so that use-after-free and double free show up in debugging.
//!
//! # State
//!
//! Under the **state** mutex:
//! - the blocks handed out through the guard and not yet deallocated
//!   (their address and size, to recognise stale or forged descriptors);
//! - the blocks whose `deallocate` is in flight ("freeing");
//! - the **quarantine**: deallocated blocks, oldest first, with their count
//!   and bytes. They are still live in the inner resource, so
//!   [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding)
//!   and a budget above keep counting them.
//!
//! A second, **order** mutex holds no data: it serialises `deallocate` and
//! [`DebugGuardResource::flush`] among themselves, so that the quarantine's order and
//! its caps are decided by one thread at a time.
//!
//! # Locks
//!
//! The state lock is held only for short bookkeeping sections: never across
//! a call into the inner resource, nor across [`PoisonFill::fill`] (user code).
//! The order lock is held across the driver calls of a `deallocate` or a
//! flush (evictions, the poison fill and the hooks around it).
//!
//! Lock order: the order lock before the state lock, never the reverse (no
//! thread asks for the order lock while holding the state lock). So:
//! - the block-use hooks and
//!   [`block_state`](crate::DeviceMemoryResource::block_state), which take
//!   only the state lock, never wait behind a driver call or a fill running
//!   in another thread's `deallocate`;
//! - a [`PoisonFill`] may call the guard's hooks and `block_state` (on any
//!   block) from inside `fill` without deadlocking. It must not deallocate
//!   through, or flush, the same guard: that needs the order lock, which
//!   its caller holds.
//!
//! # Who adds, who drains
//!
//! `deallocate` checks the block and marks it as being freed (one state
//! section), then takes the order lock. It makes room by really freeing the
//! oldest quarantined blocks until the new one fits under both caps
//! ([`GuardConfig::max_blocks`], [`GuardConfig::max_bytes`]): each eviction
//! frees the oldest block in the inner resource first and takes it out of
//! the quarantine only once that succeeded. Then it optionally fills the
//! block with a poison byte, and appends it (one state section, which also
//! takes the mark off); from then on
//! [`block_state`](crate::DeviceMemoryResource::block_state) reports
//! [`Quarantined`](crate::BlockState::Quarantined) and every block-use hook
//! on it is refused. [`DebugGuardResource::flush`] (and dropping the guard) frees
//! the whole quarantine, oldest first, under the order lock.
//!
//! While its `deallocate` is in flight (waiting for the order lock, evicting,
//! poisoning), a block is "freeing": a second `deallocate` of it and every
//! block-use hook on it get [`FreeInFlight`](crate::ResourceError::FreeInFlight)
//! (that free may still fail and leave the block live, so it is neither a
//! use after free nor a double free yet), and `block_state` reports the
//! state it will be in if the free succeeds, as the stream-ordered resource
//! does.
//!
//! # Errors
//!
//! A second free, a stale id (freed earlier, through the quarantine and
//! out), a forged descriptor and a block of another resource are refused
//! with [`DoubleFree`](crate::ResourceError::DoubleFree),
//! [`UnknownBlock`](crate::ResourceError::UnknownBlock) or
//! [`ForeignBlock`](crate::ResourceError::ForeignBlock), changing nothing; a
//! free racing another of the same block with
//! [`FreeInFlight`](crate::ResourceError::FreeInFlight), changing nothing.
//!
//! A failing eviction, poison fill or inner free leaves the block being
//! deallocated live and exactly as it was (the mark comes off), and the
//! quarantine as it was (blocks already evicted stay freed).
//!
//! Deallocations and flushes are serialised behind the order lock; the
//! guard is a debugging tool, not a fast path.

// `MemsetPoisonFill` (see `debug_guard::poison`) and the guard's `unsafe impl
// DeviceMemoryResource` are the unsafe items.
#![deny(unsafe_code)]

mod layer;
mod poison;
mod resource;

pub use layer::{DebugGuardLayer, GuardConfig};
pub use poison::{MemsetPoisonFill, PoisonFill};
pub use resource::DebugGuardResource;
