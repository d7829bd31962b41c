//! The caching tier's size classes (the path of backends without virtual
//! memory, `CacheConfig::virtual_memory(false)`) on the simulated device:
//! reuse without driver calls, race-free cross-stream reuse, cap, trim,
//! out-of-memory and bad input. The virtual-memory arena is tested in
//! `cache_arena.rs`.

mod common;

use std::sync::Arc;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    Access, AllocTag, BlockState, DeviceMemoryResource, ResourceError, SimResource, StreamId,
};
use streamalloc::{CacheConfig, CachingResource};

const T: AllocTag = AllocTag::UNTAGGED;

struct Cache {
    gpu: Arc<SimGpu>,
    cache: CachingResource<Arc<SimResource>>,
    inner: Arc<SimResource>,
    pool: Arc<streamalloc::StreamPool>,
    streams: Vec<StreamId>,
}

impl Cache {
    fn new(streams: usize, config: CacheConfig) -> Self {
        Self::on(
            SimGpu::builder().manual().capacity(64 << 30).build(),
            streams,
            config,
        )
    }

    fn on(gpu: Arc<SimGpu>, streams: usize, config: CacheConfig) -> Self {
        let f = common::sim_with(gpu, streams);
        Cache {
            gpu: f.sim.clone().unwrap(),
            cache: CachingResource::with_config(f.resource.clone(), config.virtual_memory(false)),
            inner: f.resource.clone(),
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

    fn assert_race_free(&self) {
        self.gpu.run_until_idle();
        assert!(self.gpu.races().is_empty(), "{:#?}", self.gpu.races());
    }
}

#[test]
fn same_stream_reuse_gives_the_same_memory_without_a_driver_call() {
    let c = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    let block = c.cache.allocate(1000, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    let (ptr, first_id) = (block.ptr(), block.id());
    c.cache.deallocate(block).unwrap();
    assert_eq!(c.cache.cached_bytes(), 1024);
    assert_eq!(
        c.cache.bytes_outstanding(),
        1024,
        "cached bytes stay outstanding"
    );
    assert_eq!(c.inner.live_bytes(), 1024);

    let (allocs, frees) = (
        c.gpu.call_count(DriverCall::AllocAsync),
        c.gpu.call_count(DriverCall::FreeAsync),
    );
    let again = c.cache.allocate(1024, a, T).unwrap();
    assert_eq!(again.ptr(), ptr);
    assert_ne!(again.id(), first_id, "a new lease gets a new id");
    assert_eq!(again.size(), 1024);
    assert_eq!(c.gpu.call_count(DriverCall::AllocAsync), allocs);
    c.kernel(a, MemAccess::write(&again));
    c.cache.deallocate(again).unwrap();
    assert_eq!(c.gpu.call_count(DriverCall::FreeAsync), frees);
    let stats = c.cache.stats();
    assert_eq!((stats.hits, stats.misses), (1, 1));
    assert_eq!(c.cache.block_state(first_id), Some(BlockState::Retired));
    c.assert_race_free();
}

#[test]
fn a_block_moves_to_another_stream_behind_a_wait() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    // Make b known to the cache, then leave a block cached on a only.
    let warm = c.cache.allocate(64 << 10, b, T).unwrap();
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    let ptr = block.ptr();
    c.cache.deallocate(block).unwrap();

    let allocs = c.gpu.call_count(DriverCall::AllocAsync);
    let moved = c.cache.allocate(4000, b, T).unwrap();
    assert_eq!(moved.ptr(), ptr);
    assert_eq!(moved.stream(), b);
    assert_eq!(c.gpu.call_count(DriverCall::AllocAsync), allocs);
    assert_eq!(c.cache.stats().steals, 1);
    // Without the wait this write would race with the write on a.
    c.kernel(b, MemAccess::write(&moved));
    c.assert_race_free();

    // Cached on b now; trimming frees it on a (its inner stream), which must
    // wait for b's write.
    c.cache.deallocate(moved).unwrap();
    c.cache.deallocate(warm).unwrap();
    assert_eq!(c.cache.trim().unwrap(), 4096 + (64 << 10));
    c.assert_race_free();
    c.inner.reap_pending().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0);
}

#[test]
fn cross_stream_uses_are_waited_for_before_reuse() {
    let c = Cache::new(3, CacheConfig::default());
    let (a, b, d) = (c.s(0), c.s(1), c.s(2));
    let block = c.cache.allocate(8192, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    c.cache
        .finish_block_use(block.id(), a, Access::Write)
        .unwrap();
    c.cache
        .prepare_block_use(block.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&block));
    c.cache
        .finish_block_use(block.id(), b, Access::Read)
        .unwrap();
    c.cache.deallocate(block).unwrap();

    // Reused on a: its write must come after b's read.
    let again = c.cache.allocate(8192, a, T).unwrap();
    assert_eq!(c.cache.stats().hits, 1);
    c.kernel(a, MemAccess::write(&again));
    // A reader on d must wait for this lease's write, not the old one's.
    c.cache
        .prepare_block_use(again.id(), d, Access::Read)
        .unwrap();
    c.kernel(d, MemAccess::read(&again));
    c.cache
        .finish_block_use(again.id(), d, Access::Read)
        .unwrap();
    c.cache.deallocate(again).unwrap();
    let third = c.cache.allocate(8192, a, T).unwrap();
    c.kernel(a, MemAccess::write(&third));
    c.assert_race_free();
    c.cache.deallocate(third).unwrap();
}

#[test]
fn record_block_use_is_waited_for_too() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(2048, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    c.cache
        .prepare_block_use(block.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&block));
    c.cache.record_block_use(&block, b).unwrap();
    c.cache.deallocate(block).unwrap();
    let again = c.cache.allocate(2048, a, T).unwrap();
    c.kernel(a, MemAccess::write(&again));
    c.assert_race_free();
}

#[test]
fn a_missing_hook_is_still_reported() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(a, MemAccess::write(&block));
    // Read on b with no hooks: unordered with the write on a.
    c.kernel(b, MemAccess::read(&block));
    c.cache.deallocate(block).unwrap();
    let again = c.cache.allocate(4096, a, T).unwrap();
    c.kernel(a, MemAccess::write(&again));
    c.gpu.run_until_idle();
    assert!(c.gpu.races().len() >= 2, "{:#?}", c.gpu.races());
}

#[test]
fn the_cap_sends_frees_to_the_inner_resource() {
    let c = Cache::new(1, CacheConfig::default().max_cached_bytes(2048));
    let a = c.s(0);
    let blocks: Vec<_> = (0..3)
        .map(|_| c.cache.allocate(1024, a, T).unwrap())
        .collect();
    let frees = c.gpu.call_count(DriverCall::FreeAsync);
    for block in blocks {
        c.cache.deallocate(block).unwrap();
    }
    assert_eq!(c.cache.cached_bytes(), 2048);
    assert_eq!(c.cache.stats().evictions, 1);
    assert_eq!(c.gpu.call_count(DriverCall::FreeAsync), frees + 1);
    assert_eq!(c.inner.live_bytes(), 2048);
}

#[test]
fn the_cap_is_shared_between_streams() {
    let c = Cache::new(2, CacheConfig::default().max_cached_bytes(4096));
    let (a, b) = (c.s(0), c.s(1));
    let on_a: Vec<_> = (0..4)
        .map(|_| c.cache.allocate(1024, a, T).unwrap())
        .collect();
    let on_b: Vec<_> = (0..4)
        .map(|_| c.cache.allocate(1024, b, T).unwrap())
        .collect();
    for block in on_a.into_iter().chain(on_b) {
        c.cache.deallocate(block).unwrap();
    }
    assert!(c.cache.cached_bytes() <= 4096);
    assert_eq!(
        c.cache.cached_bytes() + 1024 * c.cache.stats().evictions as usize,
        8192
    );
}

#[test]
fn trim_gives_everything_back() {
    let c = Cache::new(2, CacheConfig::default());
    let (a, b) = (c.s(0), c.s(1));
    for (s, size) in [(a, 600), (a, 100_000), (b, 3 << 20)] {
        let block = c.cache.allocate(size, s, T).unwrap();
        c.cache.deallocate(block).unwrap();
    }
    let cached = c.cache.cached_bytes();
    assert_eq!(cached, 640 + 114_688 + (3 << 20), "class sizes");
    assert_eq!(c.cache.cached_blocks(), 3);
    let frees = c.gpu.call_count(DriverCall::FreeAsync);
    assert_eq!(c.cache.trim().unwrap(), cached);
    assert_eq!(c.gpu.call_count(DriverCall::FreeAsync), frees + 3);
    assert_eq!((c.cache.cached_bytes(), c.inner.live_bytes()), (0, 0));
    assert_eq!(c.cache.stats().trimmed, 3);
    c.inner.reap_pending().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0);
}

#[test]
fn large_and_empty_requests_bypass_the_cache() {
    let c = Cache::new(1, CacheConfig::default().max_block_size(1 << 20));
    let a = c.s(0);
    let big = c.cache.allocate((1 << 20) + 1, a, T).unwrap();
    let empty = c.cache.allocate(0, a, T).unwrap();
    assert_eq!(
        c.inner.live_bytes(),
        (1 << 20) + 1,
        "exact size, not a class size"
    );
    let frees = c.gpu.call_count(DriverCall::FreeAsync);
    c.cache.deallocate(big).unwrap();
    c.cache.deallocate(empty).unwrap();
    assert_eq!(c.cache.cached_bytes(), 0);
    assert_eq!(c.gpu.call_count(DriverCall::FreeAsync), frees + 2);
    assert_eq!(c.cache.stats().bypasses, 2);
}

#[test]
fn streams_without_a_shard_bypass_the_cache() {
    let c = Cache::new(3, CacheConfig::default().streams(2));
    let block = c.cache.allocate(4096, c.s(2), T).unwrap();
    c.cache.deallocate(block).unwrap();
    assert_eq!(c.cache.cached_bytes(), 0);
    assert_eq!(c.cache.stats().bypasses, 1);
}

#[test]
fn cached_memory_is_released_before_out_of_memory() {
    let gpu = SimGpu::builder().manual().capacity(1 << 20).build();
    let c = Cache::on(gpu, 1, CacheConfig::default());
    let a = c.s(0);
    let x = c.cache.allocate(512 << 10, a, T).unwrap();
    let y = c.cache.allocate(512 << 10, a, T).unwrap();
    c.cache.deallocate(x).unwrap();
    c.cache.deallocate(y).unwrap();
    assert_eq!(c.cache.cached_bytes(), 1 << 20);
    // Another class: only fits once the cache gives its blocks back.
    let z = c.cache.allocate(768 << 10, a, T).unwrap();
    assert_eq!(c.cache.stats().trimmed, 2);
    assert_eq!(c.cache.cached_bytes(), 0);
    c.cache.deallocate(z).unwrap();

    // A request that cannot fit at all is reported, and changes nothing.
    let (cached, leased) = (c.cache.cached_bytes(), c.cache.leased_bytes());
    let err = c.cache.allocate(4 << 20, a, T).unwrap_err();
    assert!(matches!(err, ResourceError::OutOfMemory { .. }), "{err}");
    assert_eq!(c.cache.leased_bytes(), leased);
    assert!(c.cache.cached_bytes() <= cached);
    c.assert_race_free();
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let c = Cache::new(2, CacheConfig::default());
    let other = Cache::new(1, CacheConfig::default());
    let a = c.s(0);
    let block = c.cache.allocate(4096, a, T).unwrap();
    let freed = c.cache.allocate(4096, a, T).unwrap();
    c.cache.deallocate(freed.clone()).unwrap();
    let snapshot = || {
        (
            c.cache.cached_bytes(),
            c.cache.leased_bytes(),
            c.cache.stats(),
            c.inner.live_bytes(),
            c.gpu.call_count(DriverCall::AllocAsync),
            c.gpu.call_count(DriverCall::FreeAsync),
        )
    };
    let before = snapshot();

    let foreign = other.cache.allocate(4096, other.s(0), T).unwrap();
    assert!(matches!(
        c.cache.deallocate(foreign.clone()),
        Err(ResourceError::ForeignBlock { .. })
    ));
    let inner_block = c.inner.allocate(64, a, T).unwrap();
    let before_inner = (
        c.inner.live_bytes(),
        c.gpu.call_count(DriverCall::AllocAsync),
    );
    assert!(matches!(
        c.cache.deallocate(inner_block.clone()),
        Err(ResourceError::ForeignBlock { .. })
    ));
    assert!(matches!(
        c.cache.deallocate(freed.clone()),
        Err(ResourceError::DoubleFree { .. })
    ));
    assert!(matches!(
        c.cache.prepare_block_use(freed.id(), c.s(1), Access::Read),
        Err(ResourceError::DoubleFree { .. })
    ));
    assert!(matches!(
        c.cache.allocate(64, StreamId::new(0, 9), T),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert!(matches!(
        c.cache.allocate(64, StreamId::new(3, 0), T),
        Err(ResourceError::WrongDevice { .. })
    ));
    assert!(matches!(
        c.cache
            .prepare_block_use(block.id(), StreamId::new(0, 9), Access::Read),
        Err(ResourceError::ForeignStream { .. })
    ));
    // A forged descriptor: right id, wrong size.
    let forged = streamalloc::DeviceBlock::new(block.id(), block.ptr(), 8, a, T);
    assert!(matches!(
        c.cache.deallocate(forged),
        Err(ResourceError::UnknownBlock { .. })
    ));
    let never = streamalloc::BlockId::new(c.cache.resource_id(), 999 << 20);
    assert!(matches!(
        c.cache.finish_block_use(never, a, Access::Write),
        Err(ResourceError::UnknownBlock { .. })
    ));
    assert_eq!(c.cache.block_state(never), None);
    assert_eq!(
        (
            c.inner.live_bytes(),
            c.gpu.call_count(DriverCall::AllocAsync)
        ),
        before_inner
    );
    c.inner.deallocate(inner_block).unwrap();
    assert_eq!(snapshot().0, before.0);
    assert_eq!(snapshot().1, before.1);
    assert_eq!(snapshot().2, before.2);
    assert_eq!(c.cache.block_state(block.id()), Some(BlockState::Live));
    c.cache.deallocate(block).unwrap();
    other.cache.deallocate(foreign).unwrap();
}

#[test]
fn a_failed_free_leaves_the_lease_in_place() {
    let c = Cache::new(1, CacheConfig::default().max_cached_bytes(0));
    let a = c.s(0);
    let block = c.cache.allocate(4096, a, T).unwrap();
    c.gpu.fail_nth(DriverCall::FreeAsync, 1);
    assert!(matches!(
        c.cache.deallocate(block.clone()),
        Err(ResourceError::Driver { .. })
    ));
    assert_eq!(c.cache.block_state(block.id()), Some(BlockState::Live));
    assert_eq!(
        (c.cache.leased_bytes(), c.cache.stats().evictions),
        (4096, 0)
    );
    c.cache.deallocate(block).unwrap();
    assert_eq!((c.cache.leased_bytes(), c.cache.stats().evictions), (0, 1));
}

#[test]
fn threads_on_their_own_streams_share_one_cache() {
    let gpu = SimGpu::new();
    let c = Arc::new(Cache::on(gpu, 4, CacheConfig::default()));
    let rounds = common::scaled(500, 50);
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let s = c.s(t);
                let mut rng = fastrand::Rng::with_seed(t as u64);
                for _ in 0..rounds {
                    let block = c.cache.allocate(rng.usize(1..200_000), s, T).unwrap();
                    c.kernel(s, MemAccess::write(&block));
                    c.cache.deallocate(block).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let stats = c.cache.stats();
    assert_eq!(stats.hits + stats.steals + stats.misses, 4 * rounds as u64);
    assert!(stats.hits > 0);
    assert_eq!(c.cache.leased_bytes(), 0);
    c.cache.trim().unwrap();
    c.assert_race_free();
    c.inner.reap_pending().unwrap();
    assert_eq!(c.cache.bytes_outstanding(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn on_cuda_reuse_moves_and_trim_work() {
    let f = common::cuda(2);
    let cache = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().virtual_memory(false),
    );
    let (a, b) = (f.stream(0), f.stream(1));
    let block = cache.allocate(100_000, a, T).unwrap();
    let ptr = block.ptr();
    cache.deallocate(block).unwrap();
    let again = cache.allocate(100_000, a, T).unwrap();
    assert_eq!(again.ptr(), ptr, "same-stream reuse");
    cache
        .prepare_block_use(again.id(), b, Access::Write)
        .unwrap();
    cache
        .finish_block_use(again.id(), b, Access::Write)
        .unwrap();
    cache.deallocate(again).unwrap();
    // b has no free block of its own: it takes a's behind an event wait.
    let warm = cache.allocate(1 << 20, b, T).unwrap();
    let moved = cache.allocate(100_000, b, T).unwrap();
    assert_eq!(moved.ptr(), ptr);
    assert_eq!(cache.stats().steals, 1);
    cache.deallocate(moved).unwrap();
    cache.deallocate(warm).unwrap();
    assert!(cache.trim().unwrap() > 0);
    f.resource.reap_pending().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0);
}

#[test]
fn a_two_stage_pipeline_through_the_cache_is_race_free() {
    // Stage 1 writes on stream 0, stage 2 reads on stream 1 on another
    // thread and hands the block back; stage 1 frees it into the cache and
    // reuses it at once. Threaded progress, so the GPU runs meanwhile.
    let c = Arc::new(Cache::on(SimGpu::new(), 2, CacheConfig::default()));
    let (to_reader, from_writer) = std::sync::mpsc::channel::<streamalloc::DeviceBlock>();
    let (to_writer, from_reader) = std::sync::mpsc::channel::<streamalloc::DeviceBlock>();
    let reader = {
        let c = c.clone();
        std::thread::spawn(move || {
            let b = c.s(1);
            for block in from_writer {
                c.cache
                    .prepare_block_use(block.id(), b, Access::Read)
                    .unwrap();
                c.kernel(b, MemAccess::read(&block));
                c.cache
                    .finish_block_use(block.id(), b, Access::Read)
                    .unwrap();
                to_writer.send(block).unwrap();
            }
        })
    };
    let a = c.s(0);
    let items = common::scaled(300, 30);
    for i in 0..items {
        let block = c.cache.allocate(4096 * (1 + i % 3), a, T).unwrap();
        c.kernel(a, MemAccess::write(&block));
        c.cache
            .finish_block_use(block.id(), a, Access::Write)
            .unwrap();
        to_reader.send(block).unwrap();
        let back = from_reader.recv().unwrap();
        c.cache.deallocate(back).unwrap();
    }
    drop(to_reader);
    reader.join().unwrap();
    // Every item after the first of each size is a hit.
    assert!(
        c.cache.stats().hits >= items as u64 - 3,
        "{:?}",
        c.cache.stats()
    );
    c.assert_race_free();
}
