//! [`BudgetResource`]: the decorator that charges a [`Budget`].

use crate::forward_to_inner;

use std::sync::{Arc, Weak};

use super::{Budget, BudgetReservation};
use crate::error::ResourceResult;
use crate::gpu::CaptureId;
use crate::resource::BudgetRelief;
use crate::resource::DeviceMemoryResource;
use crate::resource::relief::{HolderRegistration, IdleHolder};
use crate::types::{AllocTag, CompletedUses, DeviceBlock, NeverUsed, StreamId};
use crate::util::growth_gate::{self, GrowthGate, Refused};
use crate::util::sync::{AtomicU64, AtomicUsize, Mutex, Ordering};
use crate::util::sync_drains;
use std::cell::Cell;

/// Charges a shared [`Budget`] for every byte of the inner resource, from
/// the allocation until its free has executed, and for every byte a tier
/// above (the cache's arena) maps on the device it lends
/// ([`device_access`](DeviceMemoryResource::device_access)), from before
/// the memory is created until after it is released.
///
/// The essay of `src/adaptors/budget/` says how bytes are given back.
///
/// # Examples
/// ```
/// use streamalloc::{Budget, BudgetResource};
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, ResourceError, SimResource};
///
/// let gpu = SimGpu::new();
/// let device = Device::simulated(&gpu, 1);
/// let s = device.stream(0)?;
/// let budget = Budget::new(1000);
/// let r = BudgetResource::new(SimResource::new(&device), &budget);
///
/// let block = r.allocate(800, s, AllocTag::UNTAGGED)?;
/// assert!(matches!(
///     r.allocate(800, s, AllocTag::UNTAGGED),
///     Err(ResourceError::BudgetExceeded { in_use: 800, .. })
/// ));
/// r.deallocate(block)?;
/// assert_eq!(budget.in_use(), 800, "the free is queued, not yet executed");
/// r.reap_pending()?;
/// assert_eq!(budget.in_use(), 0);
/// # Ok::<(), ResourceError>(())
/// ```
///
/// # Stream ordering
/// Bytes are released only once the inner resource reports their free as
/// executed, so the budget never counts memory the device still holds as
/// available.
#[derive(Debug)]
pub struct BudgetResource<R: DeviceMemoryResource> {
    /// Shared with the budget's relief (a weak reference), which asks the
    /// inner resource for idle memory when a request under the budget is
    /// refused.
    counted: Arc<Counted<R>>,
    /// Unregisters from the budget's relief when dropped.
    _holder: HolderRegistration,
}

/// The inner resource and what this resource counted against the budget.
#[derive(Debug)]
struct Counted<R> {
    inner: R,
    budget: Budget,
    /// Bytes this resource counted against the budget and has not given
    /// back; raised after a successful inner allocation, lowered by `settle`.
    charged: AtomicUsize,
    /// Settles begun, and settles that have read what the inner resource
    /// holds: an allocation that reads `settles_read` before it allocates
    /// and `settles_begun` after it charged knows whether a settle may have
    /// read `charged` without its charge and the inner count with its
    /// block (and so released too little: see `SettleOnReturn`).
    settles_begun: AtomicU64,
    settles_read: AtomicU64,
    /// Bytes counted in the budget for allocations in progress below a
    /// cache (their reservations, and what their growths took past them)
    /// and not yet in `charged`: what the cache holds may include them
    /// already, and a top-up that charged them too counted them twice
    /// (with two threads allocating, enough to take the budget's count,
    /// not the device, a page past its limit).
    in_flight: AtomicUsize,
    /// Held by a settle from lowering `charged` until the budget has the
    /// bytes back: a second settle waits (two atomic operations at most),
    /// so that when any settle returns, what it saw drained is released.
    settling: Mutex<()>,
}

impl<R: DeviceMemoryResource + 'static> BudgetResource<R> {
    /// Wraps `inner`, charging `budget`.
    pub fn new(inner: R, budget: &Budget) -> Self {
        let counted = Arc::new(Counted {
            inner,
            budget: budget.clone(),
            charged: AtomicUsize::new(0),
            settles_begun: AtomicU64::new(0),
            settles_read: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            settling: Mutex::new(()),
        });
        let weak: Weak<Counted<R>> = Arc::downgrade(&counted);
        let _holder = budget.register_holder(weak);
        BudgetResource { counted, _holder }
    }
}

impl<R: DeviceMemoryResource> BudgetResource<R> {
    /// The inner resource.
    pub fn inner(&self) -> &R {
        &self.counted.inner
    }

    /// The budget charged.
    pub fn budget(&self) -> &Budget {
        &self.counted.budget
    }

    /// Bytes this resource holds against the budget.
    pub fn charged(&self) -> usize {
        self.counted.charged.load(Ordering::Acquire)
    }
}

/// So that `forward_to_inner!` reaches the inner resource through the
/// field.
impl<R> std::ops::Deref for Counted<R> {
    type Target = R;

    fn deref(&self) -> &R {
        &self.inner
    }
}

impl<R: DeviceMemoryResource> IdleHolder for Counted<R> {
    /// Gives back what the stack below holds for no caller, reaps it when
    /// that is allowed to block, and settles.
    fn give_back_idle(&self) -> usize {
        let given = self.inner.release_idle().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "giving idle memory back for a refused request failed part way");
            0
        });
        // Blocks given back are queued frees: off a poll, reap them, as a
        // cache does for its own blocks when memory is full. Nothing is
        // reaped when nothing was idle, so a queued free of a caller still
        // holds its bytes until someone reaps (`RetryOnOomResource`, a reaper).
        if given > 0 {
            if !crate::util::poll_scope::in_poll() {
                if let Err(e) = self.inner.reap_pending() {
                    tracing::warn!(error = %e, "reaping idle memory given back failed");
                }
            } else {
                // Inside a poll nothing reaps: the futures layers over the
                // stacks give the queued frees completion points instead,
                // whose notifications reap them and release the budget.
                crate::waiters::frees_queued(self.budget.relief().scope());
            }
        }
        self.settle()
    }
}

impl<R: DeviceMemoryResource> Counted<R> {
    /// Lowers `charged` to what the inner resource still holds and releases
    /// the difference; returns the bytes released.
    ///
    /// `charged` is read before `bytes_outstanding`, and an allocation
    /// raises the inner's count
    /// before `charged`: so whenever the `charged` read includes an
    /// allocation, the outstanding read does too, and a race with an
    /// allocation can only delay a release (to the next settle), never
    /// release bytes that are still held.
    ///
    /// Settles are serialized by `settling`, held from the read of `charged`
    /// until the budget has the bytes back: a settle that raced another
    /// used to see `charged` already lowered and return while the budget
    /// still counted the bytes (so `reap_pending().await` could resolve with
    /// `Budget::in_use` above what is outstanding, and a waiter could miss
    /// its wake-up). The lock is held across two loads and two atomic
    /// updates, never across a driver call.
    ///
    /// An allocation that raises both counts between the two reads (its
    /// block counted below, its charge not yet) leaves `charged` above
    /// what is held once it charges: it sees the settle's `settles_begun`
    /// and settles again (`SettleOnReturn`).
    fn settle(&self) -> usize {
        let _settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        self.settles_begun.fetch_add(1, Ordering::AcqRel);
        // A read-modify-write, not a load: an allocation whose charge
        // comes after it in `charged`'s order then sees the `settles_begun`
        // above (release sequence), with no total order needed.
        let charged = self.charged.fetch_add(0, Ordering::AcqRel);
        let outstanding = self.inner.bytes_outstanding();
        self.settles_read.fetch_add(1, Ordering::AcqRel);
        if outstanding >= charged {
            return 0;
        }
        // Only allocations raise `charged` meanwhile (settles and top-ups
        // wait): a CAS
        // would retry for them, a subtraction needs no retry.
        let released = charged - outstanding;
        self.charged.fetch_sub(released, Ordering::AcqRel);
        self.budget.release(released);
        released
    }
}

impl<R: DeviceMemoryResource> Counted<R> {
    /// After a free through an inner resource whose frees may lower what it
    /// holds at once (a synchronous resource, a capped cache): settles only
    /// when the inner resource now holds less than was charged, with no
    /// lock otherwise. An inner resource whose frees only queue
    /// ([`frees_only_queue`](DeviceMemoryResource::frees_only_queue): the
    /// stream-ordered resource, an uncapped cache over it) cannot hold less
    /// because of the free, so the free does not even look: the bytes
    /// leave the count when a reap drains them, and that reap, through
    /// this resource or any of its settles, releases them. Skipping is
    /// safe either way: whatever drains bytes meanwhile (a reap, a
    /// release) settles them itself, and a refused allocation asks for
    /// idle memory, which settles, before it refuses.
    #[inline]
    fn settle_after_free(&self) {
        if !self.inner.frees_only_queue()
            && self.inner.bytes_outstanding() < self.charged.load(Ordering::Acquire)
        {
            self.settle();
        }
    }

    /// After an allocation whose cost was a guess: tops `charged` up when
    /// the inner resource holds more (it took more than its cost), settles
    /// when it holds less (it took less, or the layers below drained
    /// bytes). One read of each when they agree (a cache hit, the pair's
    /// path over a cache), and no lock: `top_up` and `settle` read again
    /// under theirs, so this read only spares them when there is nothing
    /// to do; a change after it is another call's to settle (as in
    /// `settle_after_free`).
    #[inline]
    fn reconcile(&self) {
        let outstanding = self.inner.bytes_outstanding();
        let charged = self.charged.load(Ordering::Acquire);
        if outstanding > charged {
            self.top_up();
        } else if outstanding < charged {
            self.settle();
        }
    }

    /// After a reservation was refused: idle memory anywhere under the
    /// budget (a cache below this resource or below another one of the
    /// budget, on any device) may serve the request. Asks for it, then
    /// reserves once more at what the allocation costs now (a trim below
    /// may have turned a hit into a miss); returns the reservation and
    /// that cost. Out of line: the pair's path only checks for it.
    #[cold]
    #[inline(never)]
    fn reserve_after_relief(
        &self,
        bytes: usize,
        stream: StreamId,
    ) -> ResourceResult<(BudgetReservation<'_>, usize)> {
        self.budget.release_idle_for(Some(stream.pool()));
        let cost = self.inner.allocation_cost(bytes, stream);
        Ok((self.budget.try_reserve(cost)?, cost))
    }

    /// Raises `charged` to what the inner resource holds when an allocation
    /// took more than its estimated cost (a race over a cached block), so
    /// that the budget never counts less than the device holds. It may pass
    /// the limit by that difference until the blocks are freed.
    fn top_up(&self) {
        // Serialized with `settle`: neither sees the other half done.
        let _settling = self.settling.lock().unwrap_or_else(|p| p.into_inner());
        let mut charged = self.charged.load(Ordering::Acquire);
        loop {
            let outstanding = self.inner.bytes_outstanding();
            // Read after `outstanding`: an allocation in progress leaves
            // `in_flight` only once `charged` holds it.
            let counted = charged.saturating_add(self.in_flight.load(Ordering::Acquire));
            if outstanding <= counted {
                return;
            }
            let missing = outstanding - counted;
            match self.charged.compare_exchange(
                charged,
                charged + missing,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    self.budget.charge(missing);
                    return;
                }
                Err(now) => charged = now,
            }
        }
    }
}

/// Settles an allocation's reservation when dropped, which is after the
/// allocation's result has moved to the caller's return place: commits it
/// and charges its cost when the inner resource made the block, gives it
/// back (and settles) when it refused.
///
/// Done while the result still lay in a local, the charging's atomic
/// updates came between the inner resource's write of the block and its
/// move out, and the compiler, unable to tell that they miss the caller's
/// return place, had the block written into a local and copied it (80
/// bytes) after them on every allocation. From here, nothing comes
/// between, and the block is written where the caller wants it.
struct SettleOnReturn<'a, R: DeviceMemoryResource> {
    counted: &'a Counted<R>,
    /// Committed or given back in place by the drop (a reservation taken
    /// out of an `Option` went through memory, two stores read back as
    /// one load).
    reservation: BudgetReservation<'a>,
    cost: usize,
    bytes: usize,
    /// Whether the inner resource made the block.
    made: bool,
    /// What the growths of the inner allocation took past the
    /// reservation (see `AllocationGate`); `None` below layers whose
    /// cost is exact, which enter no gate.
    gate: Option<&'a AllocationGate<'a, R>>,
    /// [`sync_drains::now`] before the inner allocation: a synchronous
    /// reap below it since (a relief, a retry) drained behind this budget.
    drains: u64,
    /// `settles_read` before the inner allocation (see `Counted::settle`).
    settles: u64,
}

/// The gate (`util::growth_gate`) an allocation through the budget puts
/// in front of the growths of a cache below: a growth takes what the
/// allocation reserved first, then asks the budget for the rest, before
/// any memory is created. So what the cache holds after the allocation
/// is never more than the budget admitted, whatever its cost guessed (a
/// free range another thread took first, one the placement may not use,
/// the pages mapped ahead).
struct AllocationGate<'a, R> {
    counted: &'a Counted<R>,
    /// Bytes of the allocation's reservation no growth has taken.
    reserved_left: Cell<usize>,
    /// Bytes growths took past the reservation: counted in the budget
    /// already, added to `charged` with the allocation.
    extra: Cell<usize>,
}

impl<R: DeviceMemoryResource> GrowthGate for AllocationGate<'_, R> {
    fn room(&self) -> usize {
        self.reserved_left
            .get()
            .saturating_add(self.counted.budget.available())
    }

    fn try_take(&self, bytes: usize) -> Result<(), Refused> {
        let left = self.reserved_left.get();
        let more = bytes.saturating_sub(left);
        if more > 0 {
            let budget = &self.counted.budget;
            let reservation = match budget.try_reserve(more) {
                Ok(reservation) => reservation,
                Err(_) => {
                    // The arena gives its idle mappings back before it
                    // asks again: they leave the count here, not at the
                    // next settle.
                    self.counted.settle();
                    budget.try_reserve(more).map_err(|_| Refused {
                        requested: more,
                        limit: budget.limit(),
                        in_use: budget.in_use(),
                    })?
                }
            };
            reservation.commit();
            self.counted.in_flight.fetch_add(more, Ordering::AcqRel);
            self.extra.set(self.extra.get() + more);
        }
        self.reserved_left.set(left.saturating_sub(bytes));
        Ok(())
    }

    fn give_back(&self, bytes: usize) {
        self.reserved_left.set(self.reserved_left.get() + bytes);
    }
}

impl<R: DeviceMemoryResource> Drop for SettleOnReturn<'_, R> {
    #[inline(always)]
    fn drop(&mut self) {
        let (c, cost) = (self.counted, self.cost);
        // Growths past the reservation were admitted and counted in the
        // budget as they happened: they join `charged` (a surplus, memory
        // admitted and not created, is settled below).
        let (extra, grew) = self.gate.map_or((0, false), |gate| {
            let extra = gate.extra.get();
            (extra, extra != 0 || gate.reserved_left.get() < cost)
        });
        if extra != 0 {
            c.charged.fetch_add(extra, Ordering::AcqRel);
        }
        // Below a cache the reservation and the growths were in flight
        // (see `Counted::in_flight`): they leave it once `charged` holds
        // them, or as the reservation is given back.
        let in_flight = if self.gate.is_some() { cost + extra } else { 0 };
        if !self.made && !grew {
            if in_flight != 0 {
                c.in_flight.fetch_sub(in_flight, Ordering::AcqRel);
            }
            self.reservation.release_in_place();
            // The layers below may have given memory back while refusing
            // (a budget below asked its caches for idle memory): it
            // leaves this budget now, not at a later call.
            c.settle();
            return;
        }
        // A refusal after a growth (the cache keeps the pages it mapped,
        // idle) keeps the reservation counted too: the settle releases
        // what the cache does not hold.
        self.reservation.commit_in_place();
        // A cache hit costs nothing: no read-modify-write for it.
        if cost != 0 {
            c.charged.fetch_add(cost, Ordering::AcqRel);
        }
        if in_flight != 0 {
            c.in_flight.fetch_sub(in_flight, Ordering::AcqRel);
        }
        if !self.made {
            c.settle();
            return;
        }
        // A layer below that does its own accounting (a cache) estimated
        // the cost before allocating: another thread may have taken the
        // cached block this one expected (it took more) or left one (it
        // took less), and the arena may place the block across one page
        // more than it guessed, even when the guess equals `bytes`. Count
        // what the inner resource holds now. Below layers whose cost is
        // exact the charge is exact, and there is no top-up:
        // `bytes_outstanding` sums per-shard counts one load at a time, so
        // under concurrent allocations and reaps on other streams it may
        // read high, and topping up from such a read charged bytes nobody
        // held (with 16 threads allocating, enough to take the budget's
        // peak past its limit).
        //
        // Below layers whose cost is exact, the allocation took what was
        // charged. It settles once more when, since it began, a settle may
        // have read `charged` without this charge and the inner count with
        // this block (it released too little; `Counted::settle`), or a
        // synchronous reap below drained behind this resource (a budget
        // below relieved, a retry layer reaped: nothing of that passed
        // through here; `util::sync_drains`). Otherwise what the layers
        // below drain leaves at the next reap or release through this
        // resource, or the next free through it where frees may drain
        // (see `settle_after_free`).
        if cost != self.bytes || self.gate.is_some() {
            c.reconcile();
        } else if c.settles_begun.load(Ordering::Acquire) != self.settles
            || sync_drains::now() != self.drains
        {
            c.settle();
        }
    }
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it, counted.
#[allow(unsafe_code)]
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for BudgetResource<R> {
    /// The inner resource's device, lent with this budget's charge: a
    /// tier above that maps memory itself (the cache's arena) charges the
    /// budget for every byte it creates, and releases it once the memory is
    /// given back (see "Lending the device" in the module's essay).
    fn device_access(&self) -> Option<crate::resource::DeviceAccess> {
        let access = self.counted.inner.device_access()?;
        let pool = access.streams.id(0).map(StreamId::pool);
        let charge = super::lend::LentMappings {
            budget: self.counted.budget.clone(),
            pool,
        };
        Some(access.with_charge(std::sync::Arc::new(charge)))
    }

    forward_to_inner!(counted; device_ordinal, bytes_outstanding, pending_free_seq, supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, block_state, allocation_cost, allocation_cost_is_exact, frees_across_streams, frees_only_queue, capture_status, begin_sleep, settle_sleep, wake);

    /// Adds the budget (its limit, and what every resource sharing it
    /// counts), then the layers below.
    fn snapshot_into(&self, snapshot: &mut crate::observe::MemorySnapshot) {
        let budget = &self.counted.budget;
        snapshot.budgets.push(crate::observe::BudgetInfo {
            limit: budget.limit(),
            in_use: budget.in_use(),
        });
        self.counted.inner.snapshot_into(snapshot);
    }

    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn std::any::Any)) {
        visit(&self.counted.budget);
        self.counted.inner.visit_layers(visit)
    }
    /// Reserves what the allocation will take from the device (the inner
    /// resource's [`allocation_cost`](DeviceMemoryResource::allocation_cost):
    /// `bytes`, the rounded size below a cache, nothing for a cache hit),
    /// then allocates from the inner resource.
    ///
    /// # Errors
    /// [`BudgetExceeded`](crate::ResourceError::BudgetExceeded) before the
    /// inner resource is asked, with the numbers the budget compared: its
    /// `requested` is that cost in device bytes (2 MiB for a 4 KiB request
    /// that needs a new page of a cache's arena), not `bytes`. Any error of
    /// the inner allocation, after the reservation is given back. Nothing
    /// changes either way.
    #[inline]
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let c = &*self.counted;
        let mut cost = c.inner.allocation_cost(bytes, stream);
        // Dropped on the error path (or a panic below): the bytes go back.
        // A refusal reports the numbers compared: `cost` (device bytes, a
        // cache's page where the caller asked for less), never `bytes`.
        let reservation = match c.budget.reserve(cost) {
            Some(reservation) => reservation,
            None => {
                let (reservation, now) = c.reserve_after_relief(bytes, stream)?;
                cost = now;
                reservation
            }
        };
        // Below a layer whose cost is a guess (a cache), every growth
        // the allocation makes passes this budget's gate before memory is
        // created (see `AllocationGate`), hits included: a hit the cost
        // foresaw may find its range taken by another thread, and grow.
        if c.inner.allocation_cost_is_exact() {
            let drains = sync_drains::now();
            let settles = c.settles_read.load(Ordering::Acquire);
            let result = c.inner.allocate(bytes, stream, tag);
            // Committed or given back by a guard, after the result has
            // moved to the caller (see `SettleOnReturn`).
            let _settle = SettleOnReturn {
                counted: c,
                reservation,
                cost,
                bytes,
                made: result.is_ok(),
                gate: None,
                drains,
                settles,
            };
            return result;
        }
        if cost != 0 {
            c.in_flight.fetch_add(cost, Ordering::AcqRel);
        }
        let gate = AllocationGate {
            counted: c,
            reserved_left: Cell::new(cost),
            extra: Cell::new(0),
        };
        let link = growth_gate::Link::new(&gate);
        let entered = growth_gate::enter(&link);
        let result = c.inner.allocate(bytes, stream, tag);
        drop(entered);
        let _settle = SettleOnReturn {
            counted: c,
            reservation,
            cost,
            bytes,
            made: result.is_ok(),
            gate: Some(&gate),
            drains: 0,
            settles: 0,
        };
        result
    }

    /// This budget's limit, or a tighter one below it: no single
    /// allocation can take more.
    fn allocation_limit(&self) -> Option<usize> {
        let own = self.counted.budget.limit();
        Some(
            self.counted
                .inner
                .allocation_limit()
                .map_or(own, |below| below.min(own)),
        )
    }

    /// The inner resource's, and this budget's.
    fn budget_reliefs(&self, out: &mut Vec<BudgetRelief>) {
        self.counted.inner.budget_reliefs(out);
        let own = self.counted.budget.relief();
        if !out.contains(own) {
            out.push(own.clone());
        }
    }

    #[inline]
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.counted.inner.deallocate(block)?;
        // A stream-ordered inner still counts the bytes (the free is only
        // queued) and nothing is released; a synchronous one freed them.
        self.counted.settle_after_free();
        Ok(())
    }

    #[inline]
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        self.counted.inner.deallocate_completed(block, completed)?;
        self.counted.settle_after_free();
        Ok(())
    }

    #[inline]
    fn deallocate_unused(&self, block: DeviceBlock, unused: NeverUsed) -> ResourceResult<()> {
        self.counted.inner.deallocate_unused(block, unused)?;
        self.counted.settle_after_free();
        Ok(())
    }

    /// Passes the call on, then settles: memory given back at once (a
    /// cache's unmapped pages) leaves the budget now, queued frees when
    /// they are reaped.
    fn release_idle(&self) -> ResourceResult<usize> {
        let result = self.counted.inner.release_idle();
        // What was given back stays given back even when a later free failed.
        self.counted.settle();
        result
    }

    fn reap_pending(&self) -> ResourceResult<()> {
        let result = self.counted.inner.reap_pending();
        // What was drained stays drained even when the reap failed part way.
        self.counted.settle();
        result
    }

    /// Passes the call on, then releases what the layers below gave back
    /// (a cache may give idle graph memory back at once; the stream-ordered
    /// resource counts the graph's frees as pending until they are reaped).
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        let result = self.counted.inner.release_capture(capture, after);
        // What was returned stays returned even when the call failed part
        // way.
        self.counted.settle();
        result
    }

    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        let drained = self.counted.inner.reap_through(stream, seq);
        // Settle even when this call drained nothing: a layer below may have
        // freed on its own (a quarantine flush on a synchronous backend).
        self.counted.settle();
        drained
    }
}

impl<R: DeviceMemoryResource> Drop for BudgetResource<R> {
    /// Gives back what the stack below holds for no caller (a cache's idle
    /// blocks, a quarantine), reaps, and releases every byte that left the
    /// device: nothing stays charged for a resource that is gone, except
    /// blocks still live below it (leaked by a caller, or held through
    /// another handle of the inner resource).
    fn drop(&mut self) {
        if self.charged() == 0 {
            return;
        }
        let given_back = self.counted.inner.release_idle();
        let reaped = self.counted.inner.reap_pending();
        if let Err(e) = given_back.and(reaped) {
            tracing::warn!(error = %e, "budget resource dropped: some bytes stay charged");
        }
        self.counted.settle();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize as LoomUsize;

    use super::*;
    use crate::error::ResourceError;

    /// An inner resource that is nothing but its outstanding count.
    #[derive(Debug)]
    struct Outstanding(LoomUsize);

    // SAFETY: its blocks name no memory, and the models only count them:
    // nothing dereferences or frees one.
    #[allow(unsafe_code)]
    unsafe impl DeviceMemoryResource for Outstanding {
        fn allocate(
            &self,
            bytes: usize,
            s: StreamId,
            tag: AllocTag,
        ) -> ResourceResult<DeviceBlock> {
            self.0.fetch_add(bytes, Ordering::AcqRel);
            let id = crate::BlockId::new(crate::types::ResourceId::fresh(), 1);
            Ok(DeviceBlock::new(id, 0, bytes, s, tag))
        }
        fn deallocate(&self, _: DeviceBlock) -> ResourceResult<()> {
            Err(ResourceError::Shutdown)
        }
        fn device_ordinal(&self) -> u32 {
            0
        }
        fn bytes_outstanding(&self) -> usize {
            self.0.load(Ordering::Acquire)
        }
        fn reap_pending(&self) -> ResourceResult<()> {
            Ok(())
        }
        fn pending_free_seq(&self, _: StreamId) -> u64 {
            0
        }
        fn reap_through(&self, _: StreamId, _: u64) -> usize {
            0
        }
        fn supports_block_use_tracking(&self) -> bool {
            false
        }
        fn record_block_use(&self, _: &DeviceBlock, _: StreamId) -> ResourceResult<()> {
            Ok(())
        }
        fn prepare_block_use(
            &self,
            _: crate::BlockId,
            _: StreamId,
            _: crate::Access,
        ) -> ResourceResult<()> {
            Ok(())
        }
        fn finish_block_use(
            &self,
            _: crate::BlockId,
            _: StreamId,
            _: crate::Access,
        ) -> ResourceResult<()> {
            Ok(())
        }
        fn allocation_cost(&self, bytes: usize, _: StreamId) -> usize {
            bytes
        }
        fn allocation_cost_is_exact(&self) -> bool {
            true
        }
        fn release_idle(&self) -> ResourceResult<usize> {
            Ok(0)
        }
        fn frees_across_streams(&self) -> bool {
            false
        }
        fn allocation_limit(&self) -> Option<usize> {
            None
        }
        fn budget_reliefs(&self, _: &mut Vec<crate::resource::BudgetRelief>) {}
        fn capture_status(&self, _: StreamId) -> ResourceResult<crate::gpu::CaptureStatus> {
            Ok(crate::gpu::CaptureStatus::None)
        }
        fn release_capture(&self, _: crate::gpu::CaptureId, _: StreamId) -> ResourceResult<()> {
            Ok(())
        }
    }

    /// A reaper drains 20 B and settles while a waiter that saw them
    /// drained settles too: once the waiter's settle returns, the budget
    /// has them back (the old CAS-then-release settle returned early).
    #[test]
    fn racing_settles_release_before_either_returns() {
        loom::model(|| {
            let budget = Budget::new(20);
            let r = Arc::new(BudgetResource::new(
                Outstanding(LoomUsize::new(20)),
                &budget,
            ));
            budget.try_reserve(20).unwrap().commit();
            r.counted.charged.store(20, Ordering::Release);
            let reaper = {
                let r = r.clone();
                loom::thread::spawn(move || {
                    r.counted.inner.0.fetch_sub(20, Ordering::AcqRel);
                    r.counted.settle();
                })
            };
            let seen = r.counted.inner.bytes_outstanding();
            r.counted.settle();
            if seen == 0 {
                assert_eq!(budget.in_use(), 0, "a settle returned before the release");
                assert!(
                    budget.try_reserve(20).is_ok(),
                    "the waiter cannot have its bytes"
                );
            }
            reaper.join().unwrap();
            assert_eq!(budget.in_use(), 0);
            assert_eq!(r.charged(), 0);
        });
    }

    /// A reaper drains 20 B and settles while an allocation of 1 B runs:
    /// the settle may read `charged` before the allocation's charge and
    /// the inner count after its block. Once both returned, the budget
    /// counts exactly the 1 B held (it counted 2: the settle released one
    /// byte too few, and nothing settled again).
    #[test]
    fn a_settle_racing_an_allocation_leaves_the_count_exact() {
        loom::model(|| {
            let budget = Budget::new(40);
            let r = Arc::new(BudgetResource::new(
                Outstanding(LoomUsize::new(20)),
                &budget,
            ));
            budget.try_reserve(20).unwrap().commit();
            r.counted.charged.store(20, Ordering::Release);
            let reaper = {
                let r = r.clone();
                loom::thread::spawn(move || {
                    r.counted.inner.0.fetch_sub(20, Ordering::AcqRel);
                    r.counted.settle();
                })
            };
            let stream = StreamId::new(0, 0);
            let block = r.allocate(1, stream, AllocTag::UNTAGGED).unwrap();
            reaper.join().unwrap();
            assert_eq!(r.charged(), 1);
            assert_eq!(budget.in_use(), 1);
            drop(block);
        });
    }
}
