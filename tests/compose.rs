//! Decorators stacked in any order: a budget counts what the resources below
//! it really take, a cache gives idle memory back on any "full" error, and
//! frees an adaptor queues on another stream are reaped like any other.

mod common;

use std::sync::Arc;

use streamalloc::adaptors::{Budget, BudgetResource, DebugGuard, GuardConfig};
use streamalloc::cache::{CacheConfig, CachingResource};
use streamalloc::futures::AsyncResource;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, SimResource};

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
    let f = common::sim(1);
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
    let f = common::sim(1);
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

/// `Cache(Budget(R))`: idle cached memory counted by the budget is given back
/// when the budget is full, as it is when the device is.
#[test]
fn a_cache_above_a_full_budget_gives_idle_memory_back() {
    let f = common::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(8192);
    let cache = CachingResource::new(BudgetResource::new(f.resource.clone(), &budget));

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
    let f = common::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(8192);
    let cache = CachingResource::new(BudgetResource::new(f.resource.clone(), &budget));
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

/// `Budget(DebugGuard(max_blocks = 1))` under the futures layer: freeing y on
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
        DebugGuard::new(bottom.clone(), GuardConfig::new().max_blocks(1)),
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

/// The stacks the property test drives, outermost first; the guard keeps one
/// block.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Budget,
    BudgetCache,
    CacheBudget,
    BudgetGuard,
    GuardBudget,
    RetryBudgetCache,
    CacheRetryBudget,
    StatsBudgetGuardCache,
    GuardCacheBudget,
    BudgetRetryCache,
}

const SHAPES: [Shape; 10] = [
    Shape::Budget,
    Shape::BudgetCache,
    Shape::CacheBudget,
    Shape::BudgetGuard,
    Shape::GuardBudget,
    Shape::RetryBudgetCache,
    Shape::CacheRetryBudget,
    Shape::StatsBudgetGuardCache,
    Shape::GuardCacheBudget,
    Shape::BudgetRetryCache,
];

fn stack(shape: Shape, bottom: Arc<SimResource>, budget: &Budget) -> Box<dyn DeviceMemoryResource> {
    use streamalloc::adaptors::{RetryOnOom, StatsResource};
    fn b<R: DeviceMemoryResource>(r: R, budget: &Budget) -> BudgetResource<R> {
        BudgetResource::new(r, budget)
    }
    fn guard<R: DeviceMemoryResource>(r: R) -> DebugGuard<R> {
        DebugGuard::new(r, GuardConfig::new().max_blocks(1))
    }
    match shape {
        Shape::Budget => Box::new(b(bottom, budget)),
        Shape::BudgetCache => Box::new(b(CachingResource::new(bottom), budget)),
        Shape::CacheBudget => Box::new(CachingResource::new(b(bottom, budget))),
        Shape::BudgetGuard => Box::new(b(guard(bottom), budget)),
        Shape::GuardBudget => Box::new(DebugGuard::new(
            b(bottom, budget),
            GuardConfig::new().max_blocks(1),
        )),
        Shape::RetryBudgetCache => {
            Box::new(RetryOnOom::new(b(CachingResource::new(bottom), budget)))
        }
        Shape::CacheRetryBudget => {
            Box::new(CachingResource::new(RetryOnOom::new(b(bottom, budget))))
        }
        Shape::StatsBudgetGuardCache => Box::new(StatsResource::new(
            BudgetResource::new(
                DebugGuard::new(
                    CachingResource::new(bottom),
                    GuardConfig::new().max_blocks(1),
                ),
                budget,
            ),
            &streamalloc::adaptors::Stats::new(),
        )),
        Shape::GuardCacheBudget => Box::new(DebugGuard::new(
            CachingResource::new(b(bottom, budget)),
            GuardConfig::new().max_blocks(1),
        )),
        Shape::BudgetRetryCache => {
            Box::new(b(RetryOnOom::new(CachingResource::new(bottom)), budget))
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: usize },
    Free { slot: usize },
    Reap,
    Step,
}

const SIZES: [usize; 8] = [0, 100, 512, 1000, 4096, 5000, 8192, 20_000];

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..SIZES.len(), 0..2usize).prop_map(|(i, stream)| Op::Alloc { size: SIZES[i], stream }),
        3 => (0..16usize).prop_map(|slot| Op::Free { slot }),
        1 => Just(Op::Reap),
        1 => Just(Op::Step),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: if cfg!(miri) { 4 } else { 192 },
        failure_persistence: None,
        .. proptest::test_runner::Config::default()
    })]

    /// Random stacks, random operations: after every step the budget counts
    /// exactly what the device holds for the stack (live, cached, quarantined
    /// and not-yet-reaped frees), a refused call changes nothing, and once
    /// everything is freed and the stack dropped nothing is left.
    #[test]
    fn any_stack_counts_what_the_device_holds(
        shape in 0..SHAPES.len(),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let shape = SHAPES[shape];
        let capacity = 96 << 10;
        let gpu = SimGpu::builder().manual().capacity(capacity).build();
        let device = Device::simulated(&gpu, 2);
        let pool = device.streams();
        let bottom = Arc::new(SimResource::new(&device));
        let budget = Budget::new(48 << 10);
        let r = stack(shape, bottom.clone(), &budget);
        let mut live = Vec::new();
        for op in &ops {
            match *op {
                Op::Alloc { size, stream } => {
                    let before = budget.in_use();
                    match r.allocate(size, pool.id(stream).unwrap(), T) {
                        Ok(block) => live.push(block),
                        Err(e @ (ResourceError::BudgetExceeded { .. }
                        | ResourceError::OutOfMemory { .. })) => {
                            // The error names the request (a cache below the
                            // budget names its rounded size). A refusal may
                            // give idle cached memory back, never take more.
                            let requested = match e {
                                ResourceError::BudgetExceeded { requested, .. }
                                | ResourceError::OutOfMemory { requested, .. } => requested,
                                _ => unreachable!(),
                            };
                            proptest::prop_assert!(requested >= size, "{:?}", e);
                            proptest::prop_assert!(budget.in_use() <= before);
                        }
                        Err(e) => proptest::prop_assert!(false, "{:?}: {:?}", shape, e),
                    }
                }
                Op::Free { slot } => {
                    if !live.is_empty() {
                        let block = live.swap_remove(slot % live.len());
                        r.deallocate(block).unwrap();
                    }
                }
                Op::Reap => r.reap_pending().unwrap(),
                Op::Step => {
                    gpu.step();
                }
            }
            proptest::prop_assert_eq!(
                budget.in_use(),
                bottom.bytes_outstanding(),
                "{:?} after {:?}", shape, op
            );
            proptest::prop_assert!(budget.in_use() <= budget.limit() + (8 << 10));
        }
        for block in live.drain(..) {
            r.deallocate(block).unwrap();
        }
        r.reap_pending().unwrap();
        proptest::prop_assert_eq!(budget.in_use(), bottom.bytes_outstanding());
        drop(r);
        bottom.reap_pending().unwrap();
        proptest::prop_assert_eq!(bottom.bytes_outstanding(), 0, "{:?}", shape);
        proptest::prop_assert_eq!(budget.in_use(), 0, "{:?}: nothing left after the last free", shape);
        gpu.run_until_idle();
        proptest::prop_assert_eq!(gpu.free_bytes(), capacity);
        proptest::prop_assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    }
}
