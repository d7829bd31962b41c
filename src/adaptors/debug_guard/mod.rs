//! DebugGuard: hold deallocated blocks in quarantine before the real free,
//! so that use-after-free and double free show up in debugging.
//!
//! # State
//!
//! Under one mutex:
//! - the blocks handed out through the guard and not yet deallocated
//!   (their address and size, to recognise stale or forged descriptors);
//! - the **quarantine**: deallocated blocks, oldest first, with their count
//!   and bytes. They are still live in the inner resource, so
//!   [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding)
//!   and a budget above keep counting them.
//!
//! # Who adds, who drains
//!
//! `deallocate` checks the block, makes room by really freeing the oldest
//! quarantined blocks until the new one fits under both caps
//! ([`GuardConfig::max_blocks`], [`GuardConfig::max_bytes`]), optionally
//! fills it with a poison byte, and appends it; from then on
//! [`block_state`](crate::DeviceMemoryResource::block_state) reports
//! [`Quarantined`](crate::BlockState::Quarantined) and every block-use hook
//! on it is refused. [`DebugGuard::flush`] (and dropping the guard) frees
//! the whole quarantine.
//!
//! # Errors
//!
//! A second free, a stale id (freed earlier, through the quarantine and
//! out), a forged descriptor and a block of another resource are refused
//! with [`DoubleFree`](crate::ResourceError::DoubleFree),
//! [`UnknownBlock`](crate::ResourceError::UnknownBlock) or
//! [`ForeignBlock`](crate::ResourceError::ForeignBlock), changing nothing.
//!
//! The guard serialises deallocations behind its mutex (the inner calls made
//! under it only queue work); it is a debugging tool, not a fast path.

#![forbid(unsafe_code)]

mod layer;
mod poison;
mod resource;

pub use layer::{DebugGuardLayer, GuardConfig};
pub use poison::{GpuPoison, Poison};
pub use resource::DebugGuard;
