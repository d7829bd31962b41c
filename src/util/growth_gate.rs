//! The gate a budget above a cache puts in front of the growths of the
//! cache's virtual-memory arena: every byte of new physical memory an
//! allocation through the budget makes the arena create is admitted by
//! the budget *before* it is created, as a budget below the cache admits
//! it through its [`MappingCharge`](crate::resource::MappingCharge).
//!
//! A [`BudgetResource`](crate::BudgetResource) above a cache reserves what
//! the cache's cost says an allocation maps, and counts what the cache
//! holds after it. The cost is a guess made before the block is placed,
//! under no lock the placement holds: another thread may take the free
//! range it saw (the loser grows instead), the placement may refuse a
//! range the cost counted (another stream's free, under
//! [`CrossStreamReuse::Done`](crate::CrossStreamReuse::Done)), and a growth
//! maps ahead of its block (its slack) on the block's own handle, which
//! cannot be given back while the block lives. Counted after the fact,
//! each of these took the cache past the budget's limit, and kept it there
//! as long as the pages stayed mapped. Through the gate a growth takes
//! first what the allocation reserved, then asks the budget for the rest
//! (after the arena gave its idle mappings back); a refusal fails the
//! growth as a budget below would, and the map-ahead shrinks to what the
//! budget admits.
//!
//! # State
//!
//! A per-thread chain of the gates entered, innermost first: empty (no
//! bound) outside an allocation through a budget above a cache. A budget
//! [enters](enter) its gate around its inner allocation, the arena asks
//! the chain ([`room`] to size a map-ahead, [`try_take`] before it
//! creates memory, [`give_back`] for what it did not create after all),
//! and the guard's drop restores the chain outside. Nested budgets (two
//! above one cache) each admit every growth. A thread-local, as the poll
//! scope: the allocation and its growth run on one thread, and a gate
//! never leaks to another.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;

/// A growth the gate refused: the numbers the budget compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) requested: usize,
    pub(crate) limit: usize,
    pub(crate) in_use: usize,
}

/// What admits the growths of one allocation (a budget above the cache).
pub(crate) trait GrowthGate {
    /// Bytes the allocation's growths may still take without a refusal
    /// now (what it reserved and no growth took, and the budget's room).
    fn room(&self) -> usize;
    /// Admits `bytes` of new device memory, or refuses them and takes
    /// nothing.
    fn try_take(&self, bytes: usize) -> Result<(), Refused>;
    /// `bytes` taken that the growth did not create after all: they stay
    /// counted for the allocation, for a later growth of it to take, and
    /// what nothing creates is settled after the allocation.
    fn give_back(&self, bytes: usize);
}

/// One gate in the thread's chain. Made by the budget on its stack, linked
/// by [`enter`], unlinked when the guard drops.
pub(crate) struct Link<'a> {
    gate: &'a dyn GrowthGate,
    /// The link entered before this one (an enclosing budget's), or null.
    outer: Cell<*const Link<'static>>,
}

impl<'a> Link<'a> {
    pub(crate) fn new(gate: &'a dyn GrowthGate) -> Self {
        Link {
            gate,
            outer: Cell::new(ptr::null()),
        }
    }
}

thread_local! {
    /// The innermost link entered on this thread, or null.
    static CHAIN: Cell<*const Link<'static>> = const { Cell::new(ptr::null()) };
}

/// The current thread's growths pass `link`'s gate (and the gates entered
/// before it) until this is dropped. See the [module documentation](self).
#[must_use]
pub(crate) struct Entered<'l> {
    /// The link entered before (restored on drop).
    outer: *const Link<'static>,
    /// Borrows the link for as long as the chain points at it, and is not
    /// `Send`: the chain belongs to the thread that entered it.
    _link: PhantomData<&'l Link<'l>>,
}

/// Puts `link` at the head of the current thread's chain until the guard
/// drops.
pub(crate) fn enter<'l>(link: &'l Link<'_>) -> Entered<'l> {
    let outer = CHAIN.with(Cell::get);
    link.outer.set(outer);
    // Lifetimes only: the chain holds the link as long as the guard,
    // which borrows it for `'l`, lives (see `links`).
    let erased = ptr::from_ref(link).cast::<Link<'static>>();
    CHAIN.with(|c| c.set(erased));
    Entered {
        outer,
        _link: PhantomData,
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        CHAIN.with(|c| c.set(self.outer));
    }
}

/// Calls `f` with each gate of the current thread's chain, innermost
/// first, until it returns `false`; returns whether it went through all.
fn links(mut f: impl FnMut(&dyn GrowthGate) -> bool) -> bool {
    let mut at = CHAIN.with(Cell::get);
    while !at.is_null() {
        // SAFETY: every pointer in the chain is a link borrowed by a live
        // `Entered` of this thread: `enter` puts a link at the head only
        // while its guard borrows it, and each guard, dropped before its
        // link can move or die (the borrow), restores the head it found.
        // Guards are locals of nested calls (crate-private, never
        // forgotten), so they drop innermost first and the chain never
        // holds a link whose guard is gone.
        let link = unsafe { &*at };
        if !f(link.gate) {
            return false;
        }
        at = link.outer.get();
    }
    true
}

/// The bytes a growth on the current thread may create without a
/// refusal: `usize::MAX` when no budget above bounds it.
pub(crate) fn room() -> usize {
    let mut room = usize::MAX;
    links(|gate| {
        room = room.min(gate.room());
        true
    });
    room
}

/// Admits `bytes` of new device memory at every gate of the current
/// thread (none: admitted).
///
/// # Errors
/// The first refusal; the gates that had admitted the bytes keep them
/// counted for the allocation (see [`GrowthGate::give_back`]).
pub(crate) fn try_take(bytes: usize) -> Result<(), Refused> {
    if bytes == 0 {
        return Ok(());
    }
    let mut refused = None;
    let mut admitted = 0;
    links(|gate| match gate.try_take(bytes) {
        Ok(()) => {
            admitted += 1;
            true
        }
        Err(r) => {
            refused = Some(r);
            false
        }
    });
    match refused {
        None => Ok(()),
        Some(r) => {
            let mut left = admitted;
            links(|gate| {
                if left == 0 {
                    return false;
                }
                left -= 1;
                gate.give_back(bytes);
                true
            });
            Err(r)
        }
    }
}

/// Bytes [`try_take`] admitted that the growth did not create.
pub(crate) fn give_back(bytes: usize) {
    if bytes == 0 {
        return;
    }
    links(|gate| {
        gate.give_back(bytes);
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gate with `left` bytes to admit.
    struct Bytes(Cell<usize>);

    impl GrowthGate for Bytes {
        fn room(&self) -> usize {
            self.0.get()
        }
        fn try_take(&self, bytes: usize) -> Result<(), Refused> {
            let left = self.0.get();
            if bytes > left {
                return Err(Refused {
                    requested: bytes,
                    limit: 0,
                    in_use: left,
                });
            }
            self.0.set(left - bytes);
            Ok(())
        }
        fn give_back(&self, bytes: usize) {
            self.0.set(self.0.get() + bytes);
        }
    }

    #[test]
    fn gates_nest_every_one_admits_and_the_chain_restores_on_drop() {
        assert_eq!(room(), usize::MAX);
        assert!(try_take(1 << 40).is_ok(), "no gate: no bound");
        let (outer, inner) = (Bytes(Cell::new(10)), Bytes(Cell::new(20)));
        {
            let outer_link = Link::new(&outer);
            let _outer = enter(&outer_link);
            assert_eq!(room(), 10);
            {
                let inner_link = Link::new(&inner);
                let _inner = enter(&inner_link);
                assert_eq!(room(), 10, "the smaller room");
                assert!(try_take(4).is_ok());
                assert_eq!((outer.0.get(), inner.0.get()), (6, 16));
                let refused = try_take(8).unwrap_err();
                assert_eq!(refused.requested, 8);
                assert_eq!(
                    (outer.0.get(), inner.0.get()),
                    (6, 16),
                    "the inner gate admitted, the outer refused: nothing taken"
                );
                give_back(4);
                assert_eq!((outer.0.get(), inner.0.get()), (10, 20));
            }
            assert_eq!(room(), 10);
        }
        assert_eq!(room(), usize::MAX);
    }
}
