//! The driver calls one served request costs, counted on the simulated
//! device: a request of the inference service (owned buffers from the
//! caching tier, one launch, its completion awaited, the buffers dropped)
//! must not pay for bookkeeping the GPU does not need.

use crate::support;

use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use support::{CountingWaker, poll_once};

use streamalloc::Buffer;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    Access, AllocTag, CachingResource, Device, DeviceMemoryResource, SimResource, StreamId,
};
use streamalloc::{AsyncResource, EventFuture, WaitPolicy, WhenBehind};

const TAG: AllocTag = AllocTag("request");

type Service = AsyncResource<CachingResource<Arc<SimResource>>>;

/// The service's stack (caching tier, its arena on the simulated device's
/// virtual memory) on a threaded simulated device with two streams.
fn service() -> (Arc<SimGpu>, Service, Vec<StreamId>) {
    let gpu = SimGpu::new();
    let device = Device::simulated(&gpu, 2);
    let inner = Arc::new(SimResource::new(&device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }
        .expect("async resource");
    (gpu, res, device.streams().ids().collect())
}

/// One request on stream `s`: three buffers, one launch writing them, its
/// completion awaited, the buffers dropped.
async fn request(gpu: &SimGpu, res: &Service, s: StreamId) {
    request_at(gpu, res, s).await;
}

/// [`request`], returning where its three buffers were (they are dropped
/// when it returns).
async fn request_at(gpu: &SimGpu, res: &Service, s: StreamId) -> Vec<u64> {
    let mut x = res.allocate_buffer::<f32>(1024, s, TAG).await.unwrap();
    let mut h = res.allocate_buffer::<f32>(4096, s, TAG).await.unwrap();
    let mut y = res.allocate_buffer::<f32>(256, s, TAG).await.unwrap();
    let (bx, bh, by) = (x.block().clone(), h.block().clone(), y.block().clone());
    let ((), done) = res
        .launch(s)
        .write(&mut x)
        .write(&mut h)
        .write(&mut y)
        .enqueue(|raw| {
            gpu.launch_kernel(
                raw,
                &[
                    MemAccess::write(&bx),
                    MemAccess::write(&bh),
                    MemAccess::write(&by),
                ],
            )
            .map_err(|e| e.for_request(0, s))
        })
        .unwrap();
    done.await.unwrap();
    vec![bx.ptr(), bh.ptr(), by.ptr()]
}

/// Calls of `call` made while `f` ran.
async fn counted<F: Future<Output = ()>>(gpu: &SimGpu, call: DriverCall, f: F) -> u64 {
    let before = gpu.call_count(call);
    f.await;
    gpu.call_count(call) - before
}

/// The buffers of a request go back to the cache, which queues no free on
/// the device: their drops must not make the futures layer queue a
/// completion notification (a host function and a stream wait on the
/// notifier's lane, an event on the user's stream) for nothing to apply.
#[tokio::test(flavor = "current_thread")]
async fn dropping_cached_buffers_queues_no_notification() {
    let (gpu, res, s) = service();
    // Completions are caught by queries, never parked on a notification:
    // what is counted below is what the frees cost.
    res.set_wait_policy(WaitPolicy {
        yield_for: Duration::from_secs(60),
        ..WaitPolicy::DEFAULT
    });
    // The first request maps the arena's memory; the next ones reuse it.
    request(&gpu, &res, s[0]).await;
    res.reap_pending().await.unwrap();
    let notifications = res.notifications();
    let host_fns = counted(&gpu, DriverCall::LaunchHostFunc, async {
        for _ in 0..20 {
            request(&gpu, &res, s[0]).await;
        }
    })
    .await;
    assert_eq!(
        res.notifications() - notifications,
        0,
        "a notification was queued for frees the cache absorbed"
    );
    assert_eq!(host_fns, 0, "host functions for frees the cache absorbed");
    res.reap_pending().await.unwrap();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Frees that do reach the device (no cache) are still applied to the
/// accounting without anyone awaiting them.
#[tokio::test(flavor = "current_thread")]
async fn dropped_buffers_without_a_cache_still_leave_the_accounting() {
    let gpu = SimGpu::new();
    let device = Device::simulated(&gpu, 1);
    let res = AsyncResource::new(Arc::new(SimResource::new(&device))).unwrap();
    let s = device.stream(0).unwrap();
    for _ in 0..10 {
        let mut x = res.allocate_buffer::<f32>(1024, s, TAG).await.unwrap();
        x.fill_bytes_on(s, 1).unwrap();
        let done = res.completion(s).unwrap();
        done.await.unwrap();
        drop(x);
    }
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A launch over buffers on their own stream needs no event per buffer:
/// stream order already puts the launch before their frees. One event (the
/// launch's completion point) at most.
#[tokio::test(flavor = "current_thread")]
async fn a_launch_on_the_buffers_own_stream_records_one_event_at_most() {
    let (gpu, res, s) = service();
    res.set_wait_policy(WaitPolicy {
        yield_for: Duration::from_secs(60),
        ..WaitPolicy::DEFAULT
    });
    request(&gpu, &res, s[0]).await;
    res.reap_pending().await.unwrap();
    let records = counted(&gpu, DriverCall::EventRecord, async {
        for _ in 0..20 {
            request(&gpu, &res, s[0]).await;
        }
    })
    .await;
    assert!(
        records <= 20,
        "{records} events recorded for 20 requests on their buffers' stream"
    );
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Uses on the buffer's own stream are not recorded one by one, so a use on
/// another stream must still wait for them: writes on the home stream and
/// reads on another, alternating, then the free; the race detector (on a
/// manual device, where nothing runs before it is ordered) sees none.
#[test]
fn uses_elsewhere_still_wait_for_unrecorded_uses_at_home() {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 2);
    let inner = Arc::new(SimResource::new(&device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }
        .expect("async resource");
    let (home, other) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let (raw_home, raw_other) = (device.raw(home).unwrap(), device.raw(other).unwrap());
    let x = res.inner().allocate(4096, home, TAG).unwrap();
    for _ in 0..3 {
        // A write at home, then a read on the other stream.
        res.prepare_block_use(x.id(), home, Access::Write).unwrap();
        gpu.launch_kernel(raw_home, &[MemAccess::write(&x)])
            .unwrap();
        res.inner()
            .finish_block_use(x.id(), home, Access::Write)
            .unwrap();
        res.prepare_block_use(x.id(), other, Access::Read).unwrap();
        gpu.launch_kernel(raw_other, &[MemAccess::read(&x)])
            .unwrap();
        res.inner()
            .finish_block_use(x.id(), other, Access::Read)
            .unwrap();
    }
    // A read at home after the reads elsewhere, then the free at home.
    res.prepare_block_use(x.id(), home, Access::Read).unwrap();
    gpu.launch_kernel(raw_home, &[MemAccess::read(&x)]).unwrap();
    res.inner()
        .finish_block_use(x.id(), home, Access::Read)
        .unwrap();
    res.inner().deallocate(x).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Clients that share a stream each await their own request: the first one
/// parked must be woken when the stream reaches its point, not when the
/// stream has also run what the others queued after it (a notification
/// covering the stream's end would hold it until the stream drains, and
/// its next request would find the stream idle). On a manual device whose
/// steps interleave the user stream and the notifier's lane in a seeded
/// random order, the first point is woken before the second kernel ran in
/// some of the orders; with a notification covering the end, in none.
#[test]
fn the_oldest_parked_point_is_woken_when_the_stream_reaches_it() {
    let mut early = 0;
    for seed in 0..32 {
        let gpu = SimGpu::builder().manual().seed(seed).build();
        let device = Device::simulated(&gpu, 1);
        let res = AsyncResource::on(&device).unwrap();
        // Parks at once, notified at its own point (as `WhenBehind::Yield`
        // futures are).
        res.set_wait_policy(WaitPolicy {
            behind: WhenBehind::Yield,
            ..WaitPolicy::PARK_AT_ONCE
        });
        let s = device.stream(0).unwrap();
        let raw = device.raw(s).unwrap();
        let block = res.inner().allocate(4096, s, TAG).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::write(&block)]).unwrap();
        let mut first = res.completion(s).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::write(&block)]).unwrap();
        let mut second = res.completion(s).unwrap();
        let (woken, waker) = CountingWaker::new();
        assert!(poll_once(&mut first, &waker).is_pending());
        assert!(poll_once(&mut second, &waker).is_pending());
        while woken.count() == 0 && gpu.step() {}
        assert!(
            matches!(poll_once(&mut first, &waker), Poll::Ready(Ok(()))),
            "seed {seed}: the first point was never woken"
        );
        if !second.is_complete().unwrap() {
            early += 1;
        }
        drop((first, second));
        res.inner().deallocate(block).unwrap();
        gpu.run_until_idle();
    }
    assert!(
        early > 0,
        "in none of 32 orders was the first point woken before the second kernel ran"
    );
}

/// Launches, through `res` on `s`, one simulated kernel writing `x`, and
/// returns the launch's completion.
fn write_one<R: DeviceMemoryResource + 'static>(
    gpu: &SimGpu,
    res: &AsyncResource<R>,
    s: StreamId,
    x: &mut Buffer<f32>,
) -> EventFuture {
    let bx = x.block().clone();
    let ((), done) = res
        .launch(s)
        .write(x)
        .enqueue(|raw| {
            gpu.launch_kernel(raw, &[MemAccess::write(&bx)])
                .map_err(|e| e.for_request(0, s))
        })
        .unwrap();
    done
}

/// The service's stack on a threaded simulated device whose operations
/// each take `latency` (so that a stream stays busy while the test looks).
fn slow_service(latency: Duration) -> (Arc<SimGpu>, Service, Vec<StreamId>) {
    let gpu = SimGpu::builder().op_latency(latency).build();
    let device = Device::simulated(&gpu, 2);
    let inner = Arc::new(SimResource::new(&device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }
        .expect("async resource");
    res.set_wait_policy(WaitPolicy {
        yield_for: Duration::from_secs(60),
        ..WaitPolicy::DEFAULT
    });
    (gpu, res, device.streams().ids().collect())
}

/// A request's buffers dropped once its completion settled go back to the
/// arena as memory the GPU is done with: a request on another stream, while
/// the first stream is busy with other work, takes that very memory with
/// no wait on the busy stream (which would order all its queued work first)
/// and no new memory. Before, the cache made the second stream wait on a
/// fence of the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_freed_after_its_completion_serves_another_stream_without_a_wait() {
    let (gpu, res, s) = slow_service(Duration::from_millis(5));
    let first = request_at(&gpu, &res, s[0]).await;
    // Stream 0 busy again, with work that touches none of that memory.
    let raw0 = res.stream_pool().raw(s[0]).unwrap();
    for _ in 0..20 {
        gpu.launch_kernel(raw0, &[]).unwrap();
    }
    let (waits, maps) = (
        gpu.call_count(DriverCall::StreamWaitEvent),
        gpu.call_count(DriverCall::MemMap),
    );
    let second = request_at(&gpu, &res, s[1]).await;
    assert_eq!(
        gpu.call_count(DriverCall::StreamWaitEvent) - waits,
        0,
        "stream 1 waited on stream 0"
    );
    assert_eq!(
        gpu.call_count(DriverCall::MemMap) - maps,
        0,
        "new memory mapped"
    );
    let mut reused = second.clone();
    reused.sort_unstable();
    let mut freed = first.clone();
    freed.sort_unstable();
    assert_eq!(
        reused, freed,
        "stream 1 took other memory than stream 0 freed"
    );
    res.reap_pending().await.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// The other side: buffers dropped before their work completed are not
/// the GPU's to forget. Another stream takes their memory only behind a
/// wait (or takes other memory), and the race detector sees no use of one
/// stream's memory by another before the first is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_freed_before_its_completion_is_not_handed_over_unordered() {
    let (gpu, res, s) = slow_service(Duration::from_millis(5));
    let mut x = res.allocate_buffer::<f32>(4096, s[0], TAG).await.unwrap();
    let bx = x.block().clone();
    let _done = write_one(&gpu, &res, s[0], &mut x);
    // Dropped with its kernel still queued.
    drop(x);
    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let mut y = res.allocate_buffer::<f32>(4096, s[1], TAG).await.unwrap();
    let by = y.block().clone();
    if by.ptr() == bx.ptr() {
        assert!(
            gpu.call_count(DriverCall::StreamWaitEvent) > waits,
            "the memory changed streams with no wait"
        );
    }
    let done = write_one(&gpu, &res, s[1], &mut y);
    done.await.unwrap();
    drop(y);
    res.reap_pending().await.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// The proof that a buffer's work completed passes through the adaptors
/// above the cache (tracing, retry, budget, stats: each passes
/// `deallocate_completed` on), so the memory still changes streams with no
/// wait. (A debug guard, whose poison fill queues work at the free, does
/// not pass it on: its free is a plain one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_completed_proof_passes_through_the_adaptors() {
    use streamalloc::Budget;
    use streamalloc::CacheConfig;
    use streamalloc::ResourceBuilder;

    let gpu = SimGpu::builder()
        .op_latency(Duration::from_millis(5))
        .build();
    let device = Device::simulated(&gpu, 2);
    let budget = Budget::new(1 << 30);
    let stack = ResourceBuilder::new()
        .tracing()
        .retry_on_oom()
        .budget(&budget)
        .stats()
        .cache(CacheConfig::default())
        .build(Arc::new(SimResource::new(&device)));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(stack, &device) }.expect("async resource");
    res.set_wait_policy(WaitPolicy {
        yield_for: Duration::from_secs(60),
        ..WaitPolicy::DEFAULT
    });
    let s: Vec<StreamId> = device.streams().ids().collect();
    let raw0 = res.stream_pool().raw(s[0]).unwrap();
    let one = |s: StreamId| {
        let (gpu, res) = (&gpu, &res);
        async move {
            let mut x = res.allocate_buffer::<f32>(4096, s, TAG).await.unwrap();
            let bx = x.block().clone();
            let done = write_one(gpu, res, s, &mut x);
            done.await.unwrap();
            bx.ptr()
        }
    };
    let first = one(s[0]).await;
    for _ in 0..20 {
        gpu.launch_kernel(raw0, &[]).unwrap();
    }
    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    let second = one(s[1]).await;
    assert_eq!(second, first, "stream 1 took other memory");
    assert_eq!(
        gpu.call_count(DriverCall::StreamWaitEvent) - waits,
        0,
        "stream 1 waited on stream 0 through the adaptors"
    );
    res.reap_pending().await.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Points are numbered per `AsyncResource`: a buffer of one resource
/// launched through another (both over the same cache) must not read the
/// other's point against its own resource's, which may have settled far
/// past it. Here its own resource has settled 30 points, the launch's
/// point through the other is that one's first, and its kernel is still
/// queued when the buffer is dropped: a completed free would be a false
/// claim, which the simulated device reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_point_of_another_resource_never_makes_a_free_completed() {
    let gpu = SimGpu::builder()
        .op_latency(Duration::from_millis(2))
        .build();
    let device = Device::simulated(&gpu, 2);
    let cache = Arc::new(CachingResource::new(Arc::new(SimResource::new(&device))));
    // SAFETY: the stack's bottom resource was made on this device (both).
    let (a, b) = unsafe {
        (
            AsyncResource::with_device(cache.clone(), &device).unwrap(),
            AsyncResource::with_device(cache, &device).unwrap(),
        )
    };
    let s: Vec<StreamId> = device.streams().ids().collect();
    for _ in 0..30 {
        a.completion(s[0]).unwrap().await.unwrap();
    }
    let mut x = a.allocate_buffer::<f32>(4096, s[0], TAG).await.unwrap();
    let _not_awaited = write_one(&gpu, &b, s[0], &mut x);
    drop(x);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A use made through the resource's own hooks (not the buffer's guards)
/// after the buffer's last launch completed is work the launch's point
/// does not cover: the drop must then free the buffer as any free, not as
/// completed (the simulated device reports a false claim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_through_the_hooks_after_the_launch_keeps_the_free_ordered() {
    let (gpu, res, s) = slow_service(Duration::from_millis(2));
    let mut x = res.allocate_buffer::<f32>(4096, s[0], TAG).await.unwrap();
    let bx = x.block().clone();
    let done = write_one(&gpu, &res, s[0], &mut x);
    done.await.unwrap();
    // More work on the block, through the hooks, not awaited.
    res.prepare_block_use(x.id(), s[0], Access::Write).unwrap();
    let raw0 = res.stream_pool().raw(s[0]).unwrap();
    gpu.launch_kernel(raw0, &[MemAccess::write(&bx)]).unwrap();
    let _later = res.finish_block_use(x.id(), s[0], Access::Write).unwrap();
    drop(x);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A cancelled request: its handler dropped the launch's completion future
/// (a timeout, an abort) and then its buffer, with the kernel still
/// running. A dropped future proves nothing about the GPU: the free is an
/// ordinary stream-ordered one, so another stream that takes the memory
/// is ordered behind the kernel (the simulated device reports a write by
/// the kernel and the other stream's use as a race otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_completion_future_proves_nothing() {
    let (gpu, res, s) = slow_service(Duration::from_millis(5));
    let mut x = res.allocate_buffer::<f32>(4096, s[0], TAG).await.unwrap();
    let done = write_one(&gpu, &res, s[0], &mut x);
    // The handler is cancelled while awaiting, then its buffer goes.
    drop(done);
    drop(x);
    another_stream_writes(&gpu, &res, s[1]).await;
}

/// As [`a_dropped_completion_future_proves_nothing`], with the buffer
/// dropped on another thread after the future was dropped on this one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_dropped_elsewhere_after_its_future_proves_nothing() {
    let (gpu, res, s) = slow_service(Duration::from_millis(5));
    let mut x = res.allocate_buffer::<f32>(4096, s[0], TAG).await.unwrap();
    let done = write_one(&gpu, &res, s[0], &mut x);
    drop(done);
    std::thread::spawn(move || drop(x)).join().unwrap();
    res.inner().trim().unwrap();
    another_stream_writes(&gpu, &res, s[1]).await;
}

/// Stream `s` takes memory of the size the cancelled request freed and
/// writes it; once everything ran, the simulated device saw no race.
async fn another_stream_writes(gpu: &SimGpu, res: &Service, s: StreamId) {
    let mut y = res.allocate_buffer::<f32>(4096, s, TAG).await.unwrap();
    let done = write_one(gpu, res, s, &mut y);
    done.await.unwrap();
    drop(y);
    res.reap_pending().await.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
