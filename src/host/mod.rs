//! Pinned host memory for staging: a stream-ordered pool of page-locked
//! host buffers, and copies between them and device buffers that each
//! return one future.
//!
//! Every request of an inference service copies its input host → device
//! and its result back. An asynchronous copy needs pinned (page-locked)
//! host memory, and pinning is slow (`cuMemHostAlloc` takes milliseconds
//! for large sizes), so a [`HostPool`] pins once and hands the same blocks
//! out again, as PyTorch's `CachingHostAllocator` and RMM's
//! `pinned_host_memory_resource` under a pool do.
//!
//! ```text
//!  HostPool ─ allocate(len, tag) ─► HostBuffer<T> ── as_slice / as_mut_slice (host side)
//!     ▲                                  │ AsyncResource::copy_to_device(&host, &mut buf, s) → EventFuture
//!     │ idle blocks, by size class       │ AsyncResource::copy_to_host(&buf, &mut host, s)   → EventFuture
//!     │ pending blocks (copies unseen)  ◄┘ drop: back to the pool once every copy is seen complete
//!     └ trim(): unpin idle blocks; cap: pinned bytes at most
//! ```
//!
//! # Why stream-ordered
//!
//! A copy queued on a stream reads (host → device) or writes (device →
//! host) the host block *when the stream gets there*, not when it is
//! queued. So the host block has the same life as a device block: it may
//! change owner only once every copy that used it completed. Device memory
//! may be handed on earlier, behind a wait *on the GPU*; host memory may
//! not, because its next user is the host itself (a CPU write into the
//! buffer cannot wait on a CUDA event). So a host block goes back to the
//! pool only on a fact the host saw: a completion notification delivered,
//! or an event queried done, for the point each copy made
//! ([`Notifier::seen_reached`](crate::futures)'s proof, the same one an
//! owned device buffer's completed free rests on). A dropped copy future
//! proves nothing.
//!
//! # State
//!
//! - [`HostPool`]: idle blocks by size class (powers of two, at least one
//!   page), pending blocks (dropped, with copies not yet seen complete),
//!   the bytes it holds pinned (in use, idle, pending), its cap, and
//!   statistics per [`AllocTag`](crate::AllocTag).
//! - [`HostBuffer`]: one block, its length, and its **uses**: per stream,
//!   the completion point of the latest copy there and whether any copy
//!   there writes the block.
//!
//! # Who changes it
//!
//! - A copy ([`AsyncResource::copy_to_device`](crate::AsyncResource::copy_to_device),
//!   [`copy_to_host`](crate::AsyncResource::copy_to_host)) orders
//!   the device buffer like any launch, queues the driver's copy, and notes
//!   its point among the host buffer's uses.
//! - The host side ([`HostBuffer::as_slice`], [`HostBuffer::as_mut_slice`])
//!   is refused ([`HostBufferBusy`](crate::ResourceError::HostBufferBusy))
//!   until the host saw every conflicting copy complete: awaiting the
//!   copies' futures, or [`HostBuffer::ready`], shows it.
//! - A drop with every use seen complete puts the block back idle at once;
//!   otherwise it goes pending, and each copy's point is *watched*
//!   (`Notifier::watch`): its stream's notifications go on until one covers
//!   it, however many futures of the stream park or let go meanwhile (no
//!   thread polls, no stream is synchronized).
//!   [`HostPool::allocate`], [`trim`](HostPool::trim) and
//!   [`stats`](HostPool::stats) move the pending blocks whose copies have
//!   been seen complete back to idle.
//!
//! # How it differs from device memory
//!
//! - No cross-stream shortcut: two copies on two streams may not use one
//!   host buffer unless the second only reads and the first wrote nothing,
//!   or the host saw the first complete: a copy that would have to wait on
//!   another stream is refused rather than ordered, since the host buffer
//!   keeps no event of its own.
//! - Its contents are real on every backend: the simulated device hands
//!   out real, zeroed bytes (its copies move none, as its device memory
//!   stores none), so the host side of a program runs unchanged.
//! - Elements are [`HostElement`]s: plain data for which every bit pattern
//!   is a value, since the host reads what the device wrote.
//!
//! # Failure
//!
//! A block whose copy was queued but whose use could not be recorded (a
//! completion point could not be made after the driver took the copy) is
//! never handed out again nor read: it is leaked and counted
//! ([`HostPoolStats::leaked_bytes`]). A device fault leaves pending blocks
//! pending for good, as their copies are never seen complete.
//!
//! # Bounded
//!
//! The pool never holds more than its cap pinned
//! ([`HostPoolConfig::cap`]): past it, an allocation first takes back the
//! pending blocks seen complete and unpins idle ones, then fails with
//! [`HostPoolFull`](crate::ResourceError::HostPoolFull).

#![deny(unsafe_code)]

mod blocks;
mod buffer;
mod config;
mod copy;
mod element;
mod offload;
mod pool;
mod stats;
mod uses;

pub use buffer::HostBuffer;
pub use config::HostPoolConfig;
pub use element::HostElement;
pub use pool::HostPool;
pub use stats::{HostPoolStats, HostTagStats};
