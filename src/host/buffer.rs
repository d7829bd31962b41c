//! [`HostBuffer`]: a typed block of pinned host memory from a
//! [`HostPool`](super::HostPool), which goes back to it after every copy.

// Slices over the pinned block, each argued where it is made.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::blocks::Shared;
use super::element::HostElement;
use super::uses::HostUses;
use crate::error::{ResourceError, ResourceResult};
use crate::futures::{Core, EventFuture};
use crate::gpu::HostMemory;
use crate::types::{Access, AllocTag, StreamId};

/// `len` elements of `T` in pinned host memory, owned: dropping the buffer
/// gives its block back to its pool once the host saw every copy of it
/// complete.
///
/// Made by [`HostPool::allocate`](super::HostPool::allocate); copied to
/// and from device buffers by
/// [`AsyncResource::copy_to_device`](crate::AsyncResource::copy_to_device)
/// and [`copy_to_host`](crate::AsyncResource::copy_to_host), one
/// future each.
///
/// # Stream ordering
/// The host side ([`as_slice`](Self::as_slice),
/// [`as_mut_slice`](Self::as_mut_slice)) is open only while no copy the
/// host has not seen complete conflicts with it: a copy to the device reads
/// the block when its stream gets there, a copy to the host writes it
/// then. Awaiting each copy's future (or [`ready`](Self::ready)) shows the
/// host they completed.
pub struct HostBuffer<T> {
    block: HostMemory,
    len: usize,
    tag: AllocTag,
    pub(super) pool: Arc<Shared>,
    pub(super) uses: HostUses,
    /// A copy was queued whose use could not be recorded: the block is
    /// never read, handed out or freed again.
    pub(super) tainted: AtomicBool,
    _elements: PhantomData<T>,
}

impl<T: HostElement> HostBuffer<T> {
    pub(super) fn new(block: HostMemory, len: usize, tag: AllocTag, pool: Arc<Shared>) -> Self {
        HostBuffer {
            block,
            len,
            tag,
            pool,
            uses: HostUses::default(),
            tainted: AtomicBool::new(false),
            _elements: PhantomData,
        }
    }

    /// Zeroes a newly pinned block.
    pub(super) fn zero(block: &HostMemory) {
        // SAFETY: the block was just pinned by `host_alloc` (`bytes` bytes
        // at `ptr`, writable by the host: the seam's Safety 5), no one else
        // has it yet, and no copy was ever queued on it.
        unsafe { std::ptr::write_bytes(block.ptr.as_ptr(), 0, block.bytes) }
    }

    /// The elements, for the host to read.
    ///
    /// # Errors
    /// [`HostBufferBusy`](ResourceError::HostBufferBusy) while a copy to
    /// the host that the host has not seen complete may still write the
    /// block.
    pub fn as_slice(&self) -> ResourceResult<&[T]> {
        self.check_host(false)?;
        self.pool
            .gpu
            .note_host_access(self.block.addr, Access::Read);
        // SAFETY: `len` elements fit the block (`allocate` sized its class
        // from them) and are initialized (zeroed when pinned, then written
        // only with bytes, which every bit pattern of a `HostElement`
        // makes a value of); the pointer is aligned (256 bytes, Safety 5
        // of the seam, at least any primitive's alignment); no copy writes
        // the block now (checked above: every writing copy was seen
        // complete), and the borrow of `self` keeps the host from writing
        // it or queuing a copy that writes it while the slice lives.
        Ok(unsafe { std::slice::from_raw_parts(self.block.ptr.as_ptr().cast::<T>(), self.len) })
    }

    /// The elements, for the host to write.
    ///
    /// # Errors
    /// [`HostBufferBusy`](ResourceError::HostBufferBusy) while a copy that
    /// the host has not seen complete may still read or write the block.
    pub fn as_mut_slice(&mut self) -> ResourceResult<&mut [T]> {
        self.check_host(true)?;
        self.uses.prune();
        self.pool
            .gpu
            .note_host_access(self.block.addr, Access::Write);
        // SAFETY: as in `as_slice`, with every copy of the block seen
        // complete (checked above), and the exclusive borrow of `self`
        // keeps any other access and any copy away while the slice lives.
        Ok(
            unsafe {
                std::slice::from_raw_parts_mut(self.block.ptr.as_ptr().cast::<T>(), self.len)
            },
        )
    }

    fn check_host(&self, write: bool) -> ResourceResult<()> {
        if self.is_tainted() {
            return Err(ResourceError::HostBufferBusy { pending: 1 });
        }
        match self.uses.conflicts(write, None) {
            0 => Ok(()),
            pending => Err(ResourceError::HostBufferBusy { pending }),
        }
    }
}

impl<T> HostBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no element (never: the pool refuses zero).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes of the elements (the block may be larger: its size
    /// class).
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The tag it was allocated with.
    pub fn tag(&self) -> AllocTag {
        self.tag
    }

    /// Whether a failed copy left the buffer unusable.
    pub(super) fn is_tainted(&self) -> bool {
        self.tainted.load(Ordering::Acquire)
    }

    /// A copy was queued whose use could not be recorded.
    pub(super) fn taint(&self) {
        self.tainted.store(true, Ordering::Release);
    }

    /// The block's address for the backend's copy calls.
    pub(super) fn addr(&self) -> u64 {
        self.block.addr
    }

    /// Copies of the buffer not yet seen complete by the host.
    pub fn pending_copies(&self) -> usize {
        if self.is_tainted() {
            return 1;
        }
        self.uses.unseen()
    }

    /// Waits until the host has seen every copy of the buffer complete
    /// (for copies whose futures were dropped): makes a completion point
    /// at the end of each stream concerned, and awaits them.
    ///
    /// # Errors
    /// A stream being captured into a graph
    /// ([`StreamCapturing`](ResourceError::StreamCapturing)); the driver's
    /// error (a device fault); [`HostBufferBusy`](ResourceError::HostBufferBusy)
    /// for a buffer a failed copy left unusable.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, it leaves the buffer as it was.
    pub async fn ready(&self) -> ResourceResult<()> {
        if self.is_tainted() {
            return Err(ResourceError::HostBufferBusy { pending: 1 });
        }
        let points: Vec<EventFuture> = self
            .uses
            .pending_streams()
            .into_iter()
            .map(|(core, stream)| EventFuture::point(&core, stream))
            .collect::<ResourceResult<_>>()?;
        for point in points {
            point.await?;
        }
        Ok(())
    }

    /// Notes a copy on `stream` of the futures core `core`, whose
    /// completion point is `seq`.
    pub(super) fn note_copy(&self, core: &Arc<Core>, stream: StreamId, seq: u64, writes: bool) {
        self.uses.note(core, stream, seq, writes);
    }
}

impl<T> Drop for HostBuffer<T> {
    fn drop(&mut self) {
        let uses = std::mem::take(&mut self.uses);
        if self.tainted.load(Ordering::Acquire) {
            tracing::error!(
                bytes = self.block.bytes,
                "a host buffer with an unrecorded copy dropped: its block is leaked"
            );
            self.pool.leak(self.block, self.tag);
        } else {
            self.pool.give_back(self.block, uses, self.tag);
        }
    }
}

impl<T> fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("bytes", &self.block.bytes)
            .field("tag", &self.tag)
            .field("pending_copies", &self.pending_copies())
            .finish()
    }
}
