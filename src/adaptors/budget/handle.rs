//! [`Budget`]: the shared byte counter and its limit.

use std::fmt;
use std::sync::Arc;

use crate::util::sync::{AtomicUsize, Ordering};

use crate::error::{ResourceError, ResourceResult};
use crate::resource::BudgetRelief;

#[derive(Debug)]
struct Shared {
    limit: usize,
    /// Bytes reserved and not released; raised by the CAS loop of
    /// `try_reserve`, which never passes `limit`, and by `charge` (a race
    /// over a cached block, caught up with after the fact).
    in_use: AtomicUsize,
    /// Highest `in_use` reached by a committed reservation.
    peak: AtomicUsize,
    /// The resources charging this budget, asked for idle memory when a
    /// request is refused (the module `relief`).
    holders: BudgetRelief,
}

/// A byte budget shared by every resource (and device) that holds a clone.
///
/// Cloning is cheap and every clone counts against the same limit.
///
/// # What a budget byte is
///
/// A byte of device memory held for the resources under the budget: what
/// the layer right below each [`BudgetResource`](super::BudgetResource)
/// has taken from the device and not yet got back. That is a live block at
/// the size the device gave it (a cache's size class, the whole 2 MiB
/// pages an arena maps for a 4 KiB block), an idle cached block or page, a
/// quarantined block, and a freed block until its free has executed. It is
/// not the caller's request: under a cache a 4 KiB request may count 2 MiB,
/// or nothing when a cached block serves it. A refusal,
/// [`BudgetExceeded`](ResourceError::BudgetExceeded), reports these very
/// numbers: the device bytes the allocation needed, the limit, and what
/// was counted.
///
/// When a request is refused, the budget first asks every resource under
/// it, on every device, to give its idle memory back
/// ([`release_idle`](Self::release_idle)), and tries once more.
///
/// # Examples
/// ```
/// use streamalloc::Budget;
///
/// let budget = Budget::new(1 << 20);
/// let same = budget.clone();
/// budget.try_reserve(1 << 19)?.commit();
/// assert_eq!(same.in_use(), 1 << 19);
/// assert!(same.try_reserve(1 << 20).is_err());
/// {
///     let _undone = same.try_reserve(1 << 10)?; // dropped uncommitted
/// }
/// assert_eq!(same.in_use(), 1 << 19);
/// same.release(1 << 19);
/// assert_eq!(budget.in_use(), 0);
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
#[derive(Clone)]
pub struct Budget {
    shared: Arc<Shared>,
}

impl Budget {
    /// A budget of `limit` bytes, none in use.
    pub fn new(limit: usize) -> Self {
        Budget {
            shared: Arc::new(Shared {
                limit,
                in_use: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
                holders: BudgetRelief::default(),
            }),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.shared.limit
    }

    /// Bytes counted against the budget now.
    pub fn in_use(&self) -> usize {
        self.shared.in_use.load(Ordering::Acquire)
    }

    /// Bytes that can still be reserved.
    pub fn available(&self) -> usize {
        self.shared.limit.saturating_sub(self.in_use())
    }

    /// The highest [`in_use`](Self::in_use) reached by a committed
    /// reservation (a reservation given back uncommitted leaves no trace);
    /// above the limit only by what a budget resource caught up with after a
    /// race over a cached block.
    pub fn peak(&self) -> usize {
        self.shared.peak.load(Ordering::Acquire)
    }

    /// The resources registered to give idle memory back (the module
    /// `relief`), as the resources charging this budget report it.
    pub(crate) fn relief(&self) -> &BudgetRelief {
        &self.shared.holders
    }

    /// Whether `other` is a clone of this budget (counts against the same
    /// limit).
    pub fn same_as(&self, other: &Budget) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Counts `bytes` against the budget if they fit, and returns the
    /// reservation: [`commit`](BudgetReservation::commit) it once the memory is
    /// really allocated, or drop it to give the bytes back.
    ///
    /// Nothing (`bytes == 0`) always fits, even while `in_use` is past the
    /// limit (a charge of bytes already allocated may take it there): it
    /// takes no byte from the device.
    ///
    /// # Errors
    /// [`ResourceError::BudgetExceeded`] when `bytes > 0` and
    /// `in_use + bytes` would pass the limit (or overflow), carrying
    /// `bytes` and the `in_use` it was compared with; nothing is counted
    /// then.
    ///
    /// # Cancel safety
    /// Dropping the reservation (an early return, a panic, a dropped future
    /// holding it) releases the bytes.
    #[inline]
    pub fn try_reserve(&self, bytes: usize) -> ResourceResult<BudgetReservation<'_>> {
        self.reserve_or_level(bytes)
            .map_err(|in_use| ResourceError::BudgetExceeded {
                requested: bytes,
                limit: self.shared.limit,
                in_use,
            })
    }

    /// [`try_reserve`](Self::try_reserve) for the allocation's hot path:
    /// `None` when the bytes do not fit. Its result is a reference and two
    /// words, which the compiler keeps in registers; `try_reserve`'s
    /// carries the whole error beside them, and the allocation paid a copy
    /// of it through memory (two stores read back as one load, which the
    /// processor cannot forward) on every call.
    #[inline]
    pub(crate) fn reserve(&self, bytes: usize) -> Option<BudgetReservation<'_>> {
        self.reserve_or_level(bytes).ok()
    }

    /// The reservation, or the `in_use` that `bytes` did not fit beside.
    #[inline(always)]
    fn reserve_or_level(&self, bytes: usize) -> Result<BudgetReservation<'_>, usize> {
        let shared = &*self.shared;
        let mut current = shared.in_use.load(Ordering::Acquire);
        if bytes == 0 {
            // Nothing to count (a cache hit below, or pages it mapped
            // already): it fits even past the limit, where a charge of
            // bytes already allocated may have taken the count (a block
            // placed across one page more than its cost guessed, a race
            // over a cached block). Refused there, a request the memory
            // held serves would wait for that memory to be given back,
            // which a live block on the same handle may prevent for good.
            return Ok(BudgetReservation {
                budget: self,
                bytes,
                level: current,
            });
        }
        loop {
            let next = match current.checked_add(bytes) {
                Some(next) if next <= shared.limit => next,
                _ => return Err(current),
            };
            // Reserve with a CAS so that two threads that both saw room
            // cannot both take the last of it.
            match shared.in_use.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Ok(BudgetReservation {
                        budget: self,
                        bytes,
                        level: next,
                    });
                }
                Err(seen) => current = seen,
            }
        }
    }

    /// Counts `bytes` that are already allocated, even past the limit (a
    /// [`BudgetResource`](super::BudgetResource) catching up with what a
    /// racing allocation below it really took).
    pub(crate) fn charge(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let level = self
            .shared
            .in_use
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        self.shared.peak.fetch_max(level, Ordering::AcqRel);
    }

    /// Gives `bytes` back, and wakes the allocations waiting for memory
    /// (through an [`AsyncResource`](crate::AsyncResource)) on every
    /// resource and device that charges this budget, and no others.
    /// Releasing more than is in use is a bookkeeping bug of the caller; the
    /// count stops at zero rather than wrapping.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let before = self
            .shared
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                Some(c.saturating_sub(bytes))
            })
            .unwrap_or(0);
        if before < bytes {
            tracing::warn!(
                released = bytes,
                in_use = before,
                "budget released more bytes than were in use"
            );
        }
        // Any resource charging this budget, on any device, may have an
        // allocation waiting for these bytes; others could not use them.
        crate::waiters::memory_returned(self.shared.holders.scope());
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Budget")
            .field("limit", &self.limit())
            .field("in_use", &self.in_use())
            .field("peak", &self.peak())
            .finish()
    }
}

/// Bytes counted against a [`Budget`] for an allocation in progress.
///
/// Dropped uncommitted, it gives the bytes back; [`commit`](Self::commit)
/// keeps them counted (until [`Budget::release`]).
#[must_use = "an uncommitted reservation is released when dropped"]
#[derive(Debug)]
pub struct BudgetReservation<'a> {
    budget: &'a Budget,
    bytes: usize,
    /// `in_use` right after this reservation was taken.
    level: usize,
}

impl BudgetReservation<'_> {
    /// The bytes reserved.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Keeps the bytes counted: the allocation they were reserved for
    /// succeeded.
    #[inline]
    pub fn commit(self) {
        let peak = &self.budget.shared.peak;
        // Once the budget has been as full as this, the peak only needs a
        // load: the read-modify-write is for new highs.
        if self.level > peak.load(Ordering::Acquire) {
            peak.fetch_max(self.level, Ordering::AcqRel);
        }
        std::mem::forget(self);
    }

    /// [`commit`](Self::commit) in place, for a reservation that a guard
    /// holds by value: keeps the bytes counted and leaves a reservation of
    /// nothing, whose drop gives nothing back.
    #[inline(always)]
    pub(crate) fn commit_in_place(&mut self) {
        let peak = &self.budget.shared.peak;
        if self.level > peak.load(Ordering::Acquire) {
            peak.fetch_max(self.level, Ordering::AcqRel);
        }
        self.bytes = 0;
    }

    /// Gives the bytes back now, in place (as a drop would), leaving a
    /// reservation of nothing. Inlined, so that the guard holding the
    /// reservation lives in registers (out of line, this function took its
    /// address, and the guard went through memory on every allocation).
    #[inline(always)]
    pub(crate) fn release_in_place(&mut self) {
        self.budget.release(std::mem::take(&mut self.bytes));
    }
}

impl Drop for BudgetReservation<'_> {
    // Inlined with its check: a reservation committed in place is dropped
    // on every allocation and gives nothing back.
    #[inline]
    fn drop(&mut self) {
        if self.bytes != 0 {
            self.budget.release(self.bytes);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_committed_in_place_stays_counted_when_dropped() {
        let budget = Budget::new(100);
        let mut reservation = budget.reserve(60).expect("60 of 100 fit");
        reservation.commit_in_place();
        drop(reservation);
        assert_eq!((budget.in_use(), budget.peak()), (60, 60));
    }

    #[test]
    fn a_reservation_released_in_place_leaves_no_trace() {
        let budget = Budget::new(100);
        let mut reservation = budget.reserve(60).expect("60 of 100 fit");
        reservation.release_in_place();
        assert_eq!(budget.in_use(), 0, "given back before the drop");
        drop(reservation);
        assert_eq!((budget.in_use(), budget.peak()), (0, 0));
    }

    #[test]
    fn nothing_fits_even_past_the_limit() {
        let budget = Budget::new(100);
        budget.charge(120);
        assert!(budget.reserve(1).is_none());
        let nothing = budget.try_reserve(0).expect("takes no byte");
        nothing.commit();
        assert_eq!(budget.in_use(), 120, "counted nothing");
    }

    #[test]
    fn reserve_refuses_what_does_not_fit_and_changes_nothing() {
        let budget = Budget::new(100);
        budget.try_reserve(70).unwrap().commit();
        assert!(budget.reserve(31).is_none());
        assert!(
            budget.reserve(usize::MAX).is_none(),
            "an overflow is refused"
        );
        assert_eq!((budget.in_use(), budget.peak()), (70, 70));
        // The same refusal through `try_reserve` reports what it compared.
        assert!(matches!(
            budget.try_reserve(31),
            Err(ResourceError::BudgetExceeded {
                requested: 31,
                limit: 100,
                in_use: 70
            })
        ));
    }
}
