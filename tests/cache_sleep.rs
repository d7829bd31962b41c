//! Sleep and wake of the cache's arena on the simulated device: the pages
//! under the sleeping tags go back to the device and come back at the same
//! addresses, the work queued before the sleep completes first (the race
//! detector watches the unmap), a use while asleep is refused, and bad
//! input changes nothing. The simulator keeps no device contents: the
//! copies out and back are counted here, and `tests/sleep_cuda.rs` checks
//! the bytes on a GPU.

mod common;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{Access, AllocTag, DeviceMemoryResource, ResourceError};
use streamalloc::{CacheConfig, SleepMode, SleepPlan};

const WEIGHTS: AllocTag = AllocTag("weights");
const KV: AllocTag = AllocTag("kv");
const REQUEST: AllocTag = AllocTag("request");
const MIB: usize = 1 << 20;

use common::arena::ArenaCache as Cache;

impl Cache {
    fn new(streams: usize) -> Self {
        Self::manual(streams, CacheConfig::default())
    }

    fn copies(&self) -> u64 {
        self.gpu.call_count(DriverCall::MemcpyHostAsync)
    }
}

fn plan() -> SleepPlan {
    SleepPlan::new()
        .tag(WEIGHTS, SleepMode::Offload)
        .tag(KV, SleepMode::Discard)
}

#[test]
fn sleep_gives_the_pages_back_and_wake_maps_them_at_the_same_addresses() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    let kv = c.cache.allocate(4 * MIB, a, KV).unwrap();
    let request = c.cache.allocate(4096, a, REQUEST).unwrap();
    c.kernel(a, MemAccess::write(&weights));
    c.assert_race_free();
    let held = c.cache.physical_bytes();
    let host = c.gpu.host_bytes();

    c.cache.sleep(&plan()).unwrap();
    assert!(c.cache.is_asleep());
    let asleep = c.cache.physical_bytes();
    assert!(
        held - asleep >= 12 * MIB,
        "gave back {} B of {held} B",
        held - asleep
    );
    assert_eq!(c.copies(), 1, "the weights offloaded, the KV cache not");
    assert_eq!(c.gpu.host_bytes() - host, 8 * MIB, "pinned for the weights");
    // The other tag's block stays usable.
    c.cache
        .prepare_block_use(request.id(), a, Access::Write)
        .unwrap();
    c.kernel(a, MemAccess::write(&request));
    c.cache
        .finish_block_use(request.id(), a, Access::Write)
        .unwrap();

    let restores = c.cache.wake().unwrap();
    assert_eq!(restores, vec![a]);
    assert!(!c.cache.is_asleep());
    assert!(c.cache.physical_bytes() >= asleep + 12 * MIB);
    assert_eq!(c.copies(), 2, "the weights copied back");
    for b in [&weights, &kv] {
        c.cache.prepare_block_use(b.id(), a, Access::Write).unwrap();
        c.kernel(a, MemAccess::write(b));
        c.cache.finish_block_use(b.id(), a, Access::Write).unwrap();
    }
    c.assert_race_free();
    assert!(c.cache.settle_sleep().unwrap());
    assert_eq!(c.gpu.host_bytes(), host, "the host memory went back");
    for b in [weights, kv, request] {
        c.cache.deallocate(b).unwrap();
    }
    c.assert_race_free();
}

#[test]
fn zero_fills_at_the_wake_and_discard_queues_nothing() {
    let c = Cache::new(1);
    let a = c.s(0);
    let zeroed = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let dropped = c.cache.allocate(4 * MIB, a, KV).unwrap();
    let plan = SleepPlan::new()
        .tag(WEIGHTS, SleepMode::Zero)
        .tag(KV, SleepMode::Discard);
    c.cache.sleep(&plan).unwrap();
    let fills = c.gpu.call_count(DriverCall::MemsetAsync);
    c.cache.wake().unwrap();
    assert_eq!(c.gpu.call_count(DriverCall::MemsetAsync), fills + 1);
    assert_eq!(c.copies(), 0);
    c.cache.deallocate(zeroed).unwrap();
    c.cache.deallocate(dropped).unwrap();
    c.assert_race_free();
}

#[test]
fn a_use_while_asleep_is_refused_and_a_free_is_not() {
    let c = Cache::new(2);
    let (a, b) = (c.s(0), c.s(1));
    let weights = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let freed = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    c.cache.sleep(&plan()).unwrap();
    let asleep = |r: Result<(), ResourceError>| {
        assert!(
            matches!(r, Err(ResourceError::BlockAsleep { block }) if block == weights.id()),
            "{r:?}"
        )
    };
    asleep(c.cache.prepare_block_use(weights.id(), a, Access::Read));
    asleep(c.cache.prepare_block_use(weights.id(), b, Access::Write));
    asleep(c.cache.finish_block_use(weights.id(), b, Access::Write));
    asleep(c.cache.record_block_use(&weights, b));
    // A free while asleep goes through; the range is not restored, and no
    // block is placed on pages without memory.
    c.cache.deallocate(freed).unwrap();
    let fresh = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    c.cache
        .prepare_block_use(fresh.id(), a, Access::Write)
        .unwrap();
    c.kernel(a, MemAccess::write(&fresh));
    c.cache
        .finish_block_use(fresh.id(), a, Access::Write)
        .unwrap();
    c.cache.wake().unwrap();
    assert_eq!(
        c.copies(),
        3,
        "two out, one back: the freed block is not restored"
    );
    c.cache
        .prepare_block_use(weights.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&weights));
    c.cache
        .finish_block_use(weights.id(), b, Access::Read)
        .unwrap();
    c.cache.deallocate(weights).unwrap();
    c.cache.deallocate(fresh).unwrap();
    c.assert_race_free();
}

/// A launch between its `prepare_block_use` and `finish_block_use` may
/// have queued work on a stream the block's uses do not name yet, which a
/// sleep could not order its unmap after: the sleep is refused, changing
/// nothing, until the use is finished. It used to go ahead (the finish was
/// refused after the fact, with the kernel already queued on pages about
/// to lose their memory).
#[test]
fn a_sleep_is_refused_while_a_launch_on_a_sleeping_block_is_in_progress() {
    let c = Cache::new(2);
    let (a, b) = (c.s(0), c.s(1));
    let weights = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    c.cache
        .prepare_block_use(weights.id(), b, Access::Write)
        .unwrap();
    c.kernel(b, MemAccess::write(&weights));
    let held = c.cache.physical_bytes();
    let refused = c.cache.sleep(&plan());
    assert!(
        matches!(refused, Err(ResourceError::SleepRefused { .. })),
        "{refused:?}"
    );
    assert!(!c.cache.is_asleep());
    assert_eq!((c.cache.physical_bytes(), c.copies()), (held, 0));
    c.cache
        .finish_block_use(weights.id(), b, Access::Write)
        .unwrap();
    c.cache.sleep(&plan()).unwrap();
    assert!(c.cache.is_asleep());
    c.assert_race_free();
    c.cache.wake().unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn the_sleep_waits_for_work_queued_before_it_on_every_stream() {
    let c = Cache::new(2);
    let (a, b) = (c.s(0), c.s(1));
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    // Queued, not run (the simulator is manual): a write on the block's
    // stream and a read on another, through the hooks.
    c.kernel(a, MemAccess::write(&weights));
    c.cache
        .prepare_block_use(weights.id(), b, Access::Read)
        .unwrap();
    c.kernel(b, MemAccess::read(&weights));
    c.cache
        .finish_block_use(weights.id(), b, Access::Read)
        .unwrap();
    let held = c.cache.physical_bytes();
    let streams = c.cache.begin_sleep(&plan()).unwrap();
    assert_eq!(streams, vec![a]);
    assert!(!c.cache.settle_sleep().unwrap(), "the GPU has not run yet");
    assert_eq!(
        c.cache.physical_bytes(),
        held,
        "nothing unmapped under queued work"
    );
    c.gpu.run_until_idle();
    assert!(c.cache.settle_sleep().unwrap());
    assert!(c.cache.physical_bytes() + 8 * MIB <= held);
    // An unmap before the read on `b` completed would be reported here.
    c.assert_race_free();
    c.cache.wake().unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn a_wake_before_the_sleep_settled_keeps_the_memory() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    c.kernel(a, MemAccess::write(&weights));
    let held = c.cache.physical_bytes();
    c.cache.begin_sleep(&plan()).unwrap();
    c.cache.wake().unwrap();
    assert_eq!(c.cache.physical_bytes(), held, "never unmapped");
    c.cache
        .prepare_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.kernel(a, MemAccess::read(&weights));
    c.cache
        .finish_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.assert_race_free();
    assert!(c.cache.settle_sleep().unwrap());
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn pages_another_tag_shares_stay_mapped() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(4096, a, WEIGHTS).unwrap();
    let request = c.cache.allocate(4096, a, REQUEST).unwrap();
    let held = c.cache.physical_bytes();
    c.cache.sleep(&plan()).unwrap();
    assert_eq!(c.cache.physical_bytes(), held, "one page, shared: kept");
    assert!(matches!(
        c.cache.prepare_block_use(weights.id(), a, Access::Read),
        Err(ResourceError::BlockAsleep { .. })
    ));
    c.cache
        .prepare_block_use(request.id(), a, Access::Write)
        .unwrap();
    c.cache.wake().unwrap();
    c.cache
        .prepare_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.cache.deallocate(weights).unwrap();
    c.cache.deallocate(request).unwrap();
    c.assert_race_free();
}

#[test]
fn bad_input_changes_nothing() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let held = c.cache.physical_bytes();
    let refused = |r: Result<(), ResourceError>| {
        assert!(
            matches!(r, Err(ResourceError::SleepRefused { .. })),
            "{r:?}"
        );
        assert_eq!(c.cache.physical_bytes(), held);
        assert!(!c.cache.is_asleep());
        assert_eq!(c.copies(), 0);
    };
    refused(c.cache.sleep(&SleepPlan::new()));
    refused(c.cache.wake().map(drop));
    // A block of a named tag too large for the arena would be refused the
    // same way; one in the size classes (no arena at all) is:
    let classes = Cache::manual(1, CacheConfig::default().virtual_memory(false));
    let b = classes.cache.allocate(4096, classes.s(0), WEIGHTS).unwrap();
    let r = classes.cache.sleep(&plan());
    assert!(
        matches!(r, Err(ResourceError::SleepRefused { .. })),
        "{r:?}"
    );
    assert!(!classes.cache.is_asleep());
    classes
        .cache
        .prepare_block_use(b.id(), classes.s(0), Access::Read)
        .unwrap();
    // A second sleep while one is in effect.
    c.cache.sleep(&plan()).unwrap();
    let asleep = c.cache.physical_bytes();
    let again = c.cache.sleep(&SleepPlan::all(SleepMode::Discard));
    assert!(
        matches!(again, Err(ResourceError::SleepRefused { .. })),
        "{again:?}"
    );
    assert_eq!(c.cache.physical_bytes(), asleep);
    c.cache.wake().unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn a_failed_pin_changes_nothing() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let held = c.cache.physical_bytes();
    c.gpu.fail_nth(DriverCall::MemHostAlloc, 1);
    assert!(c.cache.sleep(&plan()).is_err());
    assert!(!c.cache.is_asleep());
    assert_eq!(c.cache.physical_bytes(), held);
    assert_eq!(c.gpu.host_bytes(), 0);
    c.cache
        .prepare_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn a_failed_offload_copy_leaves_every_block_awake() {
    let c = Cache::new(1);
    let a = c.s(0);
    let first = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let second = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    let held = c.cache.physical_bytes();
    // The first copy is queued, the second fails.
    c.gpu.fail_nth(DriverCall::MemcpyHostAsync, 2);
    assert!(c.cache.sleep(&plan()).is_err());
    assert!(!c.cache.is_asleep());
    assert_eq!(c.cache.physical_bytes(), held);
    for b in [&first, &second] {
        c.cache.prepare_block_use(b.id(), a, Access::Write).unwrap();
        c.kernel(a, MemAccess::write(b));
        c.cache.finish_block_use(b.id(), a, Access::Write).unwrap();
    }
    c.assert_race_free();
    // The host memory the queued copy wrote goes once it is seen done;
    // the other went at once.
    assert!(c.cache.settle_sleep().unwrap());
    assert_eq!(c.gpu.host_bytes(), 0);
    c.cache.deallocate(first).unwrap();
    c.cache.deallocate(second).unwrap();
    c.assert_race_free();
}

#[test]
fn a_wake_short_of_memory_stays_asleep_and_the_next_one_wakes() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    c.cache.sleep(&plan()).unwrap();
    let asleep = c.cache.physical_bytes();
    c.gpu.fail_nth(DriverCall::MemCreate, 1);
    assert!(c.cache.wake().is_err());
    assert!(c.cache.is_asleep());
    assert_eq!(c.cache.physical_bytes(), asleep);
    assert!(matches!(
        c.cache.prepare_block_use(weights.id(), a, Access::Read),
        Err(ResourceError::BlockAsleep { .. })
    ));
    c.cache.wake().unwrap();
    assert_eq!(c.copies(), 2);
    c.cache
        .prepare_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.kernel(a, MemAccess::read(&weights));
    c.cache
        .finish_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

#[test]
fn idle_cached_pages_go_back_at_the_sleep_too() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    let scratch = c.cache.allocate(8 * MIB, a, REQUEST).unwrap();
    c.kernel(a, MemAccess::write(&scratch));
    c.cache.deallocate(scratch).unwrap();
    c.gpu.run_until_idle();
    assert!(c.cache.physical_bytes() >= 16 * MIB);
    c.cache.sleep(&plan()).unwrap();
    assert_eq!(
        c.cache.physical_bytes(),
        0,
        "the weights' pages and the idle ones"
    );
    c.cache.wake().unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

/// Through the futures layer, on a device that runs on its own: the sleep
/// future completes once the host saw the work queued before it done, with
/// no thread parked, and the unmap after it is clean.
#[tokio::test(flavor = "current_thread")]
async fn the_async_sleep_awaits_the_queued_work() {
    use std::time::Duration;
    use streamalloc::AsyncResource;
    use streamalloc::{Device, ResourceBuilder};

    let gpu = SimGpu::builder()
        .op_latency(Duration::from_millis(2))
        .build();
    let device = Device::sim(&gpu, 2);
    let res = AsyncResource::build(
        &device,
        &ResourceBuilder::new().cache(CacheConfig::default()),
    )
    .unwrap();
    let (a, b) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let weights = res.allocate(8 * MIB, a, WEIGHTS).await.unwrap();
    for (s, access) in [(a, Access::Write), (b, Access::Read)] {
        res.prepare_block_use(weights.id(), s, access).unwrap();
        let raw = res.stream_pool().raw(s).unwrap();
        let use_ = match access {
            Access::Write => MemAccess::write(&weights),
            Access::Read => MemAccess::read(&weights),
        };
        gpu.launch_kernel(raw, &[use_]).unwrap();
        drop(res.finish_block_use(weights.id(), s, access).unwrap());
    }
    let held = res.inner().physical_bytes();
    res.sleep(&plan()).await.unwrap();
    assert!(res.inner().physical_bytes() + 8 * MIB <= held);
    res.wake().await.unwrap();
    res.prepare_block_use(weights.id(), b, Access::Read)
        .unwrap();
    drop(res.deallocate(weights).unwrap());
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

/// The cache sleeps wherever it sits in a stack: the decorators above it
/// forward the sleep; a stack with no cache refuses it, changing nothing.
#[tokio::test(flavor = "current_thread")]
async fn a_stack_sleeps_through_its_decorators_and_one_without_a_cache_refuses() {
    use streamalloc::AsyncResource;
    use streamalloc::Budget;
    use streamalloc::{Device, ResourceBuilder};

    let device = Device::sim(&SimGpu::new(), 1);
    let layers = ResourceBuilder::new()
        .stats()
        .retry_on_oom()
        .budget(&Budget::new(1 << 30))
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let weights = res.allocate(8 * MIB, s, WEIGHTS).await.unwrap();
    let held = res.bytes_outstanding();
    res.sleep(&plan()).await.unwrap();
    assert!(res.bytes_outstanding() + 8 * MIB <= held);
    assert!(matches!(
        res.prepare_block_use(weights.id(), s, Access::Read),
        Err(ResourceError::BlockAsleep { .. })
    ));
    res.wake().await.unwrap();
    res.prepare_block_use(weights.id(), s, Access::Read)
        .unwrap();
    drop(res.deallocate(weights).unwrap());

    let plain = AsyncResource::on(&device).unwrap();
    let block = plain.allocate(MIB, s, WEIGHTS).await.unwrap();
    let r = plain.sleep(&plan()).await;
    assert!(
        matches!(r, Err(ResourceError::SleepRefused { .. })),
        "{r:?}"
    );
    assert!(matches!(
        plain.wake().await,
        Err(ResourceError::SleepRefused { .. })
    ));
    plain
        .prepare_block_use(block.id(), s, Access::Read)
        .unwrap();
    drop(plain.deallocate(block).unwrap());
}

/// A lender that hands out a host pool's blocks and remembers them, so
/// that a test can touch what it lent.
#[derive(Debug)]
struct Recording {
    pool: streamalloc::HostPool,
    lent: std::sync::Mutex<Vec<streamalloc::gpu::HostMemory>>,
}

// SAFETY: every method forwards to the pool's own implementation, whose
// contract holds; the addresses are only remembered.
unsafe impl streamalloc::OffloadHost for Recording {
    fn lend(
        &self,
        bytes: usize,
        tag: AllocTag,
    ) -> streamalloc::ResourceResult<streamalloc::gpu::HostMemory> {
        let mem = self.pool.lend(bytes, tag)?;
        self.lent.lock().unwrap().push(mem);
        Ok(mem)
    }

    unsafe fn take_back(&self, memory: streamalloc::gpu::HostMemory, tag: AllocTag) {
        // SAFETY: the caller's claim, passed on.
        unsafe { self.pool.take_back(memory, tag) }
    }

    fn pins_for(&self, gpu: &dyn streamalloc::gpu::Gpu) -> bool {
        self.pool.pins_for(gpu)
    }
}

fn host_pool(c: &Cache, config: streamalloc::HostPoolConfig) -> streamalloc::HostPool {
    let gpu: std::sync::Arc<dyn streamalloc::gpu::Gpu> = c.gpu.clone();
    streamalloc::HostPool::with_gpu(gpu, config)
}

#[test]
fn offloads_borrow_from_a_host_pool_and_repeated_cycles_pin_nothing_new() {
    use streamalloc::OffloadHost as _;
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    let kv = c.cache.allocate(4 * MIB, a, KV).unwrap();
    c.kernel(a, MemAccess::write(&weights));
    let pool = host_pool(&c, streamalloc::HostPoolConfig::new());
    assert!(pool.pins_for(&*c.gpu));
    let plan = plan().offload_to(pool.clone());
    let mut pinned = None;
    for cycle in 0..3u64 {
        c.cache.sleep(&plan).unwrap();
        let st = pool.stats();
        assert_eq!(
            st.in_use_bytes,
            8 * MIB,
            "cycle {cycle}: the weights' block lent"
        );
        let tag = st.tags.iter().find(|(t, _)| *t == WEIGHTS).map(|(_, s)| *s);
        assert_eq!(
            tag.map(|t| t.current_bytes),
            Some(8 * MIB),
            "counted under the tag"
        );
        assert_eq!(
            (st.pins, st.reuses),
            (1, cycle),
            "cycle {cycle}: pinned once"
        );
        assert_eq!(
            *pinned.get_or_insert(c.gpu.host_bytes()),
            c.gpu.host_bytes()
        );

        c.cache.wake().unwrap();
        c.gpu.run_until_idle();
        // The host sees the copy back complete: the block goes back idle.
        assert!(c.cache.settle_sleep().unwrap());
        let st = pool.stats();
        assert_eq!(
            (st.in_use_bytes, st.idle_bytes),
            (0, 8 * MIB),
            "cycle {cycle}"
        );
        for b in [&weights, &kv] {
            c.cache.prepare_block_use(b.id(), a, Access::Write).unwrap();
            c.kernel(a, MemAccess::write(b));
            c.cache.finish_block_use(b.id(), a, Access::Write).unwrap();
        }
    }
    assert_eq!(c.copies(), 6, "three offloads and three restores");
    // The host takes the block the sleeps used, and writes it: its copies
    // were seen complete, so the race detector finds nothing.
    let mut staged = pool.allocate::<u8>(8 * MIB, REQUEST).unwrap();
    staged.as_mut_slice().unwrap().fill(1);
    assert_eq!(pool.stats().pins, 1, "the same block");
    drop(staged);
    c.cache.deallocate(weights).unwrap();
    c.cache.deallocate(kv).unwrap();
    c.assert_race_free();
}

#[test]
fn the_race_detector_sees_the_host_touch_an_offload_before_its_copy_ran() {
    use streamalloc::gpu::Gpu as _;
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(4 * MIB, a, WEIGHTS).unwrap();
    c.kernel(a, MemAccess::write(&weights));
    c.assert_race_free();
    let lender = std::sync::Arc::new(Recording {
        pool: host_pool(&c, streamalloc::HostPoolConfig::new()),
        lent: Default::default(),
    });
    let plan = plan().offload_to(lender.clone());
    // Queued, not run (a manual device): the copy out may still write it.
    c.cache.begin_sleep(&plan).unwrap();
    let lent = lender.lent.lock().unwrap()[0];
    c.gpu.note_host_access(lent.addr, Access::Write);
    c.gpu.run_until_idle();
    assert!(
        !c.gpu.races().is_empty(),
        "a host write under the offload copy must be reported"
    );
    c.cache.wake().unwrap();
    c.cache.deallocate(weights).unwrap();
}

#[test]
fn a_host_pool_over_its_cap_or_of_another_device_changes_nothing() {
    let c = Cache::new(1);
    let a = c.s(0);
    let weights = c.cache.allocate(8 * MIB, a, WEIGHTS).unwrap();
    let held = c.cache.physical_bytes();
    let small = host_pool(&c, streamalloc::HostPoolConfig::new().cap(4 * MIB));
    let full = c.cache.sleep(&plan().offload_to(small.clone()));
    assert!(
        matches!(full, Err(ResourceError::HostPoolFull { .. })),
        "{full:?}"
    );
    let other_gpu: std::sync::Arc<dyn streamalloc::gpu::Gpu> = SimGpu::new();
    let other = streamalloc::HostPool::with_gpu(other_gpu, streamalloc::HostPoolConfig::new());
    let foreign = c.cache.sleep(&plan().offload_to(other.clone()));
    assert!(
        matches!(foreign, Err(ResourceError::ForeignHostBuffer)),
        "{foreign:?}"
    );
    for pool in [&small, &other] {
        let st = pool.stats();
        assert_eq!((st.held_bytes, st.in_use_bytes), (0, 0));
    }
    assert!(!c.cache.is_asleep());
    assert_eq!(c.cache.physical_bytes(), held);
    assert_eq!(c.gpu.host_bytes(), 0);
    c.cache
        .prepare_block_use(weights.id(), a, Access::Read)
        .unwrap();
    c.cache.deallocate(weights).unwrap();
    c.assert_race_free();
}

/// The driver calls between two snapshots, by kind.
fn calls_since(c: &Cache, before: &[u64]) -> impl Fn(DriverCall) -> u64 {
    let now: Vec<u64> = DriverCall::ALL
        .iter()
        .map(|&k| c.gpu.call_count(k))
        .collect();
    let before = before.to_vec();
    move |k| {
        let i = DriverCall::ALL.iter().position(|&x| x == k).unwrap();
        now[i] - before[i]
    }
}

fn call_counts(c: &Cache) -> Vec<u64> {
    DriverCall::ALL
        .iter()
        .map(|&k| c.gpu.call_count(k))
        .collect()
}

/// What a wake costs in driver calls: one new handle mapped (create, map,
/// set access) per handle the sleep released, never page by page; one
/// copy back per offloaded block, queued without a synchronize. Pinned
/// per block, the offloads are unpinned at the wake's end (what made a
/// wake 4.5x allocating and copying in on an H100); borrowed from a warm
/// host pool, neither the sleep pins nor the wake unpins anything.
#[test]
fn a_wake_maps_per_released_handle_and_with_a_pool_pins_and_unpins_nothing() {
    let c = Cache::new(1);
    let a = c.s(0);
    let blocks: Vec<_> = (0..8)
        .map(|i| {
            let tag = if i < 6 { WEIGHTS } else { KV };
            c.cache.allocate(64 * MIB, a, tag).unwrap()
        })
        .collect();
    let pages = 8 * 64 * MIB / streamalloc::gpu::Gpu::vm_granularity(&*c.gpu).unwrap();
    let pool = host_pool(&c, streamalloc::HostPoolConfig::new());
    let pooled = plan().offload_to(pool.clone());
    for (cycle, p) in [plan(), pooled.clone(), pooled].iter().enumerate() {
        let before = call_counts(&c);
        c.cache.sleep(p).unwrap();
        let slept = calls_since(&c, &before);
        let released = slept(DriverCall::MemRelease);
        assert_eq!(slept(DriverCall::MemUnmap), released);
        assert!(
            (1..=blocks.len() as u64).contains(&released),
            "cycle {cycle}: {released} handles released for {} blocks",
            blocks.len()
        );
        assert_eq!(
            slept(DriverCall::MemcpyHostAsync),
            6,
            "the weights offloaded"
        );
        let pins = slept(DriverCall::MemHostAlloc);
        match cycle {
            0 | 1 => assert_eq!(pins, 6, "cycle {cycle}: pinned for the weights"),
            _ => assert_eq!(pins, 0, "a warm pool pins nothing"),
        }

        let before = call_counts(&c);
        c.cache.wake().unwrap();
        c.gpu.run_until_idle();
        assert!(c.cache.settle_sleep().unwrap());
        let woke = calls_since(&c, &before);
        for k in [
            DriverCall::MemCreate,
            DriverCall::MemMap,
            DriverCall::MemSetAccess,
        ] {
            assert_eq!(
                woke(k),
                released,
                "cycle {cycle}: {k:?} once per released handle"
            );
        }
        assert!((released as usize) < pages, "never page by page");
        assert_eq!(
            woke(DriverCall::MemcpyHostAsync),
            6,
            "one copy back per block"
        );
        for k in [DriverCall::StreamSynchronize, DriverCall::EventSynchronize] {
            assert_eq!(
                woke(k),
                0,
                "cycle {cycle}: the wake waits for nothing ({k:?})"
            );
        }
        assert_eq!(woke(DriverCall::MemHostAlloc), 0);
        let unpins = woke(DriverCall::MemFreeHost);
        match cycle {
            0 => assert_eq!(unpins, 6, "pinned per block: unpinned at the wake"),
            _ => assert_eq!(unpins, 0, "cycle {cycle}: back to the pool, not unpinned"),
        }
    }
    for b in blocks {
        c.cache.deallocate(b).unwrap();
    }
    c.assert_race_free();
}
