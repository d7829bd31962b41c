//! Budget: a shared byte limit that counts blocks until their free executed.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceMemoryResource, ResourceError};
use streamalloc::{Budget, BudgetResource, DebugGuardResource, GuardConfig};
use support::NoTracking;

const T: AllocTag = AllocTag("test");

#[test]
fn bad_input_changes_nothing() {
    let budget = Budget::new(1 << 20);
    support::check_bad_input(
        |inner| BudgetResource::new(inner, &budget),
        |r| (r.budget().in_use(), r.charged(), r.budget().peak()),
    );
}

#[test]
fn forwards_what_it_does_not_change() {
    let budget = Budget::new(1 << 30);
    support::check_forwarding(|inner| BudgetResource::new(inner, &budget), |_| {});
    assert_eq!(budget.in_use(), 0, "every byte came back through the reaps");
    let f = support::sim(1);
    let r = BudgetResource::new(NoTracking(f.resource.clone()), &budget);
    assert!(!r.supports_block_use_tracking());
}

#[test]
fn over_the_limit_is_refused_and_changes_nothing() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let budget = Budget::new(1000);
    let r = BudgetResource::new(f.resource.clone(), &budget);
    let _held = r.allocate(600, f.stream(0), T).unwrap();
    let allocs = gpu.call_count(DriverCall::AllocAsync);

    let err = r.allocate(600, f.stream(0), T).unwrap_err();
    assert_eq!(
        err,
        ResourceError::BudgetExceeded {
            requested: 600,
            limit: 1000,
            in_use: 600
        }
    );
    assert_eq!(budget.in_use(), 600);
    assert_eq!(r.charged(), 600);
    assert_eq!(f.resource.live_bytes(), 600);
    assert_eq!(
        gpu.call_count(DriverCall::AllocAsync),
        allocs,
        "inner not asked"
    );
    // An overflowing request is refused the same way.
    assert!(matches!(
        r.allocate(usize::MAX, f.stream(0), T),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    assert_eq!(budget.in_use(), 600);
    // Exactly up to the limit is fine.
    let _kept = r.allocate(400, f.stream(0), T).unwrap();
    assert_eq!(budget.in_use(), 1000);
}

#[test]
fn a_block_counts_until_its_free_has_executed() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let budget = Budget::new(1000);
    let r = BudgetResource::new(f.resource.clone(), &budget);
    let s = f.stream(0);

    let block = r.allocate(700, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(budget.in_use(), 700, "queued free still counts");
    assert!(matches!(
        r.allocate(700, s, T),
        Err(ResourceError::BudgetExceeded { in_use: 700, .. })
    ));

    // reap_through after the stream ran the free: released by what drained.
    let seq = r.pending_free_seq(s);
    gpu.run_until_idle();
    assert_eq!(r.reap_through(s, seq), 700);
    assert_eq!(budget.in_use(), 0);

    // reap_pending releases too.
    let block = r.allocate(700, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(budget.in_use(), 700);
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
    assert_eq!(r.charged(), 0);
}

#[test]
fn a_failed_inner_allocation_releases_the_reservation() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let budget = Budget::new(1000);
    let r = BudgetResource::new(f.resource.clone(), &budget);
    gpu.fail_nth(DriverCall::AllocAsync, 1);
    assert!(matches!(
        r.allocate(500, f.stream(0), T),
        Err(ResourceError::Driver {
            call: DriverCall::AllocAsync,
            ..
        })
    ));
    assert_eq!(budget.in_use(), 0);
    assert_eq!(r.charged(), 0);
    assert_eq!(f.resource.live_bytes(), 0);
    // A stream of no pool is refused by the inner, and releases too.
    let bad = streamalloc::StreamId::new(0, 99);
    assert!(matches!(
        r.allocate(500, bad, T),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn one_budget_spans_resources_and_devices() {
    let d0 = support::sim_with(SimGpu::builder().manual().ordinal(0).build(), 1);
    let d1 = support::sim_with(SimGpu::builder().manual().ordinal(1).build(), 1);
    let budget = Budget::new(1000);
    let r0 = BudgetResource::new(d0.resource.clone(), &budget);
    let r1 = BudgetResource::new(d1.resource.clone(), &budget);
    let b0 = r0.allocate(600, d0.stream(0), T).unwrap();
    assert!(matches!(
        r1.allocate(600, d1.stream(0), T),
        Err(ResourceError::BudgetExceeded { in_use: 600, .. })
    ));
    let b1 = r1.allocate(400, d1.stream(0), T).unwrap();
    assert_eq!(budget.in_use(), 1000);
    assert_eq!(b1.device(), 1);
    r0.deallocate(b0).unwrap();
    r0.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 400, "only device 0's bytes came back");
    r1.deallocate(b1).unwrap();
    r1.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn a_quarantine_below_stays_counted_until_really_freed() {
    let f = support::sim(1);
    let budget = Budget::new(1 << 20);
    let r = BudgetResource::new(
        DebugGuardResource::new(f.resource.clone(), GuardConfig::new()),
        &budget,
    );
    let block = r.allocate(4096, f.stream(0), T).unwrap();
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 4096, "quarantined: still on the device");
    r.inner().flush().unwrap();
    assert_eq!(budget.in_use(), 4096, "free queued, not executed");
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
}

#[test]
fn sixteen_racing_threads_never_overshoot() {
    const LIMIT: usize = 10 * 1000;
    let f = support::sim_with(SimGpu::new(), 16);
    let budget = Budget::new(LIMIT);
    let r = Arc::new(BudgetResource::new(f.resource.clone(), &budget));
    let refused = Arc::new(AtomicUsize::new(0));
    let max_seen = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let (r, budget) = (r.clone(), budget.clone());
            let (refused, max_seen) = (refused.clone(), max_seen.clone());
            let stream = f.stream(t);
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..300 {
                    match r.allocate(500 + (i % 7) * 100, stream, T) {
                        Ok(b) => {
                            max_seen.fetch_max(budget.in_use(), Ordering::AcqRel);
                            held.push(b);
                        }
                        Err(ResourceError::BudgetExceeded { .. }) => {
                            refused.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(e) => panic!("{e}"),
                    }
                    if held.len() > 2 {
                        r.deallocate(held.remove(0)).unwrap();
                    }
                    if i % 5 == 0 {
                        r.reap_pending().unwrap();
                    }
                }
                for b in held {
                    r.deallocate(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(max_seen.load(Ordering::Acquire) <= LIMIT);
    assert!(budget.peak() <= LIMIT, "peak {}", budget.peak());
    assert!(refused.load(Ordering::Acquire) > 0, "the test must contend");
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

/// A resource whose `bytes_outstanding` reads high while `extra` is set, as
/// the stream-ordered resource's sum of per-shard counts may when other
/// threads allocate and reap on other shards between its loads (seen on the
/// H200: 16 threads on 16 streams pushed the budget's peak past its limit).
struct Overcounting<R> {
    inner: R,
    extra: AtomicUsize,
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it (only the count it reports is high).
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Overcounting<R> {
    streamalloc::forward_to_inner!(inner; supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams, allocation_limit, budget_reliefs, capture_status, release_capture);
    fn allocate(
        &self,
        bytes: usize,
        s: streamalloc::StreamId,
        tag: AllocTag,
    ) -> streamalloc::ResourceResult<streamalloc::DeviceBlock> {
        self.inner.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: streamalloc::DeviceBlock) -> streamalloc::ResourceResult<()> {
        self.inner.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding() + self.extra.load(Ordering::Acquire)
    }
    fn reap_pending(&self) -> streamalloc::ResourceResult<()> {
        self.inner.reap_pending()
    }
    fn pending_free_seq(&self, stream: streamalloc::StreamId) -> u64 {
        self.inner.pending_free_seq(stream)
    }
    fn reap_through(&self, stream: streamalloc::StreamId, seq: u64) -> usize {
        self.inner.reap_through(stream, seq)
    }
    fn block_state(&self, block: streamalloc::BlockId) -> Option<streamalloc::BlockState> {
        self.inner.block_state(block)
    }
}

#[test]
fn an_overcounting_read_below_never_charges_the_budget_past_its_limit() {
    const MIB: usize = 1 << 20;
    let f = support::sim(1);
    let s = f.stream(0);
    let inner = Overcounting {
        inner: f.resource.clone(),
        extra: AtomicUsize::new(0),
    };
    let budget = Budget::new(2 * MIB);
    let r = BudgetResource::new(inner, &budget);

    // A racing reader's view: 3 MiB more than is really outstanding.
    r.inner().extra.store(3 * MIB, Ordering::Release);
    let block = r.allocate(MIB, s, AllocTag("overcount")).unwrap();
    assert_eq!(budget.in_use(), MIB, "the budget counts what was taken");
    assert!(
        budget.peak() <= 2 * MIB,
        "peak {} past the limit",
        budget.peak()
    );

    r.inner().extra.store(0, Ordering::Release);
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
}

/// A budget counts device bytes: above the cache's arena, a 4 KiB request
/// takes a 2 MiB page. A budget of 4 KiB refuses it with the numbers it
/// compared (the page, not the caller's 4 KiB, which used to make the error
/// contradict itself: `requested: 4096, limit: 4096, in_use: 0`), and the
/// futures layer fails it at once instead of waiting for a page that can
/// never fit.
#[test]
fn a_refusal_reports_the_device_bytes_it_compared() {
    use streamalloc::{AsyncResource, Device, ResourceBuilder};
    use streamalloc::{CacheConfig, CachingResource};
    const PAGE: usize = 2 << 20;

    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let s = f.stream(0);
    let small = Budget::new(4096);
    let r = BudgetResource::new(CachingResource::new(f.resource.clone()), &small);
    assert_eq!(
        r.allocate(4096, s, T).unwrap_err(),
        ResourceError::BudgetExceeded {
            requested: PAGE,
            limit: 4096,
            in_use: 0
        }
    );
    assert_eq!((small.in_use(), gpu.physical_bytes()), (0, 0));

    // What it counts is what the device holds.
    let roomy = Budget::new(2 * PAGE);
    let r = BudgetResource::new(CachingResource::new(f.resource.clone()), &roomy);
    let block = r.allocate(4096, s, T).unwrap();
    assert_eq!(roomy.in_use(), PAGE);
    assert_eq!(roomy.in_use(), gpu.physical_bytes());
    r.deallocate(block).unwrap();
    drop(r);
    assert_eq!(roomy.in_use(), 0);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gpu = SimGpu::new();
    let device = Device::simulated(&gpu, 1);
    let layers = ResourceBuilder::new()
        .budget(&small)
        .cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let out = rt.block_on(async {
        tokio::time::timeout(support::guard(5), res.allocate(4096, s, T)).await
    });
    assert_eq!(
        out.expect("a request that can never fit waited"),
        Err(ResourceError::BudgetExceeded {
            requested: PAGE,
            limit: 4096,
            in_use: 0
        })
    );
}

/// One budget over two devices, each with the default cache (its arena)
/// under its budget resource: an allocation waiting on device 1 is served
/// from the pages device 0's cache holds idle, which the refusal asks it
/// to give back. It used to wait for good: nothing asked a sibling.
#[test]
fn a_waiter_is_served_by_idle_memory_cached_on_another_device() {
    use streamalloc::CacheConfig;
    use streamalloc::{AsyncResource, Device, ResourceBuilder};
    const PAGE: usize = 2 << 20;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gpus = [0, 1].map(|o| SimGpu::builder().ordinal(o).build());
    let budget = Budget::new(2 * PAGE);
    let layers = ResourceBuilder::new()
        .budget(&budget)
        .cache(CacheConfig::default());
    let devices = gpus.each_ref().map(|g| Device::simulated(g, 1));
    let res = devices
        .each_ref()
        .map(|d| AsyncResource::build(d, &layers).unwrap());
    let streams = devices.each_ref().map(|d| d.stream(0).unwrap());

    rt.block_on(async {
        let block = res[0].allocate(2 * PAGE, streams[0], T).await.unwrap();
        res[0].deallocate(block).unwrap().await.unwrap();
        assert_eq!(budget.in_use(), 2 * PAGE, "device 0 caches its pages");
        let served =
            tokio::time::timeout(support::guard(10), res[1].allocate(2 * PAGE, streams[1], T))
                .await
                .expect("the waiter on device 1 was never served")
                .unwrap();
        assert_eq!(gpus[0].physical_bytes(), 0, "device 0 gave its pages back");
        assert_eq!(budget.in_use(), 2 * PAGE);
        res[1].deallocate(served).unwrap().await.unwrap();
    });
    for g in &gpus {
        assert!(g.races().is_empty());
    }
}

/// The same with the cache above the budget, as the README and the service
/// example stack it (`cache().retry_on_oom().budget()`): the budget cannot
/// see a cache above it, so the stack on each device registers whole with
/// the budget, and a refusal on device 1 asks device 0's stack for its
/// idle blocks. Device 1's waiter used to wait for good.
#[test]
fn a_waiter_is_served_by_idle_memory_of_a_cache_above_the_budget_on_another_device() {
    use streamalloc::CacheConfig;
    use streamalloc::{AsyncResource, ResourceBuilder};

    waiter_on_device_1_is_served_by_device_0s_cache(|device, budget| {
        let layers = ResourceBuilder::new()
            .cache(CacheConfig::default())
            .retry_on_oom()
            .budget(budget);
        AsyncResource::build(device, &layers).unwrap()
    });
}

/// The same stack put together by hand and wrapped by `with_device`: the
/// stack reports the budgets it charges (`budget_reliefs`, forwarded by
/// every layer), so it registers as a built one does. It used to be the
/// documented limit: only `AsyncResource::build` registered the stack,
/// and device 1's waiter waited for good.
#[test]
fn a_hand_built_stack_with_a_cache_above_the_budget_serves_another_devices_waiter() {
    use streamalloc::CachingResource;
    use streamalloc::RetryOnOomResource;
    use streamalloc::{AsyncResource, StreamOrderedResource};

    waiter_on_device_1_is_served_by_device_0s_cache(|device, budget| {
        let stack = CachingResource::new(RetryOnOomResource::new(BudgetResource::new(
            StreamOrderedResource::new(device),
            budget,
        )));
        // SAFETY: the bottom of the stack was made on `device`, and every
        // layer allocates and resolves streams through it.
        unsafe { AsyncResource::with_device(stack, device) }.unwrap()
    });
}

/// One budget of one 2 MiB block over two simulated devices, each with the
/// stack `make` puts over it: device 0 allocates the block and frees it
/// (its cache keeps it), then device 1 waits for a block of the same size,
/// which must be served by device 0's cache giving its idle block back.
fn waiter_on_device_1_is_served_by_device_0s_cache<R, F>(make: F)
where
    R: DeviceMemoryResource + 'static,
    F: Fn(&streamalloc::Device<SimGpu>, &Budget) -> streamalloc::AsyncResource<R>,
{
    use streamalloc::Device;
    const BLOCK: usize = 2 << 20;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let gpus = [0, 1].map(|o| SimGpu::builder().ordinal(o).build());
    let budget = Budget::new(BLOCK);
    let devices = gpus.each_ref().map(|g| Device::simulated(g, 1));
    let res = devices.each_ref().map(|d| make(d, &budget));
    let streams = devices.each_ref().map(|d| d.stream(0).unwrap());

    rt.block_on(async {
        let block = res[0].allocate(BLOCK, streams[0], T).await.unwrap();
        res[0].deallocate(block).unwrap().await.unwrap();
        assert_eq!(budget.in_use(), BLOCK, "device 0 caches its block");
        let served =
            tokio::time::timeout(support::guard(10), res[1].allocate(BLOCK, streams[1], T))
                .await
                .expect("the waiter on device 1 was never served")
                .unwrap();
        assert_eq!(gpus[0].held_bytes(), 0, "device 0 gave its block back");
        assert_eq!(budget.in_use(), BLOCK);
        res[1].deallocate(served).unwrap().await.unwrap();
    });
    for g in &gpus {
        assert!(g.races().is_empty());
    }
}

/// The same with size classes, called from a plain thread: a refusal on
/// device 1 asks device 0's cache to free its idle blocks, reaps them (off
/// a poll, as the cache does for its own on a refusal), and tries once
/// more. It used to be refused while device 0 held the bytes idle.
#[test]
fn a_refusal_frees_idle_blocks_cached_on_another_device() {
    use streamalloc::{CacheConfig, CachingResource};
    let d = [0, 1].map(|o| support::sim_with(SimGpu::builder().manual().ordinal(o).build(), 1));
    let budget = Budget::new(1 << 20);
    let r = d.each_ref().map(|f| {
        BudgetResource::new(
            CachingResource::with_config(
                f.resource.clone(),
                CacheConfig::default().virtual_memory(false),
            ),
            &budget,
        )
    });
    let idle = r[0].allocate(1 << 20, d[0].stream(0), T).unwrap();
    r[0].deallocate(idle).unwrap();
    assert_eq!(budget.in_use(), 1 << 20, "cached on device 0");
    let block = r[1].allocate(1 << 20, d[1].stream(0), T).unwrap();
    assert_eq!(r[0].inner().cached_bytes(), 0);
    assert_eq!(d[0].resource.bytes_outstanding(), 0);
    assert_eq!(budget.in_use(), 1 << 20);
    r[1].deallocate(block).unwrap();
    assert!(d.iter().all(|f| f.sim.as_ref().unwrap().races().is_empty()));
}

/// A budget over another budget over a size-class cache: the inner
/// budget's refusal makes the cache give its idle block back, and the
/// request is still refused. The outer budget stops counting the block
/// then, not at its next reap: a budget counts what the device holds
/// below it. It used to keep the block counted until a later call.
#[test]
fn a_refusal_below_that_gave_memory_back_leaves_the_outer_budget_too() {
    use streamalloc::{CacheConfig, CachingResource};
    let f = support::sim(2);
    let (outer, inner) = (Budget::new(4 << 20), Budget::new(1 << 20));
    let cache = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().virtual_memory(false),
    );
    let r = BudgetResource::new(BudgetResource::new(cache, &inner), &outer);
    let idle = r.allocate(1, f.stream(1), T).unwrap();
    r.deallocate(idle).unwrap();
    r.reap_pending().unwrap();
    let held = r.allocate(100, f.stream(0), T).unwrap();
    let cached = r.inner().inner().cached_bytes();
    assert!(cached > 0, "the freed block is cached");
    assert_eq!(outer.in_use(), r.inner().inner().bytes_outstanding());
    let refused = r.allocate(1 << 20, f.stream(0), T);
    assert!(
        matches!(refused, Err(ResourceError::BudgetExceeded { .. })),
        "{refused:?}"
    );
    assert_eq!(
        r.inner().inner().cached_bytes(),
        0,
        "the refusal emptied the cache"
    );
    let below = r.inner().inner().bytes_outstanding();
    assert_eq!(inner.in_use(), below, "the inner budget");
    assert_eq!(outer.in_use(), below, "the outer budget");
    r.deallocate(held).unwrap();
    r.reap_pending().unwrap();
    r.release_idle().unwrap();
    r.reap_pending().unwrap();
    assert_eq!((inner.in_use(), outer.in_use()), (0, 0));
}

/// Below a budget: counts the reads of `bytes_outstanding`, and, with
/// `drains`, reaps right after each free (the GPU run first), as a resource
/// that frees at once would, saying so through `frees_only_queue`.
struct CountsReads<R> {
    inner: R,
    gpu: Arc<SimGpu>,
    drains: bool,
    reads: AtomicUsize,
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it (a free is followed by a reap with `drains`).
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for CountsReads<R> {
    streamalloc::forward_to_inner!(inner; device_ordinal, deallocate_completed, reap_pending,
        pending_free_seq, reap_through, release_idle, frees_across_streams, use_tracking,
        capture, costs, sleep, observing);
    fn allocate(
        &self,
        bytes: usize,
        s: streamalloc::StreamId,
        tag: AllocTag,
    ) -> streamalloc::ResourceResult<streamalloc::DeviceBlock> {
        self.inner.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: streamalloc::DeviceBlock) -> streamalloc::ResourceResult<()> {
        self.inner.deallocate(block)?;
        if self.drains {
            self.gpu.run_until_idle();
            self.inner.reap_pending()?;
        }
        Ok(())
    }
    fn bytes_outstanding(&self) -> usize {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.bytes_outstanding()
    }
    fn frees_only_queue(&self) -> bool {
        !self.drains && self.inner.frees_only_queue()
    }
}

fn counting_reads(
    drains: bool,
) -> (
    support::Fixture<SimGpu>,
    Budget,
    BudgetResource<CountsReads<Arc<streamalloc::SimResource>>>,
) {
    let f = support::sim(1);
    let inner = CountsReads {
        inner: f.resource.clone(),
        gpu: f.sim.clone().unwrap(),
        drains,
        reads: AtomicUsize::new(0),
    };
    let budget = Budget::new(1 << 20);
    let r = BudgetResource::new(inner, &budget);
    (f, budget, r)
}

/// The pair's hot path over the stream-ordered resource: its cost is exact
/// and its frees only queue, so the budget reads nothing below, and the
/// bytes leave the budget when the reap drains them, not before.
#[test]
fn a_budget_reads_nothing_below_a_pair_whose_free_only_queues() {
    let (f, budget, r) = counting_reads(false);
    let s = f.stream(0);
    assert!(
        r.frees_only_queue(),
        "the stream-ordered resource's frees queue"
    );
    for _ in 0..3 {
        let block = r.allocate(700, s, T).unwrap();
        r.deallocate(block).unwrap();
    }
    assert_eq!(r.inner().reads.load(Ordering::Relaxed), 0);
    assert_eq!(budget.in_use(), 2100, "three queued frees still count");
    f.sim.as_ref().unwrap().run_until_idle();
    r.reap_pending().unwrap();
    assert_eq!(budget.in_use(), 0);
    assert_eq!(r.charged(), 0);
}

/// A layer below that frees at once says so (`frees_only_queue` is
/// false): the budget reads after each free and releases the bytes then.
#[test]
fn a_free_below_that_drains_at_once_leaves_the_budget_at_the_free() {
    let (f, budget, r) = counting_reads(true);
    let s = f.stream(0);
    assert!(!r.frees_only_queue());
    let block = r.allocate(700, s, T).unwrap();
    assert_eq!(budget.in_use(), 700);
    r.deallocate(block).unwrap();
    assert!(
        r.inner().reads.load(Ordering::Relaxed) > 0,
        "read after the free"
    );
    assert_eq!(budget.in_use(), 0, "released at the free");
    assert_eq!(r.charged(), 0);
}

/// An uncapped cache says its frees only queue, and they do: over a churn
/// of sizes and streams (kept blocks, arena ranges, size classes, blocks
/// too large for the arena), no free lowers what it holds; a capped one
/// says they may not, since a free over the cap unmaps at once.
#[test]
fn a_cache_says_its_frees_only_queue_when_uncapped_and_they_do() {
    use streamalloc::{CacheConfig, CachingResource};
    let f = support::sim(2);
    let (s0, s1) = (f.stream(0), f.stream(1));
    for config in [
        CacheConfig::default(),
        CacheConfig::default().virtual_memory(false),
    ] {
        let cache = CachingResource::with_config(f.resource.clone(), config);
        assert!(cache.frees_only_queue());
        let mut live = Vec::new();
        let mut seed = 7u64;
        for i in 0..400 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let size = match seed >> 62 {
                0 => 256 << (seed >> 40 & 7),
                1 => (seed >> 20 & 0xff_ffff) as usize + 1,
                2 => 2 << 20,
                _ => 96 << 20,
            };
            let s = if i % 3 == 0 { s1 } else { s0 };
            live.push(cache.allocate(size, s, T).unwrap());
            if seed >> 61 & 1 == 1 || live.len() > 12 {
                let block = live.swap_remove((seed >> 8) as usize % live.len());
                let before = cache.bytes_outstanding();
                cache.deallocate(block).unwrap();
                assert!(
                    cache.bytes_outstanding() >= before,
                    "a free drained at once"
                );
            }
            if i % 50 == 0 {
                f.sim.as_ref().unwrap().run_until_idle();
                cache.reap_pending().unwrap();
            }
        }
        for block in live {
            cache.deallocate(block).unwrap();
        }
    }
    let capped = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().max_cached_bytes(4 << 20),
    );
    assert!(!capped.frees_only_queue());
}
