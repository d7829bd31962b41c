//! [`SizeClassTier`]: the cache's size-class tier — blocks of the inner
//! resource, kept when freed in per-stream free lists by [`SizeClass`],
//! under one cap on the bytes they hold.
//!
//! Every lease of an inner block is this tier's, whether it has a class or
//! bypassed the cache (a request above the largest class, a stream past the
//! slots, a miss inside a capture): the block-use hooks of such a lease are
//! the inner resource's, with the lease's stream recorded as the block's
//! last write before another stream first waits on it.
//!
//! The cap is reserved in parts: each shard holds part of it
//! (`Shard::reserved`), taken from one atomic counter only when the shard
//! needs more than it holds, plus a grain so that it does not come back for
//! every block; under pressure, a shard takes back what others hold and do
//! not use.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::class::SizeClass;
use crate::cache::config::CrossStreamReuse;
use crate::cache::shard::{Backing, Lease, SlotGuard};
use crate::cache::shards::Shards;
use crate::cache::stats::CacheStats;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::{CaptureId, CaptureStatus};
use crate::resource::DeviceMemoryResource;
use crate::types::{Access, AllocTag, BlockId, DeviceBlock, StreamId};

/// How many classes above its own a request takes a cached block from
/// when memory is full: four steps per doubling, so at most twice its
/// class size.
const LARGER_CLASSES: usize = 4;

/// A trim of part of the cache (a budget's shortfall), not all of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part {
    /// Stop once the blocks taken add up to this many bytes.
    pub(crate) bytes: usize,
    /// The shard looked at first (the one after the refused request's, so
    /// that its own free lists, which serve its next requests at once, are
    /// taken from last).
    pub(crate) first: usize,
}

/// The size-class tier of a cache: the cap's accounting; the free lists
/// and leases live in the cache's [`Shards`], which each call is given,
/// with the inner resource.
#[derive(Debug)]
pub(crate) struct SizeClassTier {
    /// The part of the cap held by shards (each shard holds its part in
    /// `Shard::reserved`; this is their sum).
    reserved_total: AtomicUsize,
    /// How much more of the cap a shard takes than it needs, so that it does
    /// not come back for every block.
    grain: usize,
}

/// Frees a block cached on `cached_on` to `inner`. The inner resource
/// frees it on its own allocation stream, which must first wait for the
/// block's last use on `cached_on`.
pub(crate) fn release_to_inner<R: DeviceMemoryResource>(
    inner: &R,
    block: &DeviceBlock,
    cached_on: StreamId,
) -> ResourceResult<()> {
    if cached_on != block.stream() {
        inner.finish_block_use(block.id(), cached_on, Access::Write)?;
    }
    inner.deallocate(block.clone())
}

impl SizeClassTier {
    /// The tier under a cap of `max_cached_bytes`.
    pub(crate) fn new(max_cached_bytes: usize) -> Self {
        SizeClassTier {
            reserved_total: AtomicUsize::new(0),
            grain: (max_cached_bytes / 256).min(1 << 20),
        }
    }

    /// The class a request of `bytes` on slot `index` is cached at, or
    /// `None` when it bypasses the cache (nothing, past the largest class,
    /// or a stream past the slots).
    pub(crate) fn class_of(shards: &Shards, bytes: usize, index: usize) -> Option<SizeClass> {
        SizeClass::of(bytes)
            .filter(|_| bytes != 0 && bytes <= shards.config.max_block_size)
            .filter(|_| index != shards.config.streams)
    }

    /// Allocates `bytes` of `class` on `stream` (slot `index`): the
    /// stream's own free list (a **hit**), else a block of the class cached
    /// on another stream (a **steal**, behind an event wait; not under
    /// [`CrossStreamReuse::Done`]), else
    /// `try_inner` at the class size (a **miss**). Inside `capture`,
    /// no cached block: a miss at the requested size, leased with no
    /// class.
    ///
    /// When the miss finds memory full (the device's, or a budget's below
    /// the cache, which counts every cached block), a cached block of a
    /// class up to twice this one serves instead, this stream's first,
    /// else another's behind an event wait: the memory is already the
    /// cache's, and giving blocks back to make room (`relieve`, given the
    /// refusal) would leave the request waiting for their frees to run,
    /// and the streams they served missing at their next requests.
    #[allow(clippy::too_many_arguments, reason = "one request, split")]
    pub(crate) fn allocate<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        (bytes, stream, tag): (usize, StreamId, AllocTag),
        index: usize,
        class: SizeClass,
        capture: Option<CaptureId>,
        try_inner: impl FnOnce(usize) -> ResourceResult<DeviceBlock>,
        relieve: impl FnOnce(usize, ResourceError) -> ResourceResult<DeviceBlock>,
    ) -> ResourceResult<DeviceBlock> {
        let seen = {
            let mut shard = shards.slots[index].lock();
            // Checked before a block is taken, under the lock the lease is
            // made under: a hit cannot be refused.
            shard.room()?;
            // A capture takes no cached block: its replays may run on any
            // stream, where nothing orders them after the work this stream
            // queued on the block before (stream order covers only a reuse
            // on this stream), and a block used on another stream would
            // need a wait that joins that stream's work to the capture,
            // which the driver refuses. Its miss below is a graph
            // allocation of the inner resource, which no queued work
            // touches.
            let hit = match (capture, shard.serves(stream)) {
                (None, true) => shard.pop(class),
                // An id the inner resource has not accepted for this shard
                // takes nothing here: below, it is refused or learnt.
                _ => None,
            };
            if let Some(block) = hit {
                // Stream order alone makes this safe: every use of the block
                // on this stream was queued before, and uses on other streams
                // were waited for when it was cached.
                shard.stats.hits += 1;
                let ptr = block.ptr();
                let Ok(serial) = shard.lease(Lease {
                    backing: Backing::Inner(block),
                    stream,
                    size: bytes,
                    class: Some(class),
                    home_marked: false,
                    cross_used: false,
                    capture: None,
                }) else {
                    unreachable!("room checked under this lock");
                };
                return Ok(DeviceBlock::new(
                    BlockId::new(shards.id, serial),
                    ptr,
                    bytes,
                    stream,
                    tag,
                ));
            }
            shard.seen
        };
        let request = (bytes, stream, tag);
        if capture.is_some() {
            // A miss inside a capture: the inner resource's block is a graph
            // allocation of its own (CUDA's graph memory node), freed in the
            // graph or after it by the inner resource, never cached here.
            let block = match try_inner(bytes) {
                Err(e) if e.is_lack_of_memory() => relieve(bytes, e)?,
                tried => tried?,
            };
            return self.lease(shards, inner, index, block, request, None, |s| {
                s.misses += 1
            });
        }
        // Every steal waits on the GPU for the other stream's last use:
        // under `CrossStreamReuse::Done` only memory running short does.
        let steals = seen && shards.config.cross_stream == CrossStreamReuse::Wait;
        if steals && let Some(block) = self.steal(shards, inner, class, index, stream) {
            return self.lease(shards, inner, index, block, request, Some(class), |s| {
                s.steals += 1;
                s.cross_stream_waits += 1;
            });
        }
        let block = match try_inner(class.size()) {
            Err(e) if e.is_lack_of_memory() => {
                if let Some((larger, block, own)) =
                    self.take_larger(shards, inner, class, index, stream, seen)
                {
                    return self.lease(shards, inner, index, block, request, Some(larger), |s| {
                        match own {
                            true => s.hits += 1,
                            false => {
                                s.steals += 1;
                                s.cross_stream_waits += 1;
                            }
                        }
                    });
                }
                relieve(class.size(), e)?
            }
            tried => tried?,
        };
        self.lease(shards, inner, index, block, request, Some(class), |s| {
            s.misses += 1
        })
    }

    /// Memory is full: a cached block of the smallest class above `class`
    /// that has one, up to [`LARGER_CLASSES`] above (twice the size), from
    /// slot `own`'s lists when they serve `stream` (stream order makes it
    /// a hit), else from another stream's (a steal, when `seen`), and
    /// whether it was `own`'s. Its lease keeps its class, so that its free
    /// puts it back on its own list.
    fn take_larger<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        class: SizeClass,
        own: usize,
        stream: StreamId,
        seen: bool,
    ) -> Option<(SizeClass, DeviceBlock, bool)> {
        let larger =
            || (class.index() + 1..=class.index() + LARGER_CLASSES).map(SizeClass::from_index);
        {
            let mut shard = shards.slots[own].lock();
            if shard.serves(stream) {
                for c in larger() {
                    if let Some(block) = shard.pop(c) {
                        return Some((c, block, true));
                    }
                }
            }
        }
        if !seen {
            return None;
        }
        larger().find_map(|c| {
            self.steal(shards, inner, c, own, stream)
                .map(|block| (c, block, false))
        })
    }

    /// Hands `block` of the inner resource to the user as a block of the
    /// cache on `stream` (slot `index`); when the shard has no serial
    /// left, `block` goes back to the inner resource and the error is the
    /// shard's.
    #[allow(clippy::too_many_arguments, reason = "one lease, split")]
    pub(crate) fn lease<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        index: usize,
        block: DeviceBlock,
        request: (usize, StreamId, AllocTag),
        class: Option<SizeClass>,
        count: impl FnOnce(&mut CacheStats),
    ) -> ResourceResult<DeviceBlock> {
        let (bytes, stream, tag) = request;
        let ptr = block.ptr();
        let mut shard = shards.slots[index].lock();
        let leased = shard.lease(Lease {
            backing: Backing::Inner(block),
            stream,
            size: bytes,
            class,
            home_marked: false,
            cross_used: false,
            capture: None,
        });
        let serial = match leased {
            Ok(serial) => serial,
            Err(refused) => {
                // No serial left: the block, got before this lock was
                // taken, goes back, and the caller learns why (not how the
                // give-back went).
                let full = shard.full();
                drop(shard);
                if let Backing::Inner(block) = &refused.backing
                    && let Err(e) = release_to_inner(inner, block, stream)
                {
                    tracing::warn!(error = %e, %stream, "giving back a block no serial was left for failed; leaked");
                }
                return Err(full);
            }
        };
        shard.seen |= class.is_some();
        if index < shards.config.streams {
            // The inner resource just accepted `stream`: the shard's own.
            shard.learn(stream);
        }
        count(&mut shard.stats);
        Ok(DeviceBlock::new(
            BlockId::new(shards.id, serial),
            ptr,
            bytes,
            stream,
            tag,
        ))
    }

    /// Frees the size-class lease `serial` of the locked `shard` (of class
    /// `class`, leased on `stream`, handed out in `leased_in`): the stream
    /// first waits for the block's uses on other streams, then the block
    /// goes to the pool of `owner` (the graph that still uses it), or to
    /// the stream's free list when the cap has room
    /// ([`reserve`](Self::reserve)), or back to the inner resource
    /// ([`release_to_inner`]).
    #[allow(clippy::too_many_arguments, reason = "one free, split")]
    pub(crate) fn free<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        mut shard: SlotGuard<'_>,
        serial: u64,
        class: SizeClass,
        (owner, leased_in): (Option<CaptureId>, Option<CaptureId>),
    ) -> ResourceResult<()> {
        let Some(lease) = shard.lease_mut(serial) else {
            unreachable!("the caller found the lease under this lock");
        };
        let Backing::Inner(block) = &lease.backing else {
            unreachable!("a size-class lease");
        };
        let block = block.clone();
        let stream = lease.stream;
        if lease.cross_used {
            // The next user of the block on this stream (or the inner free)
            // must come after every use recorded on other streams: queue
            // those waits now.
            inner.prepare_block_use(block.id(), stream, Access::Write)?;
        }
        if let Some(c) = owner {
            let pool = shard.graph_entry(c);
            pool.put_block(class, block);
            if leased_in == Some(c) {
                pool.live -= 1;
            }
            shard.end_lease(serial);
            return Ok(());
        }
        if self.reserve(shards, &mut shard, block.size()) {
            shard.push(class, block);
        } else {
            release_to_inner(inner, &block, stream)?;
            shard.stats.evictions += 1;
        }
        shard.end_lease(serial);
        Ok(())
    }

    /// Makes sure the shard holds enough of the cap to cache `bytes` more.
    pub(crate) fn reserve(&self, shards: &Shards, shard: &mut SlotGuard<'_>, bytes: usize) -> bool {
        let Some(need) = shard.cached.checked_add(bytes) else {
            return false;
        };
        if need <= shard.reserved {
            return true;
        }
        let want = need - shard.reserved;
        let cap = shards.config.max_cached_bytes;
        if let Some(taken) = self.take_cap(cap, want) {
            shard.reserved += taken;
            return true;
        }
        // Under pressure: take back what other shards hold but do not use,
        // then try once more. try_lock only, so two shards doing this at
        // once cannot deadlock (and our own shard is locked already).
        for slot in shards.slots.iter() {
            if let Some(mut other) = slot.try_lock() {
                let slack = other.reserved - other.cached.min(other.reserved);
                other.reserved -= slack;
                self.reserved_total.fetch_sub(slack, Ordering::AcqRel);
            }
        }
        match self.take_cap(cap, want) {
            Some(taken) => {
                shard.reserved += taken;
                true
            }
            None => false,
        }
    }

    /// Takes `want` bytes of the cap `cap`, plus the grain when it fits (so
    /// that a shard does not come back for every block); returns what it
    /// took.
    fn take_cap(&self, cap: usize, want: usize) -> Option<usize> {
        let with_grain = |cur: usize| {
            cur.checked_add(want)
                .and_then(|n| n.checked_add(self.grain))
                .filter(|&n| n <= cap)
        };
        let prev = self
            .reserved_total
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
                with_grain(cur).or_else(|| cur.checked_add(want).filter(|&n| n <= cap))
            })
            .ok()?;
        Some(if with_grain(prev).is_some() {
            want + self.grain
        } else {
            want
        })
    }

    /// Takes a block of `class` cached on another stream and orders `stream`
    /// after its last use there.
    fn steal<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        class: SizeClass,
        own: usize,
        stream: StreamId,
    ) -> Option<DeviceBlock> {
        let n = shards.config.streams;
        for offset in 1..n {
            let slot = &shards.slots[(own + offset) % n];
            if slot.looks_empty() {
                continue;
            }
            let Some(mut other) = slot.try_lock() else {
                continue;
            };
            if !other.holds(class) {
                continue;
            }
            // An event recorded on a capturing stream is captured, and a
            // wait on it would pull this stream into the capture.
            if !matches!(inner.capture_status(other.stream), Ok(CaptureStatus::None)) {
                continue;
            }
            let Some(block) = other.pop(class) else {
                continue;
            };
            let from = other.stream;
            drop(other);
            // Record where `from` is now, and make `stream` wait for it.
            let moved = inner
                .finish_block_use(block.id(), from, Access::Write)
                .and_then(|()| inner.prepare_block_use(block.id(), stream, Access::Write));
            match moved {
                Ok(()) => return Some(block),
                Err(e) => {
                    // Back on its list before the log line (a subscriber
                    // may panic).
                    slot.lock().push(class, block);
                    tracing::debug!(error = %e, %from, %stream, "moving a cached block failed");
                    return None;
                }
            }
        }
        None
    }

    /// Gives every cached block back to the inner resource; returns the
    /// bytes given back and the first error. `settle` runs on each shard
    /// that may hold something, under its lock, before its blocks are
    /// taken (the cache returns the released graph pools there, which may
    /// add blocks to the free lists).
    ///
    /// A block cached on a stream other than the one the inner resource
    /// allocated it on is freed behind an event recorded on the cached
    /// stream, so the free waits for the block's last user.
    ///
    /// With `part`, `(bytes, first)`: stops once the blocks taken add up
    /// to `bytes`, taking the largest first, shard `first` first and the
    /// shard before it last (see [`Part`]).
    pub(crate) fn trim<R: DeviceMemoryResource>(
        &self,
        shards: &Shards,
        inner: &R,
        part: Option<Part>,
        mut settle: impl FnMut(usize, &mut SlotGuard<'_>) -> ResourceResult<()>,
    ) -> (usize, Option<ResourceError>) {
        let mut released = 0;
        let mut first_err = None;
        let mut taken = 0;
        let n = shards.slots.len();
        let first = part.map_or(0, |p| p.first % n.max(1));
        for index in (0..n).map(|k| (first + k) % n) {
            let slot = &shards.slots[index];
            if part.is_some_and(|p| taken >= p.bytes) {
                break;
            }
            let (stream, blocks) = {
                let mut shard = slot.lock();
                if shard.cached == 0 && !slot.deferred.load(Ordering::Relaxed) {
                    continue;
                }
                // A free queued on a capturing stream would be captured (and
                // run at every replay): its blocks stay until it is done.
                let capturing = match inner.capture_status(shard.stream) {
                    Ok(status) => status.is_capturing(),
                    Err(e) => {
                        first_err.get_or_insert(e);
                        continue;
                    }
                };
                if capturing {
                    continue;
                }
                if let Err(e) = settle(index, &mut shard) {
                    first_err.get_or_insert(e);
                }
                let blocks = match part {
                    // The shard keeps its part of the cap: it is still
                    // caching.
                    Some(p) => shard.take_largest(p.bytes - taken),
                    None => {
                        self.reserved_total
                            .fetch_sub(shard.reserved, Ordering::AcqRel);
                        shard.reserved = 0;
                        shard.take_all()
                    }
                };
                taken += blocks.iter().map(|(_, b)| b.size()).sum::<usize>();
                shard.stats.trimmed += blocks.len() as u64;
                (shard.stream, blocks)
            };
            for (class, block) in blocks {
                let size = block.size();
                // A block moved here from another stream is freed on that
                // one: not while it is capturing either.
                let home_capturing = block.stream() != stream
                    && !matches!(
                        inner.capture_status(block.stream()),
                        Ok(CaptureStatus::None)
                    );
                let freed = match home_capturing {
                    true => Err(None),
                    false => release_to_inner(inner, &block, stream).map_err(Some),
                };
                match freed {
                    Ok(()) => released += size,
                    Err(e) => {
                        // Keep it: the cap may be exceeded until the next
                        // trim, but no memory is lost.
                        let mut shard = slot.lock();
                        shard.stats.trimmed -= 1;
                        shard.push(class, block);
                        if part.is_none() {
                            shard.reserved += size;
                            self.reserved_total.fetch_add(size, Ordering::AcqRel);
                        }
                        if let Some(e) = e {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        (released, first_err)
    }

    /// Nothing when a block of `class` is cached on slot `index` (or on
    /// another stream it may take one from); otherwise what the inner
    /// resource takes for the class size.
    pub(crate) fn cost<R: DeviceMemoryResource>(
        shards: &Shards,
        inner: &R,
        class: SizeClass,
        index: usize,
        stream: StreamId,
    ) -> usize {
        let seen = {
            let shard = shards.slots[index].lock();
            if shard.holds(class) {
                return 0;
            }
            shard.seen
        };
        let n = shards.config.streams;
        let elsewhere = seen
            && (1..n).any(|offset| {
                let slot = &shards.slots[(index + offset) % n];
                !slot.looks_empty() && slot.try_lock().is_some_and(|s| s.holds(class))
            });
        if elsewhere {
            0
        } else {
            inner.allocation_cost(class.size(), stream)
        }
    }

    /// Records a use on `use_stream` of the inner block behind `lease`
    /// (its [`record_block_use`](DeviceMemoryResource::record_block_use)).
    pub(crate) fn record_use<R: DeviceMemoryResource>(
        inner: &R,
        lease: &mut Lease,
        use_stream: StreamId,
    ) -> ResourceResult<()> {
        let Backing::Inner(block) = &lease.backing else {
            unreachable!("an inner block's lease");
        };
        inner.record_block_use(block, use_stream)?;
        lease.cross_used |= use_stream != lease.stream;
        Ok(())
    }

    /// Queues the waits `use_stream` needs before `access` to the inner
    /// block behind `lease`: on another stream, after the lease's own
    /// stream (recorded as the block's last write the first time) and the
    /// uses recorded elsewhere.
    pub(crate) fn prepare_use<R: DeviceMemoryResource>(
        inner: &R,
        lease: &mut Lease,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let Backing::Inner(block) = &lease.backing else {
            unreachable!("an inner block's lease");
        };
        let block = block.id();
        if use_stream != lease.stream || lease.cross_used {
            // Ordering after uses on other streams would make a
            // capturing stream wait on events recorded outside its
            // capture, which the driver refuses and which invalidates
            // the capture: refused first, changing nothing.
            inner.capture_status(use_stream)?.refuse(use_stream)?;
        }
        if use_stream != lease.stream && !lease.home_marked {
            // The inner block may carry records of earlier leases (or of
            // another stream it was cached on): point its last write at
            // this lease's stream, now, so the wait below covers the
            // work queued there so far. Uses on other streams already
            // recorded in this lease are folded in first, so that
            // replacing the last write loses none of them.
            if lease.cross_used {
                inner.prepare_block_use(block, lease.stream, Access::Write)?;
            }
            inner.finish_block_use(block, lease.stream, Access::Write)?;
            inner.prepare_block_use(block, use_stream, access)?;
            lease.home_marked = true;
            return Ok(());
        }
        inner.prepare_block_use(block, use_stream, access)
    }

    /// Records the end of `access` on `use_stream` to the inner block
    /// behind `lease`.
    pub(crate) fn finish_use<R: DeviceMemoryResource>(
        inner: &R,
        lease: &mut Lease,
        use_stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        let Backing::Inner(block) = &lease.backing else {
            unreachable!("an inner block's lease");
        };
        inner.finish_block_use(block.id(), use_stream, access)?;
        lease.cross_used |= use_stream != lease.stream;
        Ok(())
    }
}
