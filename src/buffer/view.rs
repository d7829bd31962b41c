//! Views: [`BufferView`] and [`BufferViewMut`], a bounds-checked range of a
//! buffer's elements, ordered as the buffer is.

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use super::guard::{UseGuard, UseGuardMut};
use super::ledger::BufferCore;
use crate::error::{ResourceError, ResourceResult};
use crate::types::StreamId;

/// `(start, len)` of `range` within `len` elements.
///
/// # Errors
/// [`OutOfBounds`](ResourceError::OutOfBounds) for a range past `len`,
/// reversed, or whose ends overflow.
pub(crate) fn element_range(
    range: impl RangeBounds<usize>,
    len: usize,
) -> ResourceResult<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e - s)),
        (s, e) => Err(ResourceError::OutOfBounds {
            start: s.unwrap_or(usize::MAX),
            end: e.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// A shared view of elements of a [`Buffer`](super::Buffer): reads only.
///
/// Made by [`Buffer::slice`](super::Buffer::slice); it borrows the buffer,
/// so the buffer cannot be written or dropped while the view lives. Its
/// uses are the buffer's uses (one block, one set of recorded events).
pub struct BufferView<'a, T> {
    pub(crate) core: &'a BufferCore,
    pub(crate) ptr: u64,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

/// An exclusive view of elements of a [`Buffer`](super::Buffer): reads and
/// writes. Made by [`Buffer::slice_mut`](super::Buffer::slice_mut).
pub struct BufferViewMut<'a, T> {
    pub(crate) core: &'a BufferCore,
    pub(crate) ptr: u64,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

fn offset<T>(core: &BufferCore, start: usize) -> u64 {
    // In bounds of the block, so it cannot overflow the device address.
    core.block.ptr() + (start * std::mem::size_of::<T>()) as u64
}

impl<'a, T> BufferView<'a, T> {
    pub(crate) fn new(core: &'a BufferCore, start: usize, len: usize) -> Self {
        BufferView {
            core,
            ptr: offset::<T>(core, start),
            len,
            _elem: PhantomData,
        }
    }

    pub(crate) fn at(core: &'a BufferCore, ptr: u64, len: usize) -> Self {
        BufferView {
            core,
            ptr,
            len,
            _elem: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Device address of the view's first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// A view of elements `range` of this view.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> ResourceResult<BufferView<'a, T>> {
        let (start, len) = element_range(range, self.len)?;
        Ok(BufferView::at(
            self.core,
            self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
        ))
    }

    /// A read of the view on `stream` (see
    /// [`Buffer::read_on`](super::Buffer::read_on)).
    ///
    /// # Errors
    /// As [`Buffer::read_on`](super::Buffer::read_on).
    pub fn read_on(&self, stream: StreamId) -> ResourceResult<UseGuard<'a>> {
        UseGuard::begin(self.core, self.ptr, self.num_bytes(), stream)
    }
}

impl<'a, T> BufferViewMut<'a, T> {
    pub(crate) fn new(core: &'a BufferCore, start: usize, len: usize) -> Self {
        BufferViewMut {
            core,
            ptr: offset::<T>(core, start),
            len,
            _elem: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// Device address of the view's first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// A shared view of the same elements, for reads.
    pub fn as_view(&self) -> BufferView<'_, T> {
        BufferView::at(self.core, self.ptr, self.len)
    }

    /// A mutable view of elements `range` of this view.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> ResourceResult<BufferViewMut<'_, T>> {
        let (start, len) = element_range(range, self.len)?;
        Ok(BufferViewMut {
            core: self.core,
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
            _elem: PhantomData,
        })
    }

    /// A read of the view on `stream`.
    ///
    /// # Errors
    /// As [`Buffer::read_on`](super::Buffer::read_on).
    pub fn read_on(&self, stream: StreamId) -> ResourceResult<UseGuard<'_>> {
        UseGuard::begin(self.core, self.ptr, self.num_bytes(), stream)
    }

    /// A write of the view on `stream`: `stream` waits for every earlier use
    /// of the buffer.
    ///
    /// # Errors
    /// As [`Buffer::write_on`](super::Buffer::write_on).
    pub fn write_on(&mut self, stream: StreamId) -> ResourceResult<UseGuardMut<'_>> {
        UseGuardMut::begin(self.core, self.ptr, self.num_bytes(), stream)
    }

    /// Queues, on `stream`, a fill of every byte of the view with `value`.
    ///
    /// # Errors
    /// As [`write_on`](Self::write_on), and the driver's error.
    pub fn fill_bytes_on(&mut self, stream: StreamId, value: u8) -> ResourceResult<()> {
        let core = self.core;
        let raw = core.home.pool().raw(stream)?;
        let guard = self.write_on(stream)?;
        // SAFETY: `raw` is a stream of the home's pool (kept alive by the
        // home); the range is this view's, inside the buffer's block, which
        // the buffer owns (its free is queued only when it drops, and the
        // view borrows it); the block is an allocation of `home.gpu()`:
        // homes are built from a resource and its own backend, or through
        // `AsyncResource::with_parts`, whose contract says so.
        unsafe {
            core.home
                .gpu()
                .memset_async(guard.ptr(), value, guard.num_bytes(), raw)
        }
        .map_err(|e| e.for_request(0, stream))
    }

    /// Queues, on `stream`, a copy of `src` (of the same length, of another
    /// buffer) into this view.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds) when the lengths differ;
    /// as [`write_on`](Self::write_on), and the driver's error.
    pub fn copy_from_on(
        &mut self,
        stream: StreamId,
        src: &BufferView<'_, T>,
    ) -> ResourceResult<()> {
        if src.len() != self.len {
            return Err(ResourceError::OutOfBounds {
                start: 0,
                end: src.len(),
                len: self.len,
            });
        }
        let core = self.core;
        // Both blocks must be allocations of the backend the copy is queued
        // on: a buffer of another backend (another device, or the simulated
        // one) is refused before anything is queued.
        let (mine, theirs) = (core.home.gpu(), src.core.home.gpu());
        if !std::ptr::addr_eq(mine, theirs) {
            return Err(ResourceError::ForeignBlock {
                block: src.core.block.id(),
            });
        }
        let raw = core.home.pool().raw(stream)?;
        let read = src.read_on(stream)?;
        let write = self.write_on(stream)?;
        // SAFETY: as in `fill_bytes_on`, for both ranges: each is a view's,
        // inside a block its buffer owns and the view borrows; both homes are
        // the same backend object (checked above).
        let copied = unsafe {
            core.home
                .gpu()
                .copy_async(write.ptr(), read.ptr(), write.num_bytes(), raw)
        }
        .map_err(|e| e.for_request(0, stream));
        drop(write);
        drop(read);
        copied
    }
}

impl<T> fmt::Debug for BufferView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferView")
            .field("block", &self.core.block.id())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T> fmt::Debug for BufferViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferViewMut")
            .field("block", &self.core.block.id())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert_eq!(element_range(.., 10), Ok((0, 10)));
        assert_eq!(element_range(2..5, 10), Ok((2, 3)));
        assert_eq!(element_range(2..=5, 10), Ok((2, 4)));
        assert_eq!(element_range(10.., 10), Ok((10, 0)));
        assert!(element_range(5..11, 10).is_err());
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = element_range(6..5, 10);
        assert!(matches!(
            reversed,
            Err(ResourceError::OutOfBounds {
                start: 6,
                end: 5,
                len: 10
            })
        ));
        assert!(element_range(..=usize::MAX, 10).is_err());
    }
}
