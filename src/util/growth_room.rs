//! The room a budget above a cache leaves the growth of the cache's
//! virtual-memory arena: how many more bytes the budget may count before
//! it passes its limit.
//!
//! A [`BudgetResource`](crate::BudgetResource) above a cache reserves what
//! the cache's cost says an allocation maps, and counts what the cache
//! holds after it. A growth of the arena maps ahead of its block (its
//! slack, up to `slack_percent` over the live high-water mark), on the
//! block's own physical handle: the budget above counts those pages too,
//! even past its limit, and none of them can be given back while the
//! block lives. So the arena maps ahead only inside this room; a budget
//! *below* the cache is asked for the bytes before they are created
//! instead (`MappingCharge`), and needs none of this.
//!
//! # State
//!
//! A per-thread number of bytes, `usize::MAX` (no bound) outside an
//! allocation through a budget above a cache. The budget
//! [enters](GrowthRoom::enter) a room around its inner allocation (its
//! limit less what it counts with the allocation's reservation), the
//! arena reads it ([`room`]) when it sizes a growth's map-ahead, and the
//! guard's drop restores the room outside. Nested budgets (two above one
//! cache) leave the smaller room. A thread-local, as the poll scope: the
//! allocation and its growth run on one thread, and the room never leaks
//! to another.

use std::cell::Cell;

thread_local! {
    static ROOM: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The current thread's allocation may grow a cache's arena ahead of its
/// block by at most the room entered, until this is dropped. See the
/// [module documentation](self).
#[derive(Debug)]
pub(crate) struct GrowthRoom {
    /// The room before (restored on drop).
    outer: usize,
    /// Not `Send`: the room belongs to the thread that entered it.
    _not_send: std::marker::PhantomData<*const ()>,
}

impl GrowthRoom {
    /// Bounds the growths of the current thread to `bytes` ahead of their
    /// blocks (or less, where an outer room is smaller).
    #[inline]
    pub(crate) fn enter(bytes: usize) -> GrowthRoom {
        let outer = ROOM.with(|r| r.replace(r.get().min(bytes)));
        GrowthRoom {
            outer,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for GrowthRoom {
    #[inline]
    fn drop(&mut self) {
        ROOM.with(|r| r.set(self.outer));
    }
}

/// The bytes a growth on the current thread may map ahead of its block:
/// `usize::MAX` when no budget above bounds it.
pub(crate) fn room() -> usize {
    ROOM.with(Cell::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rooms_nest_to_the_smaller_and_restore_on_drop() {
        assert_eq!(room(), usize::MAX);
        {
            let _outer = GrowthRoom::enter(10);
            assert_eq!(room(), 10);
            {
                let _inner = GrowthRoom::enter(20);
                assert_eq!(room(), 10, "the smaller room");
                let _tighter = GrowthRoom::enter(4);
                assert_eq!(room(), 4);
            }
            assert_eq!(room(), 10);
        }
        assert_eq!(room(), usize::MAX);
    }
}
