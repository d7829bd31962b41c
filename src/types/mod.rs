//! Core types shared by every layer: streams, blocks, tags and access kinds.
//!
//! These types carry no behaviour of their own. A [`StreamId`] names a stream
//! of a [`StreamPool`]; a [`DeviceBlock`] describes one allocation handed out
//! by a resource, and a [`BlockId`] names it in the block-use hooks.

mod block;
mod stream;

pub use block::{Access, AllocTag, BlockId, BlockState, DeviceBlock, ResourceId};
pub(crate) use stream::SIM_HANDLE;
pub use stream::{RawStream, StreamId, StreamPool};
