//! The caching tier: a stream-ordered cache in front of any stream-ordered
//! resource.
//!
//! The driver's pool costs 0.65–0.88 µs per allocate + free pair on one
//! thread and gets *slower* as threads are added (see `docs/DESIGN.md`, "What the
//! hardware costs"). [`CachingResource`] keeps freed blocks and hands them
//! out again with no driver call at all, which is what makes allocation
//! scale with threads.
//!
//! # State
//!
//! - **Shards, one per stream** (a [`CacheConfig::streams`] number of them,
//!   each behind its own mutex and on its own cache lines). A shard holds:
//!   - **free lists per size class** ([`SizeClass`]: powers of two cut in
//!     four steps, from 512 B): blocks freed on this stream, hottest last;
//!   - **leases**: the blocks handed out on this stream, each mapping the
//!     cache's own [`BlockId`](crate::BlockId) to the inner resource's block
//!     behind it (its address, its class size, and the stream the inner
//!     resource allocated it on, where it will finally be freed);
//!   - tallies: cached bytes, leased bytes, its part of the cap, statistics.
//! - **The cap reservation**: one atomic counter, the sum of the parts of
//!   [`CacheConfig::max_cached_bytes`] the shards hold. A shard takes more
//!   only when its cached bytes would exceed its part, so the hot path
//!   touches no shared cache line.
//!
//! # Who adds, who drains
//!
//! - `deallocate` adds: the lease ends and the inner block goes on the free
//!   list of the lease's stream and class (or, when the cap is reached, back
//!   to the inner resource: "eviction").
//! - `allocate` drains, in this order: the stream's own list (a **hit**, no
//!   driver call); a block of the same class cached on another stream (a
//!   **steal**, behind an event wait); the inner resource at the class size
//!   (a **miss**). If the inner resource is out of memory, every cached
//!   block is given back ([`trim`](CachingResource::trim)) and the request
//!   is tried once more before the error is reported.
//! - [`trim`](CachingResource::trim) drains everything to the inner
//!   resource; so does dropping the cache.
//! - Requests above [`CacheConfig::max_block_size`] (64 MiB by default), of
//!   zero bytes, or on a stream without a shard **bypass** the cache: they
//!   are leased straight from the inner resource and freed straight to it.
//!
//! # Stream ordering
//!
//! A block is cached on the stream it was last leased on, `S`.
//!
//! - **Reuse on `S`** needs nothing: the new user's work is queued on `S`
//!   after the old user's, so stream order alone separates them. This is
//!   CUDA's own rule for a free followed by an allocation on one stream.
//! - **Uses on other streams** are tracked by the inner resource: the
//!   cache forwards the block-use hooks to the inner block. When a lease
//!   that had such uses ends, `S` is made to wait for them (through
//!   `inner.prepare_block_use(inner, S, Write)`, which queues exactly those
//!   waits), so the cached block is again ordered on `S` alone.
//! - Before the first wait of another stream in a lease, the cache records
//!   the lease stream's current position as the block's last write in the
//!   inner resource. A fresh block gets the same from the inner resource
//!   itself; a reused one needs it, or the other stream would wait on a
//!   stale record of an earlier lease.
//! - **A steal** from stream `T` to stream `U` records an event on `T`
//!   (`inner.finish_block_use(inner, T, Write)`) and makes `U` wait on it
//!   (`inner.prepare_block_use(inner, U, Write)`). The inner block keeps its
//!   allocation stream; the user gets a new descriptor with this cache's id.
//! - **Giving a block back** to the inner resource from a stream other than
//!   its allocation stream records the cached stream's position first, so
//!   the inner resource's free waits for the block's last user.
//!
//! A use on another stream without the hooks is still a race, and the
//! simulated device still reports it: the cache adds no waits of its own
//! beyond the ones above.
//!
//! # Failure
//!
//! Bad input (a foreign block, a stale or unknown id, a stream of another
//! device, a descriptor that does not match its lease) is refused before
//! anything changes. A driver error in a hook or a free leaves the lease as
//! it was.

#![forbid(unsafe_code)]

mod config;
mod resource;
mod shard;
mod size_class;
mod stats;

pub use config::CacheConfig;
pub use resource::CachingResource;
pub use size_class::{MIN_CLASS_SIZE, SizeClass};
pub use stats::CacheStats;
