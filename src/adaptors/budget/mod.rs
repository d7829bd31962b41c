//! Budget: one byte limit shared by several resources, on one or many
//! devices.
//!
//! # What is counted
//!
//! Device bytes: what the layers below each [`BudgetResource`] hold on the
//! device (its inner resource's
//! [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding)),
//! never the callers' requests, and the physical memory a tier above maps
//! on the device the budget lends it (see "Lending the device" below).
//! A request is admitted by what it will take
//! from the device, and refused with that number
//! ([`BudgetExceeded`](crate::ResourceError::BudgetExceeded)`{ requested,
//! limit, in_use }`, the operands of the comparison that failed).
//!
//! # State
//!
//! - A [`Budget`] handle (cloneable, an `Arc` inside) holds the limit and the
//!   bytes counted against it, `in_use`, plus the highest `in_use` seen,
//!   and the list of resources to ask for idle memory
//!   ([`Budget::release_idle`]).
//! - Each [`BudgetResource`] keeps `charged`: the bytes it has counted
//!   against the budget and not yet given back.
//!
//! # Who adds, who drains
//!
//! [`allocate`](crate::DeviceMemoryResource::allocate) reserves what the
//! allocation will take from the device — the inner resource's
//! [`allocation_cost`](crate::DeviceMemoryResource::allocation_cost): the
//! request for a plain resource, the rounded size below a cache, nothing for
//! a cache hit — with a compare-and-swap loop *before* asking the inner
//! resource, so that racing threads can never push `in_use` past the limit,
//! and gives the reservation back if the inner allocation fails (a
//! [`BudgetReservation`] is released when dropped uncommitted). Afterwards it
//! counts what the inner resource really holds: below a cache, whose cost
//! is a guess, that may differ from the reservation (see "A budget above
//! a cache" for what the budget admits before the cache creates it, and
//! the one case a top-up still takes the count past the limit). An
//! allocation that costs nothing (a
//! cache hit, or a block on pages the cache has mapped already) is
//! admitted even while `in_use` is past the limit: it takes no byte from
//! the device, and refused, it would wait for the memory to be given
//! back, which a live block on the same physical handle prevents: a
//! reservation, giving its own first block back at each refusal, waited
//! for good.
//!
//! # A budget above a cache
//!
//! Over a cache the cost is a guess, made before the block is placed and
//! under no lock the placement holds: the free range it counted may go
//! to another thread first (the loser grows), the placement may refuse a
//! range the cost counted (another stream's free, under
//! [`CrossStreamReuse::Done`](crate::CrossStreamReuse::Done)), and a growth
//! maps pages ahead of its block (its slack) on the block's own handle,
//! which no relief can give back while the block lives. Counted after the
//! fact, each of these took the cache past the limit and kept it there as
//! long as the pages stayed mapped (16 reserved requests under 16 MiB
//! ended at 18 MiB in about one run in ten). So the rule:
//!
//! - **What the cache's arena creates is admitted before it is created.**
//!   Around its inner allocation the budget enters a gate
//!   (`util/growth_gate.rs`, a thread-local): each growth takes what the
//!   allocation reserved first, then reserves the rest from the budget,
//!   after settling what the arena's idle mappings gave back. A growth
//!   the budget refuses fails as one refused by a budget below the cache
//!   (the arena gives its idle mappings back and asks again, then serves
//!   from a range behind a wait or refuses with
//!   [`BudgetExceeded`](crate::ResourceError::BudgetExceeded)), and the
//!   map-ahead shrinks to what the budget admits. Hits enter the gate too:
//!   a hit the cost foresaw is the allocation that grows when it loses
//!   the race.
//! - **The cache never holds more than the limit because of an allocation
//!   through the budget**, and `in_use` never passes the limit for
//!   memory the arena maps. The budget counts free pages the arena has
//!   mapped (idle or ahead of a live block) as costing nothing: an
//!   allocation placed there is admitted even while `in_use` is at the
//!   limit, and a growth refused would wait for memory that a live block
//!   on the same handle keeps.
//! - **Where it can still pass the limit**: a cache without an arena (its
//!   size classes, or a request that bypasses the arena) allocates a
//!   class block from the layer below it without asking the gate; a
//!   racing thread that takes the cached block this one's cost expected
//!   makes it allocate a block more than it reserved, which is topped up
//!   past the limit and released with the block. Put the budget below the
//!   cache for a hard limit there.
//! - An allocation in progress is counted once: its reservation and its
//!   growths are *in flight* (in the budget, not yet in `charged`) until
//!   it returns, and a top-up by another thread, which reads what the
//!   cache holds with them included, charges only what no one counted.
//!
//! A refused reservation first asks every [`BudgetResource`] of the budget,
//! on every device, to give the idle memory below it back
//! ([`Budget::release_idle`]), then tries once more: memory a cache holds
//! idle anywhere under the budget serves the request, and what comes back
//! wakes the allocations waiting for it.
//!
//! So a budget composes with the layers below it in any order: it counts
//! what the device holds for them (live blocks, a cache's idle blocks, a
//! quarantine, frees not yet executed), and a dropped `BudgetResource`
//! gives the idle memory below it back, reaps, and releases all it charged
//! but blocks still live.
//!
//! A block stays counted until its free has *executed*, not merely been
//! queued: a burst of frees that the GPU has not reached yet cannot
//! oversubscribe the device. So `deallocate` gives nothing back by itself;
//! [`reap_pending`](crate::DeviceMemoryResource::reap_pending) and
//! [`reap_through`](crate::DeviceMemoryResource::reap_through) (and
//! `deallocate`, for inner resources that may free at once) *settle*: they
//! lower `charged` to the inner resource's
//! [`bytes_outstanding`](crate::DeviceMemoryResource::bytes_outstanding) and
//! release the difference, which is exactly what the inner drained, whoever
//! drained it (a quarantine flush below, a reaper above).
//!
//! # What the pair costs
//!
//! An allocation and its free through a budget over the stream-ordered
//! resource make two read-modify-writes: the reservation's compare-and-swap
//! on `in_use` and the addition to `charged` (and a third, to the budget's
//! peak, only while `in_use` climbs to a level it never reached). Nothing
//! more is read where nothing can have changed: below a layer whose
//! [`allocation_cost`](crate::DeviceMemoryResource::allocation_cost) is
//! exact the allocation took what was reserved, and below one whose frees
//! only queue
//! ([`frees_only_queue`](crate::DeviceMemoryResource::frees_only_queue))
//! a free leaves `bytes_outstanding` as it was, so neither reads it. The
//! counts stay exact: `charged` moves only by what an allocation was
//! charged and by what a settle saw drained, and every path that drains
//! (a reap, a release of idle or captured memory, a relief before a
//! refusal) settles. Over a cache, whose cost is a guess made before the
//! block is placed, one read after each allocation (of what the cache and
//! the layers below hold, and of `charged`) tops up or settles the
//! difference. Over a cache every allocation, hits included, also enters
//! and leaves the growth gate (two thread-local accesses), and one that
//! costs something moves its cost in and out of `in_flight` (two more
//! read-modify-writes, beside the driver calls of the growth it expects).
//!
//! The reservation is taken through a form that hands back the
//! reservation alone, no error beside it (`Budget::reserve`, in
//! registers), and the commit, the charge and the reconciling run from a
//! guard dropped after the inner resource's result has moved to the
//! caller (`SettleOnReturn` in `resource.rs`). A reservation taken with
//! its error beside it, and a commit done before the move, each cost a
//! copy through memory on every allocation (of the reservation, of the
//! block) whose loads the processor could not forward from its store
//! buffer: the larger part of what the decorators added to a pair. The
//! order of the counting is unchanged (commit, charge, reconcile, all
//! before `allocate` returns), and a refusal gives its reservation back
//! and settles as before.
//!
//! # Lending the device
//!
//! A cache above a budget builds its virtual-memory arena only on a device
//! lent to it ([`device_access`](crate::DeviceMemoryResource::device_access)).
//! A `BudgetResource` lends its inner resource's device with a charge
//! added ([`MappingCharge`](crate::MappingCharge), here `LentMappings`):
//! the arena charges the budget before it creates physical memory and
//! releases the bytes after it gives the memory back. So a budget below
//! the cache still sees every byte (its blocks through `charged`, the
//! arena's mappings straight in `in_use`), a growth it refuses fails with
//! [`BudgetExceeded`](crate::ResourceError::BudgetExceeded) as an
//! allocation would (after the arena gave back its own idle mappings),
//! and a mapping given back wakes the allocations waiting under the
//! budget, as a reaped block does. Under a full budget a miss is then a
//! placement in mapped memory, not a free and an allocation of the
//! driver's pool.
//!
//! The inner resource should be reached only through its `BudgetResource`:
//! bytes allocated around it are outstanding but not charged, and hold back
//! the release of as many charged bytes.

// The one `unsafe` is the resource's `unsafe impl DeviceMemoryResource`,
// which vouches for blocks and streams that are the inner resource's.
#![deny(unsafe_code)]

mod handle;
mod layer;
mod lend;
mod relief;
mod resource;

pub use handle::{Budget, BudgetReservation};
pub use layer::BudgetLayer;
pub use resource::BudgetResource;
