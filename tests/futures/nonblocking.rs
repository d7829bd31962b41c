//! Async all the way (issue 15): no poll blocks, no waiter is stranded.
//!
//! Each test is one of the reproductions. Every future is wrapped in
//! the poll-time harness ([`support::bounded`]), and the simulated device
//! counts the synchronizes called inside a poll, which must stay at zero.
//! `tokio::time::timeout` is only a hang guard.

use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use streamalloc::CachingResource;
use streamalloc::ResourceBuilder;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    AllocTag, Device, DeviceBlock, DeviceMemoryResource, DriverCall, ResourceError, ResourceResult,
    SimResource, StreamId,
};
use streamalloc::{AsyncResource, WaitPolicy};
use streamalloc::{Budget, BudgetResource};
use support::bounded::BoundedExt;

const BLOCK: usize = 1 << 20;
const TAG: AllocTag = AllocTag("nonblocking");
const GUARD: Duration = support::guard(10);
/// Per kernel on the slow devices: far above any poll's bound; under Miri
/// long enough that the work is still running when a waiter queues.
const KERNEL: Duration = Duration::from_millis(if cfg!(miri) { 2000 } else { 100 });

fn is_device_error(e: &ResourceError) -> bool {
    matches!(
        e,
        ResourceError::Driver { .. } | ResourceError::DeviceUnavailable { .. }
    )
}

/// Keeps `stream` busy for `kernels` op latencies, touching `block`.
fn busy(
    gpu: &SimGpu,
    f: &support::Fixture<SimGpu>,
    s: StreamId,
    block: &DeviceBlock,
    kernels: usize,
) {
    for _ in 0..kernels {
        gpu.launch_kernel(f.pool.raw(s).unwrap(), &[MemAccess::write(block)])
            .unwrap();
    }
}

#[test]
#[cfg_attr(
    miri,
    ignore = "tells a blocking poll from a free one by wall time, which the interpreter's pace (seconds for a poll) swamps"
)]
fn a_current_thread_timeout_returns_at_once_with_cache_retry_and_budget() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let gpu = SimGpu::builder()
            .capacity(2 * BLOCK)
            .op_latency(KERNEL)
            .build();
        let f = support::sim_with(gpu.clone(), 2);
        let (s0, s1) = (f.stream(0), f.stream(1));
        let budget = Budget::new(1 << 30);
        let stack = ResourceBuilder::new()
            .retry_on_oom()
            .budget(&budget)
            .build(SimResource::new(&f.device));
        // Size classes: the budget would lend the cache its device, and
        // the arena would serve s1 at once behind a wait on the GPU
        // (`tests/cache/arena.rs` covers that path's polls).
        let cache = CachingResource::with_config(
            stack,
            streamalloc::CacheConfig::default().virtual_memory(false),
        );
        // SAFETY: the stack's bottom resource was made on this device.
        let res = unsafe { AsyncResource::with_device(cache, &f.device) }.unwrap();
        let a = res.try_allocate(BLOCK, s0, TAG).unwrap();
        let b = res.try_allocate(BLOCK, s0, TAG).unwrap();
        busy(&gpu, &f, s0, &a, 3);
        drop(res.deallocate(a).unwrap());
        drop(res.deallocate(b).unwrap());

        // The device is full; the cache holds the two blocks, and once it
        // gives them back their frees wait behind 300 ms of work on s0.
        let start = Instant::now();
        let timed = tokio::time::timeout(
            Duration::from_millis(1),
            res.allocate(BLOCK, s1, TAG).bounded("allocate"),
        )
        .await;
        let took = start.elapsed();
        assert!(timed.is_err(), "the allocation cannot succeed yet");
        assert!(
            took < KERNEL,
            "timeout(1 ms, allocate) returned after {took:?}: a poll blocked"
        );
        assert_eq!(gpu.blocking_calls_in_polls(), 0);

        // Awaited, it is served once the frees have executed.
        let block = tokio::time::timeout(GUARD, res.allocate(BLOCK, s1, TAG).bounded("allocate"))
            .await
            .expect("hang")
            .unwrap();
        assert_eq!(gpu.blocking_calls_in_polls(), 0);
        drop(res.deallocate(block).unwrap());
    });
}

#[test]
fn retry_on_oom_under_an_awaiting_allocation_does_not_synchronize() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let gpu = SimGpu::builder().capacity(BLOCK).op_latency(KERNEL).build();
        let f = support::sim_with(gpu.clone(), 2);
        let (s0, s1) = (f.stream(0), f.stream(1));
        let stack = ResourceBuilder::new()
            .retry_on_oom()
            .build(SimResource::new(&f.device));
        // SAFETY: the stack's bottom resource was made on this device.
        let res = unsafe { AsyncResource::with_device(stack, &f.device) }.unwrap();
        let a = res.try_allocate(BLOCK, s0, TAG).unwrap();
        busy(&gpu, &f, s0, &a, 3);
        // Freed on the inner resource directly: the async layer never saw it.
        res.inner().deallocate(a).unwrap();
        let start = Instant::now();
        let block = tokio::time::timeout(GUARD, res.allocate(BLOCK, s1, TAG).bounded("allocate"))
            .await
            .expect("hang: a free queued below the async layer is never noticed")
            .unwrap();
        assert!(start.elapsed() >= KERNEL, "served only after the free ran");
        assert_eq!(gpu.blocking_calls_in_polls(), 0);
        drop(res.deallocate(block).unwrap());
    });
}

/// The budget-bound full stack (cache over `RetryOnOomResource` over a budget) under
/// an `AsyncResource`: two blocks fill the budget, their frees wait behind
/// `busy`'s work on stream 0, and a current-thread runtime's
/// `timeout(1 ms, allocate)` on stream 1 must return at once; awaited, the
/// allocation is served once the frees have run. Returns how long the
/// timed-out call took.
fn full_stack_under_budget<G: streamalloc::gpu::Gpu>(
    f: &support::Fixture<G>,
    block: usize,
    busy: impl Fn(&DeviceBlock),
) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let (s0, s1) = (f.stream(0), f.stream(1));
        let budget = Budget::new(2 * block);
        let stack = ResourceBuilder::new()
            .retry_on_oom()
            .budget(&budget)
            .build(streamalloc::StreamOrderedResource::new(&f.device));
        // SAFETY: the stack's bottom resource was made on this device.
        let res =
            unsafe { AsyncResource::with_device(CachingResource::new(stack), &f.device) }.unwrap();
        let a = res.try_allocate(block, s0, TAG).unwrap();
        let b = res.try_allocate(block, s0, TAG).unwrap();
        busy(&a);
        drop(res.deallocate(a).unwrap());
        drop(res.deallocate(b).unwrap());
        let start = Instant::now();
        let timed = tokio::time::timeout(
            Duration::from_millis(1),
            res.allocate(block, s1, TAG).bounded("allocate"),
        )
        .await;
        let took = start.elapsed();
        if let Ok(served) = timed {
            drop(res.deallocate(served.unwrap()).unwrap());
        }
        let again = tokio::time::timeout(GUARD, res.allocate(block, s1, TAG).bounded("allocate"))
            .await
            .expect("hang")
            .unwrap();
        drop(res.deallocate(again).unwrap());
        tokio::time::timeout(GUARD, res.reap_pending().bounded("reap"))
            .await
            .expect("hang")
            .unwrap();
        took
    })
}

#[test]
#[cfg_attr(
    miri,
    ignore = "tells a blocking poll from a free one by wall time, which the interpreter's pace (seconds for a poll) swamps"
)]
fn a_budget_bound_full_stack_never_blocks_a_current_thread_runtime() {
    let gpu = SimGpu::builder().op_latency(KERNEL).build();
    let f = support::sim_with(gpu.clone(), 2);
    let took = full_stack_under_budget(&f, BLOCK, |b| busy(&gpu, &f, f.stream(0), b, 3));
    assert!(
        took < KERNEL,
        "timeout(1 ms, allocate) returned after {took:?}"
    );
    assert_eq!(gpu.blocking_calls_in_polls(), 0);
}

/// The same on the GPU: 2,000 fills of 256 MiB (a few hundred ms on an
/// H200) keep the frees waiting.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_a_budget_bound_full_stack_never_blocks_a_current_thread_runtime() {
    const BIG: usize = 256 << 20;
    let f = support::cuda(2);
    let raw = f.pool.raw(f.stream(0)).unwrap();
    let gpu = f.device.gpu().clone();
    let took = full_stack_under_budget(&f, BIG, |b| {
        for _ in 0..2000 {
            // SAFETY: a stream of the device's pool; the block is live (freed later).
            unsafe { streamalloc::gpu::Gpu::memset_async(&*gpu, b.ptr(), 1, b.size(), raw) }
                .unwrap();
        }
    });
    assert!(
        took < Duration::from_millis(50),
        "timeout(1 ms, allocate) returned after {took:?}"
    );
}

/// Polls `fut` once with a counting waker.
fn poll_counting<F: std::future::Future + Unpin>(
    fut: &mut F,
) -> (
    std::task::Poll<F::Output>,
    Arc<support::CountingWaker>,
    std::task::Waker,
) {
    let (count, waker) = support::CountingWaker::new();
    let p = support::poll_once(fut, &waker);
    (p, count, waker)
}

#[test]
fn a_shared_budget_waiter_on_device_0_is_woken_by_a_free_on_device_1() {
    let gpus = SimGpu::builder()
        .manual()
        .capacity(64 * BLOCK)
        .build_host(2);
    let budget = Budget::new(2 * BLOCK);
    let devices: Vec<_> = gpus
        .iter()
        .map(|gpu| {
            let device = Device::simulated(gpu, 1);
            let stack = BudgetResource::new(SimResource::new(&device), &budget);
            // SAFETY: the stack's bottom resource was made on this device.
            let res = unsafe { AsyncResource::with_device(stack, &device) }.unwrap();
            (res, device.stream(0).unwrap())
        })
        .collect();
    let (res0, s0) = &devices[0];
    let (res1, s1) = &devices[1];
    let held = res1.try_allocate(2 * BLOCK, *s1, TAG).unwrap();

    let mut waiting = res0.allocate(BLOCK, *s0, TAG).bounded("allocate");
    let (first, woken, waker) = poll_counting(&mut waiting);
    assert!(first.is_pending());
    assert_eq!(budget.in_use(), 2 * BLOCK);

    // Device 1 frees, and its free is applied (the budget gives the bytes
    // back): the waiter on device 0 is woken by that, not by a timer.
    let mut freed = res1.deallocate(held).unwrap().bounded("dealloc");
    support::drive(&gpus[1], &mut freed).unwrap();
    assert_eq!(budget.in_use(), 0);
    assert!(woken.count() >= 1, "the waiter on device 0 was not woken");
    match support::poll_once(&mut waiting, &waker) {
        std::task::Poll::Ready(r) => drop(res0.deallocate(r.unwrap()).unwrap()),
        std::task::Poll::Pending => panic!("woken but not served"),
    }
}

#[test]
fn memory_freed_by_another_resource_on_the_device_serves_a_waiter() {
    let gpu = SimGpu::builder().manual().capacity(BLOCK).build();
    let device = Device::simulated(&gpu, 1);
    let s = device.stream(0).unwrap();
    let mine = AsyncResource::new(Arc::new(SimResource::new(&device))).unwrap();
    let theirs = AsyncResource::new(Arc::new(SimResource::new(&device))).unwrap();
    let held = theirs.try_allocate(BLOCK, s, TAG).unwrap();

    let mut waiting = mine.allocate(BLOCK, s, TAG).bounded("allocate");
    let (first, woken, waker) = poll_counting(&mut waiting);
    assert!(first.is_pending());
    let mut freed = theirs.deallocate(held).unwrap().bounded("dealloc");
    support::drive(&gpu, &mut freed).unwrap();
    assert!(
        woken.count() >= 1,
        "memory freed by another resource woke nobody"
    );
    match support::poll_once(&mut waiting, &waker) {
        std::task::Poll::Ready(r) => drop(mine.deallocate(r.unwrap()).unwrap()),
        std::task::Poll::Pending => panic!("woken but not served"),
    }
}

fn full_device(
    capacity: usize,
) -> (
    support::Fixture<SimGpu>,
    AsyncResource<SimResource>,
    DeviceBlock,
) {
    let gpu = SimGpu::builder()
        .capacity(capacity)
        .op_latency(KERNEL)
        .build();
    let f = support::sim_with(gpu, 2);
    let res = support::async_resource(&f);
    let held = res.try_allocate(capacity, f.stream(0), TAG).unwrap();
    (f, res, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_waiter_fails_after_a_fault_with_nothing_else_pending() {
    let (f, res, _held) = full_device(BLOCK);
    let waiter = tokio::spawn(res.allocate(BLOCK, f.stream(1), TAG).bounded("allocate"));
    while res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    f.sim.as_ref().unwrap().inject_device_fault();
    let r = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("hang")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_waiter_fails_after_a_fault() {
    let gpu = SimGpu::builder().op_latency(KERNEL).build();
    let f = support::sim_with(gpu.clone(), 2);
    let budget = Budget::new(BLOCK);
    let stack = BudgetResource::new(SimResource::new(&f.device), &budget);
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(stack, &f.device) }.unwrap();
    let held = res.try_allocate(BLOCK, f.stream(0), TAG).unwrap();
    busy(&gpu, &f, f.stream(0), &held, 3);
    drop(res.deallocate(held).unwrap());
    let waiter = tokio::spawn(res.allocate(BLOCK, f.stream(1), TAG).bounded("allocate"));
    while res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    gpu.inject_device_fault();
    let r = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("hang")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failed_event_record_on_a_free_still_serves_the_waiter() {
    let (f, res, held) = full_device(BLOCK);
    let gpu = f.sim.clone().unwrap();
    busy(&gpu, &f, f.stream(0), &held, 1);
    let waiter = tokio::spawn(res.allocate(BLOCK, f.stream(1), TAG).bounded("allocate"));
    while res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    gpu.fail_nth(DriverCall::EventRecord, 1);
    drop(res.deallocate(held).unwrap());
    let block = tokio::time::timeout(GUARD, waiter)
        .await
        .expect("hang: the failed record stranded the free")
        .unwrap()
        .unwrap();
    drop(res.deallocate(block).unwrap());
    tokio::time::timeout(GUARD, res.reap_pending().bounded("reap"))
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(
        res.bytes_outstanding(),
        0,
        "the free's bytes stayed counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_mem_get_info_at_construction_still_refuses_what_can_never_fit() {
    let gpu = SimGpu::builder().capacity(BLOCK).build();
    let f = support::sim_with(gpu.clone(), 1);
    gpu.fail_nth(DriverCall::MemGetInfo, 1);
    let res = support::async_resource(&f);
    let r = tokio::time::timeout(
        GUARD,
        res.allocate(1 << 30, f.stream(0), TAG).bounded("allocate"),
    )
    .await
    .expect("hang: a request larger than the device waits forever");
    assert!(matches!(r, Err(ResourceError::OutOfMemory { .. })), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_waiters_queued_a_hopeless_request_fails_at_once() {
    let (f, res, _held) = full_device(BLOCK);
    let queued = tokio::spawn(res.allocate(BLOCK, f.stream(1), TAG).bounded("allocate"));
    while res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    let other = SimGpu::builder().ordinal(1).build();
    let foreign = other.stream_pool(1).id(0).unwrap();
    let r = tokio::time::timeout(GUARD, res.allocate(16, foreign, TAG).bounded("allocate"))
        .await
        .expect("hang: a stream of another device was queued");
    assert!(matches!(r, Err(ResourceError::WrongDevice { .. })), "{r:?}");
    let r = tokio::time::timeout(
        GUARD,
        res.allocate(2 * BLOCK, f.stream(1), TAG)
            .bounded("allocate"),
    )
    .await
    .expect("hang: a request larger than the device was queued");
    assert!(matches!(r, Err(ResourceError::OutOfMemory { .. })), "{r:?}");
    assert_eq!(res.waiting_allocations(), 1);
    queued.abort();
}

/// Panics in `reap_through`, as a buggy decorator might, on whatever thread
/// applies a free.
#[derive(Debug)]
struct PanicsOnReap(SimResource);

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it but `reap_through`, which panics.
unsafe impl DeviceMemoryResource for PanicsOnReap {
    streamalloc::forward_to_inner!(0; reap_pending, supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams, allocation_limit, budget_reliefs, capture_status, release_capture);
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.0.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.0.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.0.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.0.bytes_outstanding()
    }
    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.0.pending_free_seq(stream)
    }
    fn reap_through(&self, _stream: StreamId, _seq: u64) -> usize {
        panic!("a decorator's bug");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_decorator_does_not_kill_the_watchdog() {
    let gpu = SimGpu::builder().op_latency(KERNEL).build();
    let f = support::sim_with(gpu.clone(), 1);
    let s = f.stream(0);
    let inner = PanicsOnReap(SimResource::new(&f.device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(inner, &f.device) }.unwrap();
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    // A free whose notification makes the watchdog call the decorator.
    let block = res.try_allocate(BLOCK, s, TAG).unwrap();
    drop(res.deallocate(block).unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Then a parked point, and a fault: only the watchdog can end it.
    let held = res.try_allocate(BLOCK, s, TAG).unwrap();
    busy(&gpu, &f, s, &held, 3);
    let point = tokio::spawn(res.completion(s).unwrap().bounded("completion"));
    while res.parked_points() < 1 {
        tokio::task::yield_now().await;
    }
    gpu.inject_device_fault();
    let r = tokio::time::timeout(GUARD, point)
        .await
        .expect("hang: the watchdog died")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
}

/// A request larger than a budget's whole limit can never be served: it
/// fails at once even while others wait, as a request larger than the
/// device does (it used to queue behind them and fail only at the head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_waiters_queued_a_request_over_the_budget_limit_fails_at_once() {
    let gpu = SimGpu::builder().capacity(64 * BLOCK).build();
    let device = Device::simulated(&gpu, 2);
    let budget = Budget::new(2 * BLOCK);
    let stack = BudgetResource::new(SimResource::new(&device), &budget);
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(stack, &device) }.unwrap();
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let held = res.try_allocate(2 * BLOCK, s0, TAG).unwrap();
    let queued = tokio::spawn(res.allocate(BLOCK, s1, TAG).bounded("allocate"));
    while res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    let r = tokio::time::timeout(GUARD, res.allocate(3 * BLOCK, s1, TAG).bounded("allocate"))
        .await
        .expect("hang: a request over the budget's limit was queued");
    assert!(
        matches!(r, Err(ResourceError::BudgetExceeded { requested, limit, .. })
            if requested == 3 * BLOCK && limit == 2 * BLOCK),
        "{r:?}"
    );
    assert_eq!(res.waiting_allocations(), 1);
    assert_eq!(budget.in_use(), 2 * BLOCK, "the refusal changed nothing");
    queued.abort();
    drop(res.deallocate(held).unwrap());
}
