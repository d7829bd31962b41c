//! Views: [`BufferView`] and [`BufferViewMut`], a bounds-checked range of a
//! buffer's elements, ordered as the buffer is.

// Unsafe here: a view's copies and fills are raw-address calls of the `Gpu` seam.
#![allow(unsafe_code)]

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
    span: Span<'a, T>,
}

/// An exclusive view of elements of a [`Buffer`](super::Buffer): reads and
/// writes. Made by [`Buffer::slice_mut`](super::Buffer::slice_mut).
pub struct BufferViewMut<'a, T> {
    span: Span<'a, T>,
}

/// What both kinds of view hold: a range of a buffer's block, in elements
/// of `T`. The address arithmetic lives here once; the view types add what
/// their borrow allows (reads; reads and writes).
struct Span<'a, T> {
    core: &'a BufferCore,
    /// Device address of the first element.
    ptr: u64,
    /// Number of elements.
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for Span<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Span<'_, T> {}

impl<'a, T> Span<'a, T> {
    /// Elements `start..start + len` of the buffer of `core`, a range that
    /// [`element_range`] checked against the buffer's length.
    fn of_buffer(core: &'a BufferCore, start: usize, len: usize) -> Self {
        let whole = Span {
            core,
            ptr: core.block.ptr(),
            len: start + len,
            _elem: PhantomData,
        };
        whole.sub(start, len)
    }

    /// Elements `start..start + len` of this span, a range inside it.
    fn sub(self, start: usize, len: usize) -> Self {
        debug_assert!(start + len <= self.len);
        Span {
            // In bounds of the block, so it cannot overflow the device
            // address.
            ptr: self.ptr + (start * std::mem::size_of::<T>()) as u64,
            len,
            ..self
        }
    }

    /// Elements `range` of this span.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    fn slice(self, range: impl RangeBounds<usize>) -> ResourceResult<Self> {
        let (start, len) = element_range(range, self.len)?;
        Ok(self.sub(start, len))
    }

    fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    fn fmt_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("block", &self.core.block.id())
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// The accessors both view types answer from their span, written once.
macro_rules! span_accessors {
    () => {
        /// Number of elements.
        pub fn len(&self) -> usize {
            self.span.len
        }

        /// Whether the view holds no element.
        pub fn is_empty(&self) -> bool {
            self.span.len == 0
        }

        /// Size in bytes.
        pub fn num_bytes(&self) -> usize {
            self.span.num_bytes()
        }

        /// Device address of the view's first element.
        pub fn ptr(&self) -> u64 {
            self.span.ptr
        }

        /// The buffer the view borrows from, for ordering a launch.
        pub(crate) fn core(&self) -> &'a BufferCore {
            self.span.core
        }
    };
}

impl<'a, T> BufferView<'a, T> {
    pub(crate) fn new(core: &'a BufferCore, start: usize, len: usize) -> Self {
        BufferView {
            span: Span::of_buffer(core, start, len),
        }
    }

    span_accessors!();

    /// A view of elements `range` of this view.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> ResourceResult<BufferView<'a, T>> {
        Ok(BufferView {
            span: self.span.slice(range)?,
        })
    }

    /// A read of the view on `stream` (see
    /// [`Buffer::read_on`](super::Buffer::read_on)).
    ///
    /// # Errors
    /// As [`Buffer::read_on`](super::Buffer::read_on).
    pub fn read_on(&self, stream: StreamId) -> ResourceResult<UseGuard<'a>> {
        UseGuard::begin(self.span.core, self.span.ptr, self.num_bytes(), stream)
    }
}

impl<'a, T> BufferViewMut<'a, T> {
    pub(crate) fn new(core: &'a BufferCore, start: usize, len: usize) -> Self {
        BufferViewMut {
            span: Span::of_buffer(core, start, len),
        }
    }

    span_accessors!();

    /// A shared view of the same elements, for reads.
    pub fn as_view(&self) -> BufferView<'_, T> {
        BufferView { span: self.span }
    }

    /// A mutable view of elements `range` of this view.
    ///
    /// # Errors
    /// [`OutOfBounds`](ResourceError::OutOfBounds).
    pub fn slice_mut(
        &mut self,
        range: impl RangeBounds<usize>,
    ) -> ResourceResult<BufferViewMut<'_, T>> {
        Ok(BufferViewMut {
            span: self.span.slice(range)?,
        })
    }

    /// A read of the view on `stream`.
    ///
    /// # Errors
    /// As [`Buffer::read_on`](super::Buffer::read_on).
    pub fn read_on(&self, stream: StreamId) -> ResourceResult<UseGuard<'_>> {
        UseGuard::begin(self.span.core, self.span.ptr, self.num_bytes(), stream)
    }

    /// A write of the view on `stream`: `stream` waits for every earlier use
    /// of the buffer.
    ///
    /// # Errors
    /// As [`Buffer::write_on`](super::Buffer::write_on).
    pub fn write_on(&mut self, stream: StreamId) -> ResourceResult<UseGuardMut<'_>> {
        UseGuardMut::begin(self.span.core, self.span.ptr, self.num_bytes(), stream)
    }

    /// Queues, on `stream`, a fill of every byte of the view with `value`.
    ///
    /// # Errors
    /// As [`write_on`](Self::write_on), and the driver's error.
    pub fn fill_bytes_on(&mut self, stream: StreamId, value: u8) -> ResourceResult<()> {
        let core = self.span.core;
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
        if src.len() != self.len() {
            return Err(ResourceError::OutOfBounds {
                start: 0,
                end: src.len(),
                len: self.len(),
            });
        }
        let core = self.span.core;
        // Both blocks must be allocations of the backend the copy is queued
        // on: a buffer of another backend (another device, or the simulated
        // one) is refused before anything is queued.
        let (mine, theirs) = (core.home.gpu(), src.span.core.home.gpu());
        if !std::ptr::addr_eq(mine, theirs) {
            return Err(ResourceError::ForeignBlock {
                block: src.span.core.block.id(),
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
        self.span.fmt_as("BufferView", f)
    }
}

impl<T> fmt::Debug for BufferViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.span.fmt_as("BufferViewMut", f)
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
