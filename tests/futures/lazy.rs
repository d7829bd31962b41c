//! `AsyncResource::completion_lazy`: a completion point that records
//! nothing until polled, asks the stream (`cuStreamQuery`) first, and
//! records its event only when the stream is still busy after the first
//! poll's spin.

use crate::support;

use std::task::Poll;
use std::time::Duration;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::gpu::{CaptureMode, CaptureStatus, Gpu};
use streamalloc::{AsyncResource, WaitPolicy, WhenBehind};
use streamalloc::{DriverCall, ResourceError, SimResource};
use support::{CountingWaker, drive, poll_once, step_until_ready};

/// Calls of the kinds a completion can make, read off the simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Calls {
    created: u64,
    recorded: u64,
    event_queries: u64,
    stream_queries: u64,
}

fn calls(gpu: &SimGpu) -> Calls {
    Calls {
        created: gpu.call_count(DriverCall::EventCreate),
        recorded: gpu.call_count(DriverCall::EventRecord),
        event_queries: gpu.call_count(DriverCall::EventQuery),
        stream_queries: gpu.call_count(DriverCall::StreamQuery),
    }
}

impl Calls {
    fn since(self, before: Calls) -> Calls {
        Calls {
            created: self.created - before.created,
            recorded: self.recorded - before.recorded,
            event_queries: self.event_queries - before.event_queries,
            stream_queries: self.stream_queries - before.stream_queries,
        }
    }
}

/// A manual simulated device with one stream, and a resource over it that
/// queries at every poll and never spins (so that a test sees each poll's
/// calls) and yields for an hour (it never parks unless told).
fn scene() -> (
    std::sync::Arc<SimGpu>,
    AsyncResource<SimResource>,
    streamalloc::StreamId,
    streamalloc::RawStream,
) {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy {
        spin: Duration::ZERO,
        yield_for: Duration::from_secs(3600),
        query_every: Duration::ZERO,
        behind: WhenBehind::Yield,
    });
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    (gpu, res, s, raw)
}

/// The case it exists for: the work is done by the time the future is
/// polled. One stream query, no event created or recorded; a
/// `completion()` made at the same place records one.
#[test]
fn an_idle_stream_completes_a_lazy_point_with_one_query_and_no_event() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    let before = calls(&gpu);
    let mut lazy = res.completion_lazy(s).unwrap();
    assert_eq!(calls(&gpu), before, "making it calls nothing");
    gpu.run_until_idle();
    let (_c, waker) = CountingWaker::new();
    assert_eq!(poll_once(&mut lazy, &waker), Poll::Ready(Ok(())));
    assert_eq!(
        calls(&gpu).since(before),
        Calls {
            created: 0,
            recorded: 0,
            event_queries: 0,
            stream_queries: 1
        }
    );
    assert_eq!(res.notifications(), 0);

    // A `completion()` at the same place records its event when made.
    let before = calls(&gpu);
    let mut eager = res.completion(s).unwrap();
    assert_eq!(calls(&gpu).since(before).recorded, 1);
    assert_eq!(drive(&gpu, &mut eager), Ok(()));
}

/// An idle stream has run everything queued before every point made so
/// far: one query settles them all, the points made after the polled one
/// included, and their futures complete with no driver call.
#[test]
fn one_idle_query_settles_every_point_made_before_it() {
    let (gpu, res, s, raw) = scene();
    let mut futs = Vec::new();
    for _ in 0..3 {
        gpu.launch_kernel(raw, &[]).unwrap();
        futs.push(res.completion_lazy(s).unwrap());
    }
    gpu.run_until_idle();
    let (_c, waker) = CountingWaker::new();
    let before = calls(&gpu);
    assert_eq!(poll_once(&mut futs[0], &waker), Poll::Ready(Ok(())));
    assert_eq!(calls(&gpu).since(before).stream_queries, 1);
    for fut in &mut futs[1..] {
        assert_eq!(poll_once(fut, &waker), Poll::Ready(Ok(())));
    }
    let total = calls(&gpu).since(before);
    assert_eq!(
        total,
        Calls {
            created: 0,
            recorded: 0,
            event_queries: 0,
            stream_queries: 1
        },
        "the earlier points were settled by the one query"
    );
}

/// A busy stream: the first poll's query says nothing about the point, so
/// the future records its event after the spin (here none) and waits on
/// it. It never completes before its work, whichever order the device runs
/// in.
#[test]
fn a_busy_stream_makes_the_point_record_its_event_and_never_complete_early() {
    for seed in 0..8 {
        let f = support::sim_with(SimGpu::builder().manual().seed(seed).build(), 2);
        let gpu = f.sim.clone().unwrap();
        let res = support::async_resource(&f);
        res.set_wait_policy(WaitPolicy {
            query_every: Duration::ZERO,
            ..WaitPolicy::DEFAULT
        });
        let (s, other) = (f.stream(0), f.stream(1));
        let raw = f.pool.raw(s).unwrap();
        for _ in 0..3 {
            gpu.launch_kernel(raw, &[]).unwrap();
        }
        gpu.launch_kernel(f.pool.raw(other).unwrap(), &[]).unwrap();
        let probe = gpu.event_create().unwrap();
        gpu.event_record(probe, raw).unwrap();
        let before = calls(&gpu);
        let mut fut = res.completion_lazy(s).unwrap();
        let (_c, waker) = CountingWaker::new();
        assert!(poll_once(&mut fut, &waker).is_pending());
        let first = calls(&gpu).since(before);
        assert!(first.stream_queries >= 1, "the first poll asks the stream");
        assert_eq!(first.recorded, 1, "busy after the spin: one event");
        let (_, steps) = step_until_ready(&gpu, &mut fut, &waker);
        assert!(gpu.event_query(probe).unwrap(), "ready before its point");
        assert!(steps >= 3, "three kernels had to run first");
        assert_eq!(calls(&gpu).since(before).recorded, 1, "recorded once");
        drop(fut);
        gpu.run_until_idle();
    }
}

/// Parking at once: the one query misses, the event is recorded, and the
/// notification waits on it (no record of the notifier's own).
#[test]
fn a_parked_lazy_point_is_notified_through_its_late_event() {
    let (gpu, res, s, raw) = scene();
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    gpu.launch_kernel(raw, &[]).unwrap();
    let before = calls(&gpu);
    let mut fut = res.completion_lazy(s).unwrap();
    let (counter, waker) = CountingWaker::new();
    assert!(poll_once(&mut fut, &waker).is_pending());
    assert_eq!(res.parked_points(), 1);
    assert_eq!(res.notifications(), 1);
    gpu.run_until_idle();
    assert_eq!(counter.count(), 1, "woken by the host function");
    assert_eq!(poll_once(&mut fut, &waker), Poll::Ready(Ok(())));
    let c = calls(&gpu).since(before);
    assert_eq!((c.stream_queries, c.recorded), (1, 1));
}

/// Work queued after the point and before the first poll delays it (the
/// documented price): the event recorded at the first poll covers it.
#[test]
fn work_queued_before_the_first_poll_delays_a_lazy_point() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut fut = res.completion_lazy(s).unwrap();
    gpu.launch_kernel(raw, &[]).unwrap();
    let later = gpu.event_create().unwrap();
    gpu.event_record(later, raw).unwrap();
    let (_c, waker) = CountingWaker::new();
    assert!(poll_once(&mut fut, &waker).is_pending());
    assert!(gpu.step(), "the point's own kernel runs");
    assert!(
        poll_once(&mut fut, &waker).is_pending(),
        "covers the later one"
    );
    assert_eq!(drive(&gpu, &mut fut), Ok(()));
    assert!(gpu.event_query(later).unwrap());
}

/// A stream that began a capture after the point was made is never
/// queried or recorded on: the capture stays valid, and the point
/// completes once the capture has ended.
#[test]
fn a_lazy_point_first_polled_in_a_capture_keeps_it_valid_and_completes_after() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut fut = res.completion_lazy(s).unwrap();
    gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
    let before = calls(&gpu);
    let (_c, waker) = CountingWaker::new();
    for _ in 0..3 {
        assert!(poll_once(&mut fut, &waker).is_pending());
    }
    let during = calls(&gpu).since(before);
    assert_eq!((during.stream_queries, during.recorded), (0, 0));
    assert!(matches!(
        gpu.capture_status(raw).unwrap(),
        CaptureStatus::Active(_)
    ));
    gpu.launch_kernel(raw, &[]).unwrap();
    let graph = gpu.end_capture(raw).expect("the capture stays valid");
    gpu.graph_destroy(graph).unwrap();
    assert_eq!(drive(&gpu, &mut fut), Ok(()));
}

/// Made while the stream captures: refused like `completion()`, nothing
/// marked.
#[test]
fn a_lazy_point_is_refused_in_a_capture() {
    let (gpu, res, s, raw) = scene();
    gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
    let e = res.completion_lazy(s).expect_err("refused in a capture");
    assert!(matches!(e, ResourceError::StreamCapturing { stream, .. } if stream == s));
    assert_eq!(res.wait_stats().points, 0);
    let graph = gpu.end_capture(raw).expect("the capture stays valid");
    gpu.graph_destroy(graph).unwrap();
}

/// A failed stream query is the future's error, as a failed event query
/// is; the point is let go of.
#[test]
fn a_failed_stream_query_is_the_futures_error() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    gpu.run_until_idle();
    let mut fut = res.completion_lazy(s).unwrap();
    gpu.fail_nth(DriverCall::StreamQuery, 1);
    let (_c, waker) = CountingWaker::new();
    match poll_once(&mut fut, &waker) {
        Poll::Ready(Err(ResourceError::Driver { call, .. })) => {
            assert_eq!(call, DriverCall::StreamQuery)
        }
        other => panic!("expected the query's error, got {other:?}"),
    }
    assert_eq!(res.parked_points(), 0);
    // The stream still works: the next point completes.
    let mut next = res.completion_lazy(s).unwrap();
    assert_eq!(poll_once(&mut next, &waker), Poll::Ready(Ok(())));
}

/// `is_complete` on a lazy point asks the stream, once, and records
/// nothing.
#[test]
fn is_complete_asks_the_stream_without_recording() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    let fut = res.completion_lazy(s).unwrap();
    let before = calls(&gpu);
    assert_eq!(fut.is_complete(), Ok(false));
    gpu.run_until_idle();
    assert_eq!(fut.is_complete(), Ok(true));
    let c = calls(&gpu).since(before);
    assert_eq!((c.stream_queries, c.recorded), (2, 0));
}

/// A lazy point dropped unpolled holds back no later point.
#[test]
fn a_dropped_lazy_point_holds_nothing_back() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    drop(res.completion_lazy(s).unwrap());
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut fut = res.completion_lazy(s).unwrap();
    assert_eq!(drive(&gpu, &mut fut), Ok(()));
    assert_eq!(res.parked_points(), 0);
}

/// A device that faulted before the first poll: the stream query reports
/// it, and the future resolves to the driver's error at once (no hang, no
/// event).
#[test]
fn a_faulted_device_is_the_lazy_points_error() {
    let (gpu, res, s, raw) = scene();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut fut = res.completion_lazy(s).unwrap();
    gpu.inject_device_fault();
    let (_c, waker) = CountingWaker::new();
    match poll_once(&mut fut, &waker) {
        Poll::Ready(Err(ResourceError::Driver { call, code, .. })) => {
            assert_eq!((call, code), (DriverCall::StreamQuery, 700))
        }
        other => panic!("expected the fault, got {other:?}"),
    }
}
