//! Core types shared by every layer: stream names, blocks, tags and access
//! kinds.
//!
//! These types carry no behaviour of their own and name no backend. A
//! [`StreamId`] names a stream of a device's
//! [`StreamPool`](crate::StreamPool); a [`DeviceBlock`] describes one
//! allocation handed out by a resource, and a [`BlockId`] names it in the
//! block-use hooks.

#![deny(unsafe_code)]

mod block;
mod capture_id;
mod completed;
mod never_used;
mod stream_id;
mod tag;

pub use block::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId};
pub use capture_id::CaptureId;
pub use completed::CompletedUses;
pub use never_used::NeverUsed;
pub(crate) use stream_id::SIM_HANDLE;
pub use stream_id::{RawStream, StreamId};
pub use tag::Tag;
