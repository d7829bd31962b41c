//! The caching tier: a stream-ordered cache in front of any stream-ordered
//! resource, holding little more than what is live.
//!
//! The driver's pool costs 0.65–0.88 µs per allocate + free pair on one
//! thread and gets *slower* as threads are added (see `docs/DESIGN.md`, "What the
//! hardware costs"). [`CachingResource`] hands memory out again with no
//! driver call at all, per stream, which is what makes allocation scale
//! with threads. It has two ways of holding memory.
//!
//! # The virtual-memory arena (the default where the device has one)
//!
//! - **Shared by every stream** (behind the tier's lock): one reserved
//!   range of addresses (twice the device's memory,
//!   `cuMemAddressReserve`), an arena placing blocks in it (good fit with
//!   splitting and merging, TLSF-style buckets: bounded work per call),
//!   where each free range remembers, per stream, the newest free on it;
//!   a page table (which 2 MiB pages are mapped, how many live blocks
//!   touch each) and, per stream, fences (events telling when the GPU is
//!   done with what that stream freed).
//! - **Per stream** (in its shard, behind its own lock): the blocks it
//!   freed last (up to 8, of up to 16 MiB), taken back by an allocation
//!   of one of their sizes with no other lock, so a loop on one stream
//!   never contends; kept only while the stream's sizes repeat (14 of
//!   its last 32 allocations), since blocks held out of the arena are
//!   ones the next placements go around.
//! - **Counters**: physical bytes held (one atomic, written only when
//!   memory is mapped or given back), the high-water mark of live bytes.
//! - `allocate` places the block; pages it touches that are mapped are
//!   used as they are (a **hit**: no driver call); when some are not, a
//!   free range with memory behind it serves instead: first one this
//!   stream freed (or a clean one), then, when none fits, one another
//!   stream freed (a **borrow**), ordered after that free with no wait
//!   where the host saw the work before it done (a fence, or the stream
//!   idle), else behind a wait of this stream *on the GPU* for a fence
//!   past the free (`cuStreamWaitEvent`, no host wait). Once other
//!   streams wait on a stream's frees, each of its frees gets a fence
//!   right after it, so that this stream's next work runs after the work
//!   the other stream queued before the free, and none of what it queued
//!   after (the first such borrow records its fence when it comes). Which range
//!   serves never depends on how far the GPU is behind (see "Decisions
//!   the GPU's timing does not change" in `arena/vmm.rs`): the simulated
//!   replay of a trace holds what a GPU holds. Under
//!   [`CrossStreamReuse::Done`] no stream waits on another for memory:
//!   another stream's free serves only once a fence past it was queried
//!   complete, else the stream grows, as PyTorch's allocator does (for
//!   servers whose streams run concurrently; placement then depends on
//!   the GPU's timing, so it is not the default). Else the
//!   pages not mapped get new memory, one `cuMemCreate` + `cuMemMap` +
//!   `cuMemSetAccess` per run of pages (a **miss**; made with the tier's
//!   lock released, the pages marked pending meanwhile so that no other
//!   block or growth uses them), which also maps the
//!   free pages after the block up to [`CacheConfig::slack_percent`] over
//!   the live high-water mark, so that a growing workload grows in a few
//!   geometric steps. A new mapping that would take the cache past that is
//!   preceded by giving back idle mappings the GPU is done with (unmap and
//!   release), those idle since before the previous growth. Physical memory is fungible: freed to the device, created
//!   again where it is needed.
//! - `deallocate` puts the range back in the arena; pages no live block
//!   touches stay mapped, idle, until reused in place or given back.
//!   [`deallocate_completed`](crate::DeviceMemoryResource::deallocate_completed)
//!   (an owned buffer dropped after the completion of its last launch
//!   settled, through [`AsyncResource`](crate::AsyncResource))
//!   puts it back **clean**: the GPU is done with it, so every stream
//!   takes it as it is, with no fence and no borrow. A service whose
//!   requests await their work before dropping their buffers never makes
//!   one stream wait on another's queue for memory.
//! - [`trim`](CachingResource::trim) gives back every idle mapping the GPU
//!   is done with, without waiting (a fence is recorded for the others, so
//!   a later trim finds them). Before an allocation fails for lack of
//!   memory, every idle mapping is given back, waiting for the fences in
//!   flight as the last resort.
//!
//! # Size classes (backends without virtual memory, or
//! [`CacheConfig::virtual_memory`] off)
//!
//! - **Shards, one per stream**, each with **free lists per size class**
//!   ([`SizeClass`]: powers of two cut in four steps, from 512 B) and the
//!   **leases** (the inner block behind each of the cache's
//!   [`BlockId`](crate::BlockId)s, in a slab the id indexes: no hashing).
//! - **The cap reservation**: one atomic counter, the sum of the parts of
//!   [`CacheConfig::max_cached_bytes`] the shards hold.
//! - `allocate` drains: the stream's own list (a **hit**); a block of the
//!   same class cached on another stream (a **steal**, behind an event
//!   wait); the inner resource at the class size (a **miss**). On
//!   out-of-memory every cached block is given back and the request tried
//!   again. Requests above [`CacheConfig::max_block_size`] **bypass** the
//!   cache.
//!
//! Zero-byte requests and streams without a shard bypass both.
//!
//! # Stream ordering
//!
//! - **Reuse on the freeing stream `S`** needs nothing: the new user's work
//!   is queued on `S` after the old user's. This is CUDA's own rule for a
//!   free followed by an allocation on one stream.
//! - **Uses on other streams** are tracked with events (the arena keeps
//!   them per lease; size-class blocks forward the hooks to the inner
//!   block). When the lease ends, `S` waits for them, so the freed memory
//!   is again ordered on `S` alone.
//! - **Moving memory to another stream** `T`: an arena range freed on
//!   `S` serves `T` where it is, with no wait once the host saw the work
//!   `S` queued before the free done (a fence recorded on `S` after the
//!   free completed, or `S` with nothing left to run), else behind `T`'s
//!   wait on the GPU for a fence recorded on `S` past the free (right
//!   after it once streams borrow from `S`, so not behind `S`'s later
//!   work); never because nothing said it was busy. `T`'s later free tags the range with `T`, whose stream order
//!   includes the wait. A mapping is unmapped only once the
//!   fences past every free on it have completed (never waited for on
//!   the allocation path except before out of memory), so no queued work
//!   can touch it. A size-class block moves behind an event recorded on
//!   `S` that the new stream waits on.
//!
//! A use on another stream without the hooks is still a race, and the
//! simulated device still reports it: the cache adds no waits of its own
//! beyond the ones above.
//!
//! # Graph capture
//!
//! Memory handed out on a stream while it is being captured into a CUDA
//! graph, and memory freed on one, belongs to the capture's graph: every
//! replay touches it at the addresses the capture saw. The shard keeps it
//! in the capture's pool (see `graph/pool.rs`), reused by later allocations
//! of the same capture on the same stream, never by anyone else, and
//! never trimmed, until
//! [`release_capture`](crate::DeviceMemoryResource::release_capture) says
//! the graph is gone: the stream then waits for an event recorded where the
//! replays ran, and the memory is freed there, as any free. No fence is
//! recorded, no block moved and nothing trimmed on a capturing stream.
//! Every replay writes the arena ranges the capture handed out without a
//! hook seeing it, so a use of one on another stream than the last
//! replay's first waits for that stream (the ledger of the device's pool
//! says where the last launch ran); at the release, the stream that
//! ordered itself after the last replay becomes the last write of each such
//! range users still hold.
//!
//! # Failure
//!
//! Bad input (a foreign block, a stale or unknown id, a stream of another
//! device, a descriptor that does not match its lease) is refused before
//! anything changes. A driver error in a hook or a free leaves the lease as
//! it was; a failed mapping gives the range back and reports the error.
//!
//! # Layout
//!
//! The two allocators are two types, each in its folder: the arena tier
//! ([`ArenaTier`](arena::tier::ArenaTier), `arena/`: the shared
//! [`VirtualArena`](arena::vmm::VirtualArena), its placement, pages,
//! fences and the blocks each stream keeps) and the size-class tier
//! ([`SizeClassTier`](size_class::tier::SizeClassTier), `size_class/`).
//! The graph pools are in `graph/`. Both tiers keep their leases in the
//! cache's [`Shards`](shards::Shards) (one [`Slot`](shard::Slot) per
//! stream, a generation-checked slab of leases in each), which every call
//! of a tier is given; [`CachingResource`] owns the shards, the inner
//! resource and both tiers, and only dispatches (`resource.rs`). Nothing in
//! a tier imports the cache above it.
//!
//! # Life of a free
//!
//! From [`deallocate`](crate::DeviceMemoryResource::deallocate) to memory
//! another allocation may take, one function per step:
//!
//! 1. [`CachingResource::free`](resource::CachingResource::free) (also
//!    behind
//!    [`deallocate_completed`](crate::DeviceMemoryResource::deallocate_completed))
//!    finds the lease by the block's serial
//!    ([`Shards::locate`](shards::Shards::locate),
//!    [`Shard::lease_entry`](shard::Shard::lease_entry)), refuses a block
//!    that does not match it, finds the graph that owns the memory, if
//!    any, and hands the free to the lease's tier. A lease that bypassed
//!    the cache goes to the inner resource's `deallocate` as it is.
//! 2. An arena lease:
//!    1. [`ArenaTier::free`](arena::tier::ArenaTier::free): the lease's
//!       stream waits for the uses recorded on other streams (a lease used
//!       on its own stream only skips this step);
//!    2. [`Shard::end_arena_lease`](shard::Shard::end_arena_lease): the
//!       lease leaves the shard;
//!    3. [`ArenaTier::release`](arena::tier::ArenaTier::release): its use
//!       events go back to the pool, and the range goes to its graph's pool
//!       ([`ArenaTier::keep_for_graph`](arena::tier::ArenaTier::keep_for_graph))
//!       or on to the arena;
//!    4. [`VirtualArena::free`](arena::vmm::VirtualArena::free) (or
//!       [`free_completed`](arena::vmm::VirtualArena::free_completed), when
//!       the host saw the GPU done with it): the stream keeps the block
//!       ([`KeptBlocks::keep`](arena::kept::KeptBlocks::keep)) while its
//!       sizes repeat, taken back by its next allocation of that length
//!       with no shared lock;
//!    5. [`VirtualArena::release_range`](arena::vmm::VirtualArena::release_range):
//!       the block pushed out of the kept ones (or this one) goes back
//!       under the arena's lock, tagged with a new free of its stream
//!       ([`Freed`](arena::freed::Freed),
//!       [`Fences::next_stamp`](arena::fences::Fences::next_stamp)): its
//!       pages no live block touches go idle, still mapped
//!       ([`PageTable::untouch`](arena::pages::PageTable::untouch)), and the
//!       range merges with its free neighbours
//!       ([`Arena::free`](arena::placement::Arena::free));
//!    6. [`ArenaTier::hold_to_cap`](arena::tier::ArenaTier::hold_to_cap):
//!       under a cap, the stream's kept blocks go back too, and idle
//!       mappings past the cap are given back to the device.
//! 3. A size-class lease:
//!    [`SizeClassTier::free`](size_class::tier::SizeClassTier::free): the
//!    stream waits for the uses recorded on other streams, then the block
//!    goes to its graph's pool
//!    ([`GraphPool::put_block`](graph::pool::GraphPool::put_block)), or to
//!    the stream's free list within the cap
//!    ([`SizeClassTier::reserve`](size_class::tier::SizeClassTier::reserve),
//!    [`Shard::push`](shard::Shard::push)), or back to the inner resource
//!    ([`release_to_inner`](size_class::tier::release_to_inner)).
//!
//! Memory a graph's pool holds takes the same path from
//! [`Graphs::finish_deferred`](graph::release::Graphs::finish_deferred)
//! once the graph is released and its stream ordered after the last
//! replay.

// The "Life of a free" names the private functions of the path; rustdoc
// still checks that each link resolves.
#![allow(rustdoc::private_intra_doc_links)]
#![deny(unsafe_code)]

mod arena;
mod config;
mod graph;
mod resource;
mod shard;
mod shards;
mod size_class;
mod slab;
mod snapshot;
mod stats;

pub use config::{CacheConfig, CrossStreamReuse};
pub use resource::CachingResource;
pub use size_class::{MIN_CLASS_SIZE, SizeClass};
pub use stats::CacheStats;
