//! A cache over a budget: the budget lends the device, so the cache builds
//! its virtual-memory arena there and charges the budget for every byte of
//! physical memory it maps. The arena serves (no allocation of the
//! driver's pool), the budget's limit bounds what the device holds, a
//! growth it refuses changes nothing, a mapping given back wakes an
//! allocation waiting under the budget, and everything comes back.

use crate::support;

use std::sync::Arc;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceBlock, DeviceMemoryResource, ResourceError, StreamId};
use streamalloc::{
    Budget, BudgetResource, CacheConfig, CachingResource, DriverCall, StreamOrderedResource,
};

const T: AllocTag = AllocTag::UNTAGGED;
const P: usize = 2 << 20;

type Lent = CachingResource<BudgetResource<Arc<StreamOrderedResource<SimGpu>>>>;

/// A cache over a budget of `limit` bytes over `f`'s resource.
fn lent(f: &support::Fixture<SimGpu>, limit: usize) -> (Budget, Lent) {
    let budget = Budget::new(limit);
    let config = CacheConfig::default().max_mapping_bytes(P);
    let cache =
        CachingResource::with_config(BudgetResource::new(f.resource.clone(), &budget), config);
    (budget, cache)
}

fn gpu(f: &support::Fixture<SimGpu>) -> Arc<SimGpu> {
    f.sim.clone().unwrap()
}

/// Varying sizes under a budget of 8 pages: the arena serves every
/// allocation (no `cuMemAllocAsync`), the device never holds more than
/// the limit, and the budget counts exactly what the arena maps.
#[test]
fn a_cache_over_a_budget_uses_the_arena_within_the_limit() {
    let f = support::sim(2);
    let gpu = gpu(&f);
    let limit = 8 * P;
    let (budget, cache) = lent(&f, limit);
    let mut live: Vec<DeviceBlock> = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut refused = 0;
    for i in 0..2000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let bytes = 4096 + (seed % (3 * P as u64)) as usize;
        let stream: StreamId = f.stream(i % 2);
        if (live.len() > 6 || (seed >> 40).is_multiple_of(3)) && !live.is_empty() {
            let at = (seed >> 20) as usize % live.len();
            cache.deallocate(live.swap_remove(at)).unwrap();
        }
        match cache.allocate(bytes, stream, T) {
            Ok(block) => live.push(block),
            Err(ResourceError::BudgetExceeded { limit: l, .. }) => {
                assert_eq!(l, limit);
                refused += 1;
                if let Some(block) = live.pop() {
                    cache.deallocate(block).unwrap();
                }
            }
            Err(e) => panic!("{e}"),
        }
        assert!(gpu.held_bytes() <= limit, "the device holds past the limit");
        assert_eq!(
            budget.in_use(),
            cache.physical_bytes() + cache.inner().charged(),
            "the budget counts the mappings and the blocks"
        );
    }
    assert!(cache.physical_bytes() > 0, "the arena serves");
    assert_eq!(
        gpu.call_count(DriverCall::AllocAsync),
        0,
        "no pool allocation"
    );
    assert_eq!(gpu.call_count(DriverCall::FreeAsync), 0);
    assert!(budget.peak() <= limit);
    assert!(refused > 0, "the churn reached the limit");
    for block in live {
        cache.deallocate(block).unwrap();
    }
}

/// A growth the budget refuses fails with the budget's own error, for the
/// pages it needed, and leaves nothing mapped, counted or leased.
#[test]
fn a_growth_the_budget_refuses_changes_nothing() {
    let f = support::sim(1);
    let gpu = gpu(&f);
    let s = f.stream(0);
    let (budget, cache) = lent(&f, 2 * P);
    let full = cache.allocate(2 * P, s, T).unwrap();
    assert_eq!(budget.in_use(), 2 * P);
    let before = (
        gpu.call_count(DriverCall::MemCreate),
        gpu.held_bytes(),
        cache.bytes_outstanding(),
        cache.leased_bytes(),
        budget.in_use(),
    );
    let err = cache.allocate(P, s, T).unwrap_err();
    assert!(
        matches!(
            err,
            ResourceError::BudgetExceeded {
                requested,
                limit,
                in_use,
            } if requested == P && limit == 2 * P && in_use == 2 * P
        ),
        "{err}"
    );
    let after = (
        gpu.call_count(DriverCall::MemCreate),
        gpu.held_bytes(),
        cache.bytes_outstanding(),
        cache.leased_bytes(),
        budget.in_use(),
    );
    assert_eq!(after, before);
    // The memory freed serves the same request, with no driver call.
    cache.deallocate(full).unwrap();
    let again = cache.allocate(P, s, T).unwrap();
    assert_eq!(gpu.call_count(DriverCall::MemCreate), before.0);
    cache.deallocate(again).unwrap();
}

/// Two caches share one budget; one holds it full with idle mappings.
/// The other's allocation, refused, waits, and is woken when the first
/// gives its mappings back.
#[test]
fn a_mapping_given_back_wakes_a_waiter_under_the_budget() {
    use std::time::Duration;
    use streamalloc::AsyncResource;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = support::sim(1);
        let s = f.stream(0);
        let budget = Budget::new(2 * P);
        let config = CacheConfig::default().max_mapping_bytes(P);
        let holder =
            CachingResource::with_config(BudgetResource::new(f.resource.clone(), &budget), config);
        let waiter =
            CachingResource::with_config(BudgetResource::new(f.resource.clone(), &budget), config);
        // SAFETY: the stack's bottom resource was made on this device.
        let res = unsafe { AsyncResource::with_device(waiter, &f.device) }.unwrap();
        let idle = holder.allocate(2 * P, s, T).unwrap();
        holder.deallocate(idle).unwrap();
        assert_eq!(budget.in_use(), 2 * P, "idle, still mapped");

        let wanted = res.allocate(P, s, T);
        tokio::pin!(wanted);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut wanted)
                .await
                .is_err(),
            "the budget is full: the allocation waits"
        );
        // The holder's mappings go back to the device and the budget.
        holder.release_idle().unwrap();
        assert_eq!(holder.physical_bytes(), 0);
        let block = tokio::time::timeout(Duration::from_secs(5), wanted)
            .await
            .expect("woken by the mappings given back")
            .unwrap();
        assert_eq!(budget.in_use(), P);
        drop(res.deallocate(block).unwrap());
    });
}

/// Live, idle and freed blocks; the stack goes: the device and the budget
/// hold nothing.
#[test]
fn shutdown_of_a_lent_stack_reaches_zero() {
    let f = support::sim(2);
    let gpu = gpu(&f);
    let (budget, cache) = lent(&f, 16 * P);
    let a = cache.allocate(3 * P, f.stream(0), T).unwrap();
    let b = cache.allocate(5000, f.stream(1), T).unwrap();
    let c = cache.allocate(P + 1, f.stream(0), T).unwrap();
    cache.deallocate(b).unwrap();
    assert!(budget.in_use() >= 4 * P);
    cache.deallocate(a).unwrap();
    cache.deallocate(c).unwrap();
    drop(cache);
    assert_eq!(budget.in_use(), 0);
    f.resource.reap_pending().unwrap();
    assert_eq!(gpu.held_bytes(), 0);
}

/// A retry layer between the cache and the budget (the order of a
/// service's stack) lends the budget's device on: the arena serves, and
/// the budget counts its mappings.
#[test]
fn a_retry_between_the_cache_and_the_budget_keeps_the_arena() {
    use streamalloc::RetryOnOomResource;
    let f = support::sim(1);
    let gpu = gpu(&f);
    let budget = Budget::new(4 * P);
    let cache = CachingResource::new(RetryOnOomResource::new(BudgetResource::new(
        f.resource.clone(),
        &budget,
    )));
    let block = cache.allocate(P + 1, f.stream(0), T).unwrap();
    assert!(cache.physical_bytes() >= 2 * P, "the arena mapped it");
    assert_eq!(budget.in_use(), cache.physical_bytes());
    assert_eq!(gpu.call_count(DriverCall::AllocAsync), 0);
    assert!(matches!(
        cache.allocate(4 * P, f.stream(0), T),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    cache.deallocate(block).unwrap();
    drop(cache);
    assert_eq!(budget.in_use(), 0);
}

/// A growth the budget refuses leaves the range it had placed as it was:
/// a stream's own free stays its own. Stream 1 asks for more than the
/// budget lets the arena map; the placement it tried spans the range
/// stream 0 freed, which stream 0 then takes back as it is, with no wait
/// on the GPU for stream 1's work (which never touched it). Tagged as a
/// free of stream 1, as it was, the range made stream 0 wait for
/// everything queued on stream 1: under a service's reservations, which
/// keep the budget full, every refused try did so, and the streams ran
/// one after another on the GPU.
#[test]
fn a_refused_growth_leaves_the_range_to_the_stream_that_freed_it() {
    use streamalloc::gpu::sim::MemAccess;
    let f = support::sim(2);
    let gpu = gpu(&f);
    let (s0, s1) = (f.stream(0), f.stream(1));
    let (budget, cache) = lent(&f, 2 * P);
    let raw = |s| f.device.raw(s).unwrap();
    // Stream 0 fills the budget, writes its block, frees it: the kernel has
    // not run (manual progress), so the range waits for stream 0.
    let a = cache.allocate(2 * P, s0, T).unwrap();
    let at = a.ptr();
    gpu.launch_kernel(raw(s0), &[MemAccess::write(&a)]).unwrap();
    cache.deallocate(a).unwrap();
    // Stream 1 has work queued too, on memory of its own.
    let other = gpu.launch_kernel(raw(s1), &[]);
    assert!(other.is_ok(), "{other:?}");
    // Stream 1 asks for more than the budget lets the arena map.
    assert!(matches!(
        cache.allocate(3 * P, s1, T),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    assert_eq!(budget.in_use(), 2 * P);
    // Stream 0 takes its own free back, as it is.
    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let again = cache.allocate(2 * P, s0, T).unwrap();
    assert_eq!(again.ptr(), at, "the range stream 0 freed serves it");
    assert_eq!(
        gpu.call_count(DriverCall::StreamWaitEvent),
        waits,
        "stream 0 waited on the GPU for stream 1, whose refused growth never used the range"
    );
    cache.deallocate(again).unwrap();
    gpu.run_until_idle();
}
