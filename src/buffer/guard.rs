//! [`UseGuard`] and [`UseGuardMut`]: one use of a buffer on one stream,
//! ordered on the way in and recorded when the guard drops.

use std::fmt;

use super::drop_errors;
use super::ledger::{BufferCore, End};
use crate::error::ResourceResult;
use crate::gpu::sim::MemAccess;
use crate::types::{Access, StreamId};

/// One use in flight; its drop records it.
struct Use<'a> {
    core: &'a BufferCore,
    ptr: u64,
    bytes: usize,
    stream: StreamId,
    access: Access,
}

impl<'a> Use<'a> {
    fn begin(
        core: &'a BufferCore,
        ptr: u64,
        bytes: usize,
        stream: StreamId,
        access: Access,
    ) -> ResourceResult<Self> {
        core.begin(stream, access, End::Guarded)?;
        Ok(Use {
            core,
            ptr,
            bytes,
            stream,
            access,
        })
    }
}

impl Drop for Use<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.core.end(self.stream, self.access) {
            drop_errors::report(self.core.block.id(), "recording a use", e);
        }
    }
}

impl fmt::Debug for Use<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Use")
            .field("block", &self.core.block.id())
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes)
            .field("stream", &self.stream)
            .field("access", &self.access)
            .finish()
    }
}

/// A read of (part of) a buffer on one stream.
///
/// Made by [`Buffer::read_on`](super::Buffer::read_on) or a view's
/// `read_on`: the stream already waits for the buffer's last write. Queue
/// the work that reads [`ptr`](Self::ptr) on [`stream`](Self::stream) while
/// the guard lives; its drop records the read, so that a later write and the
/// free wait for that work.
///
/// # Stream ordering
/// Only work queued on the guard's stream before the guard drops is
/// covered. Using the address after the drop, or on another stream, escapes
/// the ordering (the simulated device's race detector reports it).
#[must_use = "the use is recorded when the guard drops: queue the work first"]
#[derive(Debug)]
pub struct UseGuard<'a>(Use<'a>);

/// A write of (part of) a buffer on one stream: as [`UseGuard`], and the
/// stream also waits for every earlier read.
#[must_use = "the use is recorded when the guard drops: queue the work first"]
#[derive(Debug)]
pub struct UseGuardMut<'a>(Use<'a>);

macro_rules! accessors {
    ($guard:ident, $access:expr) => {
        impl<'a> $guard<'a> {
            pub(crate) fn begin(
                core: &'a BufferCore,
                ptr: u64,
                bytes: usize,
                stream: StreamId,
            ) -> ResourceResult<Self> {
                Use::begin(core, ptr, bytes, stream, $access).map($guard)
            }

            /// Device address of the first element used.
            pub fn ptr(&self) -> u64 {
                self.0.ptr
            }

            /// Bytes used.
            pub fn num_bytes(&self) -> usize {
                self.0.bytes
            }

            /// The stream the use is ordered on.
            pub fn stream(&self) -> StreamId {
                self.0.stream
            }

            /// The use as a simulated kernel's memory access, for
            /// [`SimGpu::launch_kernel`](crate::gpu::sim::SimGpu::launch_kernel).
            pub fn sim_access(&self) -> MemAccess {
                MemAccess {
                    ptr: self.0.ptr,
                    access: $access,
                }
            }
        }
    };
}

accessors!(UseGuard, Access::Read);
accessors!(UseGuardMut, Access::Write);
