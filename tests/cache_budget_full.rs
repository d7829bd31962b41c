//! The cache over a budget that is full (as under a service's reservations,
//! which fill it with live requests): a request the budget refuses is
//! served from a cached block of a larger class, on its stream or behind
//! an event wait from another, before anything is given back; and when
//! blocks must go back, only about what the budget lacks goes, so the
//! other streams keep serving from their free lists.

mod common;

use std::sync::Arc;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AllocTag, DeviceMemoryResource, StreamId, StreamOrderedResource};
use streamalloc::{Budget, BudgetResource, CacheConfig, CachingResource, DriverCall};

const T: AllocTag = AllocTag::UNTAGGED;
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A cache over a budget of `limit` bytes over the simulated device, with
/// `streams` streams (manual progress).
struct Stack {
    gpu: Arc<SimGpu>,
    budget: Budget,
    cache: CachingResource<BudgetResource<Arc<StreamOrderedResource<SimGpu>>>>,
    pool: Arc<streamalloc::StreamPool>,
    streams: Vec<StreamId>,
}

impl Stack {
    fn new(streams: usize, limit: usize) -> Self {
        let f = common::sim_with(SimGpu::builder().manual().build(), streams);
        let budget = Budget::new(limit);
        let cache = CachingResource::with_config(
            BudgetResource::new(f.resource.clone(), &budget),
            CacheConfig::default().virtual_memory(false),
        );
        Stack {
            gpu: f.sim.clone().unwrap(),
            budget,
            cache,
            pool: f.pool.clone(),
            streams: f.streams.clone(),
        }
    }

    fn s(&self, i: usize) -> StreamId {
        self.streams[i]
    }

    fn kernel(&self, stream: StreamId, access: MemAccess) {
        let raw = self.pool.raw(stream).unwrap();
        self.gpu.launch_kernel(raw, &[access]).unwrap();
    }

    /// Allocates `bytes` on stream `i`, writes it there, frees it: cached.
    fn cache_one(&self, i: usize, bytes: usize) {
        let block = self.cache.allocate(bytes, self.s(i), T).unwrap();
        self.kernel(self.s(i), MemAccess::write(&block));
        self.cache.deallocate(block).unwrap();
    }

    fn calls(&self, call: DriverCall) -> u64 {
        self.gpu.call_count(call)
    }
}

#[test]
fn a_refused_request_takes_a_larger_block_its_stream_cached() {
    // 1 MiB cached on stream 0; the budget has room for half a MiB more.
    let st = Stack::new(1, MIB + 512 * KIB);
    st.cache_one(0, MIB);
    assert_eq!(st.budget.in_use(), MIB);
    let (allocs, frees) = (
        st.calls(DriverCall::AllocAsync),
        st.calls(DriverCall::FreeAsync),
    );

    // 800 KiB (the 896 KiB class) does not fit beside the cached MiB.
    let block = st.cache.allocate(800 * KIB, st.s(0), T).unwrap();
    assert_eq!(block.size(), 800 * KIB);
    st.kernel(st.s(0), MemAccess::write(&block));
    let stats = st.cache.stats();
    assert_eq!((stats.hits, stats.trimmed), (1, 0), "{stats:?}");
    assert_eq!(st.calls(DriverCall::AllocAsync), allocs, "no new memory");
    assert_eq!(st.calls(DriverCall::FreeAsync), frees, "nothing given back");
    assert_eq!(st.budget.in_use(), MIB);

    // Its free puts the MiB back on the MiB's list: a MiB request hits.
    st.cache.deallocate(block).unwrap();
    let again = st.cache.allocate(MIB, st.s(0), T).unwrap();
    assert_eq!(st.cache.stats().hits, 2);
    st.cache.deallocate(again).unwrap();
    st.gpu.run_until_idle();
    assert!(st.gpu.races().is_empty(), "{:#?}", st.gpu.races());
}

#[test]
fn a_refused_request_takes_a_larger_block_of_another_stream_behind_a_wait() {
    // Stream 0 has cached 4 KiB (it has allocated from its classes);
    // stream 1 a MiB, written by a kernel still queued there.
    let st = Stack::new(2, MIB + 4 * KIB + 512 * KIB);
    st.cache_one(0, 4 * KIB);
    st.cache_one(1, MIB);
    let (allocs, frees, waits) = (
        st.calls(DriverCall::AllocAsync),
        st.calls(DriverCall::FreeAsync),
        st.calls(DriverCall::StreamWaitEvent),
    );

    let block = st.cache.allocate(800 * KIB, st.s(0), T).unwrap();
    // Written on stream 0: ordered after stream 1's write by the wait.
    st.kernel(st.s(0), MemAccess::write(&block));
    let stats = st.cache.stats();
    assert_eq!((stats.steals, stats.trimmed), (1, 0), "{stats:?}");
    assert_eq!(st.calls(DriverCall::AllocAsync), allocs, "no new memory");
    assert_eq!(st.calls(DriverCall::FreeAsync), frees, "nothing given back");
    assert!(st.calls(DriverCall::StreamWaitEvent) > waits, "no wait");
    st.cache.deallocate(block).unwrap();
    st.gpu.run_until_idle();
    assert!(st.gpu.races().is_empty(), "{:#?}", st.gpu.races());
}

#[test]
fn a_block_more_than_twice_the_request_is_not_taken() {
    // 4 MiB cached; 1 MiB asked, with room for half a MiB: the 4 MiB
    // block is not spent on it, and only what the budget lacks goes back.
    let st = Stack::new(1, 4 * MIB + 512 * KIB);
    st.cache_one(0, 4 * MIB);
    let block = st.cache.allocate(MIB, st.s(0), T).unwrap();
    let stats = st.cache.stats();
    assert_eq!((stats.hits, stats.misses), (0, 2), "{stats:?}");
    assert_eq!(stats.trimmed, 1, "{stats:?}");
    st.cache.deallocate(block).unwrap();
}

#[test]
fn a_full_budget_gives_back_only_what_it_lacks() {
    // Streams 1 and 2 each cache a MiB; stream 0 asks for 4 MiB with room
    // for 3 in the budget: one MiB must go back, not both.
    let st = Stack::new(3, 5 * MIB);
    st.cache_one(1, MIB);
    st.cache_one(2, MIB);
    assert_eq!(st.cache.cached_bytes(), 2 * MIB);
    let frees = st.calls(DriverCall::FreeAsync);

    // Off a poll the refused allocation reaps the block it gave back.
    let block = st.cache.allocate(4 * MIB, st.s(0), T).unwrap();
    assert_eq!(st.calls(DriverCall::FreeAsync), frees + 1);
    assert_eq!(st.cache.stats().trimmed, 1);
    assert_eq!(
        st.cache.cached_bytes(),
        MIB,
        "the other stream's block stays cached"
    );
    assert_eq!(st.budget.in_use(), 5 * MIB);
    // The stream that kept its block is served from it.
    let kept = st.cache.allocate(MIB, st.s(2), T).unwrap();
    assert_eq!(st.cache.stats().hits, 1);
    st.cache.deallocate(kept).unwrap();
    st.cache.deallocate(block).unwrap();
    st.gpu.run_until_idle();
    assert!(st.gpu.races().is_empty(), "{:#?}", st.gpu.races());
}

#[test]
fn the_device_out_of_memory_still_gives_every_block_back() {
    // No budget to say how much is lacking: the cache empties, as before.
    let f = common::sim_with(SimGpu::builder().manual().capacity(4 * MIB).build(), 3);
    let cache = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().virtual_memory(false),
    );
    let gpu = f.sim.clone().unwrap();
    for i in 1..3 {
        let b = cache.allocate(MIB, f.streams[i], T).unwrap();
        cache.deallocate(b).unwrap();
    }
    let block = cache.allocate(3 * MIB, f.streams[0], T).unwrap();
    assert_eq!(cache.cached_bytes(), 0);
    assert_eq!(cache.stats().trimmed, 2);
    cache.deallocate(block).unwrap();
    gpu.run_until_idle();
}
