//! Buffers taken from a [`MemoryReservation`]: no wait, no failure for lack
//! of memory, since the reservation's blocks exist already.

use super::element::DeviceElement;
use super::owned::{Buffer, byte_len};
use crate::error::ResourceResult;
use crate::futures::{AsyncResource, MemoryReservation};
use crate::resource::DeviceMemoryResource;
use crate::types::{StreamId, Tag};

impl MemoryReservation {
    /// Takes a buffer of `len` elements of `T` from the reservation: the
    /// smallest block left that holds it (the first such in the order
    /// asked, on a tie), whole. The buffer is on the reservation's
    /// [`stream`](Self::stream) and frees its block when dropped; the block
    /// does not come back to the reservation.
    ///
    /// # Errors
    /// [`SizeOverflow`](crate::ResourceError::SizeOverflow) when `len`
    /// elements overflow `usize` bytes;
    /// [`NotReserved`](crate::ResourceError::NotReserved) when no block left
    /// holds them, or they are zero bytes. The reservation is as it was.
    pub fn allocate_buffer<T: DeviceElement>(&mut self, len: usize) -> ResourceResult<Buffer<T>> {
        let block = self.take(byte_len::<T>(len)?)?;
        Ok(Buffer::adopt(block, len, self.core().clone()))
    }
}

impl<R: DeviceMemoryResource + ?Sized + 'static> AsyncResource<R> {
    /// Allocates one buffer of each of `lens` elements of `T` on `stream`,
    /// all or nothing: a [`reserve`](Self::reserve) of their sizes, whose
    /// blocks become the buffers, in the order asked.
    ///
    /// # Errors
    /// [`SizeOverflow`](crate::ResourceError::SizeOverflow) when a length
    /// overflows `usize` bytes; otherwise as
    /// [`ReserveFuture`](crate::ReserveFuture) (a zero length is
    /// an [`EmptyReservation`](crate::ResourceError::EmptyReservation)).
    /// Nothing is held after an error.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`reserve`](Self::reserve): dropped while waiting it
    /// holds nothing.
    pub async fn allocate_buffers<T: DeviceElement>(
        &self,
        lens: &[usize],
        stream: StreamId,
        tag: impl Into<Tag>,
    ) -> ResourceResult<Vec<Buffer<T>>> {
        let sizes = lens
            .iter()
            .map(|&len| byte_len::<T>(len))
            .collect::<ResourceResult<Vec<_>>>()?;
        let mut reservation = self.reserve(&sizes, stream, tag).await?;
        // Each size has its own block, the smallest that holds it: taken
        // in order, every one finds its own (or an equal one).
        lens.iter()
            .map(|&len| reservation.allocate_buffer(len))
            .collect()
    }
}
