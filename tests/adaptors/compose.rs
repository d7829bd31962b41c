//! Decorators stacked in any order: a budget counts what the resources below
//! it really take, a cache gives idle memory back on any "full" error, and
//! frees an adaptor queues on another stream are reaped like any other.
//! Each test here is a finding, on the code before its fix; every order at
//! once is `stack_orders.rs`.

use crate::support;

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, SimResource};
use streamalloc::{Budget, BudgetResource, DebugGuardResource, GuardConfig};
use streamalloc::{CacheConfig, CachingResource};

const T: AllocTag = AllocTag("compose");

/// The cache with size classes (its arena maps whole 2 MiB pages, see
/// `cache_arena.rs` for a budget above it).
fn classes<R: DeviceMemoryResource>(inner: R) -> CachingResource<R> {
    CachingResource::with_config(inner, CacheConfig::default().virtual_memory(false))
}

/// `Budget(Cache(R))`: a request the cache serves from a block it already
/// holds costs the budget nothing new, so a full budget does not refuse it.
#[test]
fn a_cache_hit_below_a_budget_costs_nothing() {
    let f = support::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(4096);
    let r = BudgetResource::new(classes(f.resource.clone()), &budget);

    let block = r.allocate(4096, s, T).unwrap();
    assert_eq!(budget.in_use(), 4096);
    r.deallocate(block).unwrap();
    assert_eq!(r.inner().cached_bytes(), 4096);
    assert_eq!(
        budget.in_use(),
        4096,
        "the cached block is still on the device"
    );

    let again = r
        .allocate(4096, s, T)
        .expect("a cache hit fits a full budget");
    assert_eq!(budget.in_use(), 4096, "the hit took nothing new");
    assert_eq!(budget.in_use(), f.resource.bytes_outstanding());
    r.deallocate(again).unwrap();
}

/// `Budget(Cache(R))`: the cache rounds a request up to its class; the
/// budget counts the class size, which is what the device holds.
#[test]
fn a_budget_above_a_cache_counts_the_rounded_size() {
    let f = support::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(1 << 20);
    let r = BudgetResource::new(classes(f.resource.clone()), &budget);

    let block = r.allocate(1000, s, T).unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 1024);
    assert_eq!(budget.in_use(), 1024);
    r.deallocate(block).unwrap();
    drop(r);
    f.resource.reap_pending().unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

/// `Cache(Budget(R))` in size classes: idle cached memory counted by the
/// budget is given back when the budget is full, as it is when the device
/// is. (With its arena, the budget lends the cache the device: see
/// `tests/cache/budget_lends.rs`.)
#[test]
fn a_cache_above_a_full_budget_gives_idle_memory_back() {
    let f = support::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(8192);
    let cache = classes(BudgetResource::new(f.resource.clone(), &budget));

    let small = cache.allocate(4096, s, T).unwrap();
    cache.deallocate(small).unwrap();
    assert_eq!(cache.cached_bytes(), 4096);
    assert_eq!(budget.in_use(), 4096);

    let big = cache
        .allocate(8192, s, T)
        .expect("the idle 4 KiB go back to make room");
    assert_eq!(cache.cached_bytes(), 0);
    assert_eq!(budget.in_use(), 8192);
    assert_eq!(budget.in_use(), f.resource.bytes_outstanding());
    cache.deallocate(big).unwrap();
}

/// A budget refusal that giving idle memory back cannot fix is still the
/// budget's error, and changes nothing.
#[test]
fn a_cache_above_a_budget_reports_the_budget_refusal() {
    let f = support::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(8192);
    let cache = classes(BudgetResource::new(f.resource.clone(), &budget));
    let held = cache.allocate(4096, s, T).unwrap();
    let err = cache.allocate(8192, s, T).unwrap_err();
    assert!(
        matches!(err, ResourceError::BudgetExceeded { .. }),
        "{err:?}"
    );
    assert_eq!(budget.in_use(), 4096);
    assert_eq!(f.resource.bytes_outstanding(), 4096);
    cache.deallocate(held).unwrap();
}

/// `Budget(Cache(R))` with the cache's arena: the arena guesses a cost
/// before it places a block, and a block placed across one page more than
/// the guess took more than the budget reserved, even when the guess was
/// exactly the request. The budget counts what the cache holds after every
/// allocation (found by `tests/adaptors/stack_orders.rs`).
#[test]
fn a_budget_above_the_arena_counts_a_block_that_straddles_a_page() {
    const PAGE: usize = 4096;
    let gpu = SimGpu::builder()
        .manual()
        .capacity(1 << 20)
        .vm_granularity(PAGE)
        .build();
    let device = Device::simulated(&gpu, 1);
    let s = device.stream(0).unwrap();
    let bottom = Arc::new(SimResource::new(&device));
    let budget = Budget::new(1 << 20);
    let r = BudgetResource::new(CachingResource::new(bottom.clone()), &budget);
    let a = r.allocate(PAGE, s, T).unwrap();
    let b = r.allocate(2 * PAGE, s, T).unwrap();
    r.deallocate(b).unwrap();
    r.release_idle().unwrap();
    let empty = r.allocate(0, s, T).unwrap();
    assert_eq!(r.allocation_cost(PAGE, s), PAGE, "the guess is one page");
    let c = r.allocate(PAGE, s, T).unwrap();
    assert_eq!(budget.in_use(), gpu.physical_bytes(), "what the arena maps");
    for block in [a, empty, c] {
        r.deallocate(block).unwrap();
    }
}

/// `Budget(Cache(R))` with the cache's arena: `release_idle` through the
/// budget unmaps the idle page at once (no free to reap), and the budget
/// settles it then, as it does after a free or a reap.
#[test]
fn release_idle_through_a_budget_settles_it() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let budget = Budget::new(64 << 20);
    let r = BudgetResource::new(CachingResource::new(f.resource.clone()), &budget);
    let block = r.allocate(100, f.stream(0), T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(budget.in_use(), 2 << 20, "the idle page is still mapped");
    assert_eq!(r.release_idle().unwrap(), 2 << 20);
    assert_eq!(gpu.physical_bytes(), 0);
    assert_eq!(budget.in_use(), 0);
}

/// `Budget(Cache(R))` with the cache's arena: idle mapped pages are
/// physical memory the GPU may still be using, so a plain trim cannot give
/// them back while a fence is pending. `release_idle`, which a dropped
/// budget calls before it settles, waits for the GPU (outside a poll), so
/// the budget gets its bytes back with the stack.
#[test]
fn a_dropped_budget_above_the_arena_gets_the_pages_back() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let budget = Budget::new(64 << 20);
    let r = BudgetResource::new(CachingResource::new(f.resource.clone()), &budget);
    let block = r.allocate(100, f.stream(0), T).unwrap();
    assert_eq!(budget.in_use(), 2 << 20, "one page of the arena");
    r.deallocate(block).unwrap();
    drop(r);
    assert_eq!(gpu.physical_bytes(), 0);
    assert_eq!(budget.in_use(), 0, "the page went with the stack");
}

/// `Budget(DebugGuardResource(max_blocks = 1))` under the futures layer: freeing y on
/// stream 1 evicts x, whose free runs on stream 0. The notifications reap
/// that free too, so the budget comes down to what the device holds without
/// a synchronize.
#[tokio::test(flavor = "current_thread")]
async fn an_eviction_on_another_stream_is_reaped_like_any_free() {
    let device = Device::simulated(&SimGpu::new(), 2);
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let bottom = Arc::new(SimResource::new(&device));
    let budget = Budget::new(1 << 20);
    let stack = BudgetResource::new(
        DebugGuardResource::new(bottom.clone(), GuardConfig::new().max_blocks(1)),
        &budget,
    );
    // SAFETY: the stack's bottom resource was made on `device`.
    let res = unsafe { AsyncResource::with_device(stack, &device) }.unwrap();

    let x = res.allocate(4096, s0, T).await.unwrap();
    let y = res.allocate(8192, s1, T).await.unwrap();
    res.deallocate(x).unwrap().await.unwrap();
    res.deallocate(y).unwrap().await.unwrap();
    // y is quarantined; x was evicted by y's free, on stream 0. Nobody reaps
    // or synchronizes: the notification of that free must apply it (the
    // guard below is a hang guard, not a timing assertion).
    assert_eq!(bottom.live_bytes(), 8192, "y is quarantined, x freed");
    // The budget settles right after the layer below drained the free, on
    // the thread that applies the notification: wait for the budget, not
    // for the bottom (under Miri the test saw the bottom drained and the
    // budget not yet settled).
    let start = std::time::Instant::now();
    while budget.in_use() != 8192 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "x's free was never reaped by a notification ({} B in use)",
            budget.in_use()
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(bottom.pending_free_bytes(), 0);
    assert_eq!(bottom.live_bytes(), 8192);
}
