//! The library's driver calls per fill of `service_bench`'s "10,000 fills
//! with a spawned task awaiting each", counted with [`CountingGpu`] on the
//! simulated device, for both kinds of completion point ([`Point`]).
//!
//! cuda-async 0.5 pays, per fill, its memset and one `cuStreamQuery` when
//! the stream is idle by its first poll (more while its inline spin waits).
//! A `completion()` pays a `cuEventRecord` when made and a `cuEventQuery`
//! when polled; a `completion_lazy()` on a stream idle by its first poll
//! pays one `cuStreamQuery` and records nothing. (Both also ask whether
//! the stream captures, which the CUDA backend answers without the driver
//! while no capture is underway, `src/gpu/capture_gate.rs`, and which
//! `CountingGpu` does not count.)

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use streamalloc::DriverCall;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, StreamOrderedResource};
use streamalloc::{AsyncResource, WaitPolicy};
use streamalloc_measure::calls::{CallCounts, CountingGpu};
use streamalloc_measure::service::fills::Point;

const FILLS: u64 = 64;
const STREAMS: usize = 2;

type Counted = AsyncResource<StreamOrderedResource<CountingGpu<SimGpu>>>;

/// The futures layer over a counting backend of `gpu`.
fn counted(gpu: &Arc<SimGpu>) -> (Arc<CountingGpu<SimGpu>>, Counted) {
    let pool = Device::simulated(gpu, STREAMS).streams().clone();
    let counting = Arc::new(CountingGpu::new(gpu.clone()));
    let device = Device::new(counting.clone(), pool).expect("device");
    (
        counting,
        AsyncResource::on(&device).expect("async resource"),
    )
}

/// Per fill, the calls of the kinds a completion makes.
fn per_fill(c: &CallCounts) -> [u64; 5] {
    [
        DriverCall::MemsetAsync,
        DriverCall::EventCreate,
        DriverCall::EventRecord,
        DriverCall::EventQuery,
        DriverCall::StreamQuery,
    ]
    .map(|call| c.count(call))
}

/// The fill queued by the loop and awaited by a task that runs once the
/// device has run it (a manual device, stepped before each poll): the
/// stream is idle by the first poll, as for most of the 10,000 fills on the
/// H200.
fn idle_by_the_first_poll(point: Point) -> CallCounts {
    let gpu = SimGpu::builder().manual().build();
    let (counting, res) = counted(&gpu);
    let blocks: Vec<_> = res
        .stream_pool()
        .ids()
        .map(|s| res.try_allocate(256, s, AllocTag("fills")).unwrap())
        .collect();
    gpu.run_until_idle();
    let before = counting.counts();
    for i in 0..FILLS as usize {
        let b = &blocks[i % blocks.len()];
        let raw = res.stream_pool().raw(b.stream()).unwrap();
        // SAFETY: a stream of the pool the resource holds; the block is live.
        unsafe { counting.memset_async(b.ptr(), 3, 4, raw) }.unwrap();
        let mut fut = point.make(&res, b.stream()).unwrap();
        gpu.run_until_idle();
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(
            std::pin::Pin::new(&mut fut).poll(&mut cx),
            Poll::Ready(Ok(()))
        );
    }
    let calls = counting.counts().since(&before);
    for b in blocks {
        drop(res.deallocate(b).unwrap());
    }
    calls
}

#[test]
fn a_lazy_point_on_an_idle_stream_costs_one_stream_query_and_no_event() {
    let recorded = idle_by_the_first_poll(Point::Recorded);
    let lazy = idle_by_the_first_poll(Point::Lazy);
    // memset, event create (one per stream: the events are reused), event
    // record, event query, stream query.
    assert_eq!(
        per_fill(&recorded),
        [FILLS, STREAMS as u64, FILLS, FILLS, 0]
    );
    assert_eq!(per_fill(&lazy), [FILLS, 0, 0, 0, FILLS]);
    // Nothing else (the capture check is not counted: `CountingGpu` keeps
    // the trait's default, a backend that never captures).
    for c in [&recorded, &lazy] {
        let other: u64 = DriverCall::ALL
            .iter()
            .filter(|&&k| {
                ![
                    DriverCall::MemsetAsync,
                    DriverCall::EventCreate,
                    DriverCall::EventRecord,
                    DriverCall::EventQuery,
                    DriverCall::StreamQuery,
                    DriverCall::StreamGetCaptureInfo,
                ]
                .contains(&k)
            })
            .map(|&k| c.count(k))
            .sum();
        assert_eq!(other, 0, "{c:?}");
    }
}

/// The fill queued in the task, which awaits it at once on a threaded
/// device with a spin long enough to see it done: the lazy point waits
/// with stream queries and never records; the recorded one records each.
#[tokio::test(flavor = "current_thread")]
async fn a_lazy_point_awaited_at_once_records_nothing_when_the_spin_sees_the_work_done() {
    for point in Point::ALL {
        let gpu = SimGpu::new();
        let (counting, res) = counted(&gpu);
        res.set_wait_policy(WaitPolicy {
            spin: Duration::from_secs(5),
            query_every: Duration::ZERO,
            ..WaitPolicy::DEFAULT
        });
        let s = res.stream_pool().ids().next().unwrap();
        let raw = res.stream_pool().raw(s).unwrap();
        let block = res.try_allocate(256, s, AllocTag("fills")).unwrap();
        // SAFETY: a stream of the pool the resource holds.
        unsafe { counting.stream_synchronize(raw) }.unwrap();
        let before = counting.counts();
        for _ in 0..FILLS {
            // SAFETY: as above; the block is live.
            unsafe { counting.memset_async(block.ptr(), 3, 4, raw) }.unwrap();
            point.make(&res, s).unwrap().await.unwrap();
        }
        let c = counting.counts().since(&before);
        match point {
            Point::Recorded => {
                assert_eq!(c.count(DriverCall::EventRecord), FILLS);
                assert_eq!(c.count(DriverCall::StreamQuery), 0);
            }
            Point::Lazy => {
                assert_eq!(c.count(DriverCall::EventRecord), 0, "{c:?}");
                assert_eq!(c.count(DriverCall::EventCreate), 0);
                assert!(c.count(DriverCall::StreamQuery) >= FILLS);
            }
        }
        res.deallocate(block).unwrap().await.unwrap();
        assert_eq!(res.bytes_outstanding(), 0);
    }
}

/// Every streamalloc fills row of `service_bench` runs to the end on a
/// threaded simulated device (10,000 fills each), without a race, and
/// leaves nothing outstanding.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_streamalloc_fills_row_runs_on_the_simulated_device() {
    use streamalloc_measure::service::fills;
    let gpu = SimGpu::new();
    let device = Device::simulated(&gpu, 8);
    let res = AsyncResource::on(&device).expect("async resource");
    let targets = fills::fill_targets(&res).unwrap();
    fills::plain(&res, &targets).unwrap();
    for point in Point::ALL {
        fills::spawned_await(&res, &targets, point).await.unwrap();
        fills::spawned_fill_and_await(&res, &targets, point)
            .await
            .unwrap();
    }
    assert_eq!(res.parked_points(), 0);
    for (block, _) in targets {
        drop(res.deallocate(block).unwrap());
    }
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
