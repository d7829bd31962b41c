//! EventFuture: completion points, coalesced notifications, bad input.

use crate::support;

use std::task::Poll;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{Access, AllocTag, DriverCall, ResourceError, StreamId};
use streamalloc::{WaitPolicy, WaitStats, WhenBehind};
use support::{CountingWaker, poll_once, step_until_ready};

#[test]
fn a_future_never_completes_before_its_point() {
    for seed in 0..8 {
        let f = support::sim_with(SimGpu::builder().manual().seed(seed).build(), 2);
        let gpu = f.sim.clone().unwrap();
        let res = support::async_resource(&f);
        // Every poll queries (the loop below steps the device between
        // polls and must see each step).
        res.set_wait_policy(WaitPolicy {
            query_every: std::time::Duration::ZERO,
            ..WaitPolicy::DEFAULT
        });
        let (s, other) = (f.stream(0), f.stream(1));
        let raw = f.pool.raw(s).unwrap();
        let block = res.try_allocate(4096, s, AllocTag::UNTAGGED).unwrap();
        for _ in 0..3 {
            gpu.launch_kernel(raw, &[MemAccess::write(&block)]).unwrap();
        }
        // Work on another stream, so that steps interleave.
        gpu.launch_kernel(f.pool.raw(other).unwrap(), &[]).unwrap();
        // A probe recorded right after the kernels: the future's point is
        // after it, so the future must not be ready before the probe is.
        let probe = gpu.event_create().unwrap();
        gpu.event_record(probe, raw).unwrap();
        let mut fut = res.finish_block_use(block.id(), s, Access::Write).unwrap();
        let (counter, waker) = CountingWaker::new();
        assert!(poll_once(&mut fut, &waker).is_pending());
        assert_eq!(res.parked_points(), 1);
        let (_, steps) = step_until_ready(&gpu, &mut fut, &waker);
        assert!(gpu.event_query(probe).unwrap(), "ready before its point");
        assert!(steps >= 3, "three kernels had to run first");
        assert_eq!(res.parked_points(), 0);
        let _ = counter.count();
        drop(fut);
        gpu.run_until_idle();
    }
}

#[test]
fn a_host_function_notification_wakes_the_parked_task() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    let s = f.stream(0);
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let mut futs: Vec<_> = (0..5).map(|_| res.completion(s).unwrap()).collect();
    let (counter, waker) = CountingWaker::new();
    for fut in &mut futs {
        assert!(poll_once(fut, &waker).is_pending());
    }
    // One notification covers all five points.
    assert_eq!(res.notifications(), 1);
    assert_eq!(gpu.call_count(DriverCall::LaunchHostFunc), 1);
    gpu.run_until_idle();
    // The host function ran: every parked task was woken, in one cut.
    assert_eq!(counter.count(), 5);
    for fut in &mut futs {
        assert_eq!(poll_once(fut, &waker), Poll::Ready(Ok(())));
    }
}

#[test]
fn notifications_run_on_a_lane_of_their_own() {
    let f = support::sim(3);
    let gpu = f.sim.clone().unwrap();
    let before = gpu.stream_count();
    let res = support::async_resource(&f);
    assert_eq!(
        gpu.stream_count(),
        before + 3,
        "one notifier stream per user stream"
    );
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut fut = res.completion(s).unwrap();
    let (_c, waker) = CountingWaker::new();
    assert!(poll_once(&mut fut, &waker).is_pending());
    // The user stream can drain completely while the host function has not
    // run: it is not queued behind the user's work on that stream.
    gpu.stream_synchronize(raw).unwrap();
    gpu.run_until_idle();
    assert_eq!(poll_once(&mut fut, &waker), Poll::Ready(Ok(())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_concurrent_futures_all_complete() {
    let f = support::sim_with(SimGpu::new(), 8);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    // A hundred under Miri: the same code, fewer times.
    let n = support::scaled(10_000, 100);
    let mut futs = Vec::with_capacity(n);
    for i in 0..n {
        let s = f.stream(i % 8);
        gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
        futs.push(res.completion(s).unwrap());
    }
    let tasks: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut ok = 0;
    for t in tasks {
        let r = tokio::time::timeout(support::guard(60), t)
            .await
            .expect("hang guard")
            .unwrap();
        assert_eq!(r, Ok(()));
        ok += 1;
    }
    assert_eq!(ok, n);
    assert_eq!(res.parked_points(), 0);
    // Coalesced: far fewer host functions than futures (under Miri, where
    // the interpreter's pace parks futures one by one, fewer at least).
    let bound = support::scaled(n / 10, n) as u64;
    assert!(
        gpu.call_count(DriverCall::LaunchHostFunc) < bound,
        "{} host functions for {n} futures",
        gpu.call_count(DriverCall::LaunchHostFunc)
    );
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    let s = f.stream(0);
    let block = res.try_allocate(4096, s, AllocTag::UNTAGGED).unwrap();
    drop(res.finish_block_use(block.id(), s, Access::Write).unwrap());
    let events_before = res.inner().pending_use_event_count(block.ptr());
    let records = gpu.call_count(DriverCall::EventRecord);

    let unknown = StreamId::new(0, 7);
    let foreign = StreamId::new(3, 0);
    assert!(matches!(
        res.completion(unknown),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert!(matches!(
        res.completion(foreign),
        Err(ResourceError::WrongDevice { .. })
    ));
    assert!(matches!(
        res.finish_block_use(block.id(), unknown, Access::Read),
        Err(ResourceError::ForeignStream { .. })
    ));
    let stale = block.clone();
    res.deallocate(block).unwrap();
    // A second free of the same block: refused, nothing queued.
    let pending = res.inner().pending_free_bytes();
    let outstanding = res.bytes_outstanding();
    assert!(matches!(
        res.deallocate(stale.clone()),
        Err(ResourceError::DoubleFree { .. })
    ));
    assert!(matches!(
        res.finish_block_use(stale.id(), s, Access::Read),
        Err(ResourceError::DoubleFree { .. })
    ));
    assert_eq!(res.inner().pending_free_bytes(), pending);
    assert_eq!(res.bytes_outstanding(), outstanding);
    assert_eq!(events_before, Some(1));
    // Only the deallocate's own notification recorded an event since.
    assert_eq!(gpu.call_count(DriverCall::EventRecord), records + 1);
    assert_eq!(res.parked_points(), 0);
}

#[test]
fn a_failed_event_record_is_an_error_not_a_hang() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    let s = f.stream(0);
    gpu.fail_nth(DriverCall::EventRecord, 1);
    assert!(matches!(
        res.completion(s),
        Err(ResourceError::Driver {
            call: DriverCall::EventRecord,
            ..
        })
    ));
    assert_eq!(res.parked_points(), 0);
    // The next one works.
    let mut fut = res.completion(s).unwrap();
    let (_c, waker) = CountingWaker::new();
    gpu.run_until_idle();
    assert_eq!(poll_once(&mut fut, &waker), Poll::Ready(Ok(())));
}

#[test]
fn a_yielding_future_queues_no_notification_until_it_parks() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    assert_eq!(res.wait_policy(), WaitPolicy::DEFAULT);
    // A yield budget no test run can exhaust, so that the result does not
    // depend on the machine's speed.
    res.set_wait_policy(WaitPolicy {
        spin: std::time::Duration::ZERO,
        yield_for: std::time::Duration::from_secs(3600),
        query_every: std::time::Duration::ZERO,
        behind: WhenBehind::Park,
    });
    let s = f.stream(0);
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let mut first = res.completion(s).unwrap();
    let mut second = res.completion(s).unwrap();
    let (counter, waker) = CountingWaker::new();
    // Yields: wakes itself to be polled again, queues no host function.
    assert!(poll_once(&mut first, &waker).is_pending());
    assert_eq!(counter.count(), 1);
    assert!(poll_once(&mut first, &waker).is_pending());
    assert_eq!(counter.count(), 2);
    assert_eq!(res.notifications(), 0);
    // Behind a pending point of the same stream: parks at once, and its
    // notification covers the first one too.
    assert!(poll_once(&mut second, &waker).is_pending());
    assert_eq!(res.notifications(), 1);
    assert_eq!(counter.count(), 2);
    gpu.run_until_idle();
    assert_eq!(poll_once(&mut first, &waker), Poll::Ready(Ok(())));
    assert_eq!(support::drive(&gpu, &mut second), Ok(()));
    assert_eq!(res.notifications(), 1);
}

#[test]
fn the_next_notification_is_queued_when_one_lands_with_more_pending() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    let (_c, waker) = CountingWaker::new();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut first = res.completion(s).unwrap();
    assert!(poll_once(&mut first, &waker).is_pending());
    // Marked after the first notification was queued: not covered by it.
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut second = res.completion(s).unwrap();
    assert!(poll_once(&mut second, &waker).is_pending());
    assert_eq!(res.notifications(), 1, "one in flight per stream");
    assert_eq!(support::drive(&gpu, &mut first), Ok(()));
    // The landing notification saw the second point pending and had the
    // dispatcher (here the watchdog thread) queue the next one.
    let guard = std::time::Instant::now();
    while res.notifications() < 2 {
        assert!(guard.elapsed() < support::guard(10), "hang");
        std::thread::yield_now();
    }
    assert_eq!(support::drive(&gpu, &mut second), Ok(()));
    assert_eq!(res.notifications(), 2);
}

/// A done query of one point settles every earlier point, and one more
/// query of the stream's newest point settles the rest: awaiting many
/// finished points costs two queries, not one each. After a query of the
/// newest point that said "not yet", the next one waits for eight more
/// points.
#[test]
fn one_done_query_settles_the_rest_of_the_stream() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    let mut futs = Vec::new();
    for _ in 0..20 {
        gpu.launch_kernel(raw, &[]).unwrap();
        futs.push(res.completion(s).unwrap());
    }
    let queries = || gpu.call_count(DriverCall::EventQuery);
    // Only the first two points run (a kernel and a record each).
    for _ in 0..4 {
        assert!(gpu.step());
    }
    let before = queries();
    // The second point is done and settles the first; the newest is not.
    assert!(matches!(futs[1].is_complete(), Ok(true)));
    assert_eq!(queries(), before + 2);
    assert!(matches!(futs[0].is_complete(), Ok(true)));
    assert_eq!(queries(), before + 2, "settled without a query");
    assert_eq!(res.parked_points(), 18);

    gpu.run_until_idle();
    // Right after a miss, a done point does not try the newest again...
    let before = queries();
    assert!(matches!(futs[2].is_complete(), Ok(true)));
    assert_eq!(queries(), before + 1);
    assert_eq!(res.parked_points(), 17);
    // ...eight points later it does, and that settles the whole stream.
    assert!(matches!(futs[10].is_complete(), Ok(true)));
    assert_eq!(queries(), before + 3);
    assert_eq!(res.parked_points(), 0);
    let (_counter, waker) = CountingWaker::new();
    for fut in &mut futs {
        assert!(poll_once(fut, &waker).is_ready());
    }
    assert_eq!(queries(), before + 3, "every point settled without a query");
}

/// While spinning or yielding, the event is queried at most once per
/// `query_every` (a tight loop of queries would contend with the threads
/// submitting work).
#[test]
fn queries_are_spaced_by_query_every() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy {
        spin: std::time::Duration::from_millis(2),
        yield_for: std::time::Duration::from_secs(3600),
        query_every: std::time::Duration::from_secs(3600),
        ..WaitPolicy::DEFAULT
    });
    let s = f.stream(0);
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let mut fut = res.completion(s).unwrap();
    let (_counter, waker) = CountingWaker::new();
    let before = gpu.call_count(DriverCall::EventQuery);
    assert!(poll_once(&mut fut, &waker).is_pending());
    assert!(poll_once(&mut fut, &waker).is_pending());
    assert_eq!(
        gpu.call_count(DriverCall::EventQuery),
        before + 1,
        "one query, then none for 2 ms of spinning and a yield"
    );
    gpu.run_until_idle();
    res.set_wait_policy(WaitPolicy::DEFAULT);
}

/// A notification for points that all have their own events waits on the
/// newest one: nothing more is recorded on the user's stream (the thread
/// that parks is often not the one submitting to it). A free has no event
/// of its own, so its notification records the notifier's.
#[test]
fn a_notification_reuses_the_newest_points_event() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    let s = f.stream(0);
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let mut futs: Vec<_> = (0..3).map(|_| res.completion(s).unwrap()).collect();
    let records = gpu.call_count(DriverCall::EventRecord);
    assert_eq!(records, 3, "one per point");
    let (counter, waker) = CountingWaker::new();
    for fut in &mut futs {
        assert!(poll_once(fut, &waker).is_pending());
    }
    assert_eq!(res.notifications(), 1);
    assert_eq!(gpu.call_count(DriverCall::EventRecord), records);
    gpu.run_until_idle();
    assert_eq!(counter.count(), 3);
    for fut in &mut futs {
        assert_eq!(poll_once(fut, &waker), Poll::Ready(Ok(())));
    }

    // A free after the last point: the notification must cover it, so it
    // records an event of its own.
    let block = res.try_allocate(4096, s, AllocTag::UNTAGGED).unwrap();
    let records = gpu.call_count(DriverCall::EventRecord);
    let mut freed = res.deallocate(block).unwrap();
    assert!(poll_once(&mut freed, &waker).is_pending());
    assert_eq!(gpu.call_count(DriverCall::EventRecord), records + 1);
    gpu.run_until_idle();
    assert_eq!(poll_once(&mut freed, &waker), Poll::Ready(Ok(())));
    assert_eq!(res.bytes_outstanding(), 0);
}

/// With [`WhenBehind::Yield`], a point behind a pending one neither queries nor
/// parks: it yields until the earlier point settles (here by its own
/// future's query), then queries. No host function is queued at all.
#[test]
fn a_point_behind_a_pending_one_yields_without_querying() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy {
        spin: std::time::Duration::ZERO,
        yield_for: std::time::Duration::from_secs(3600),
        query_every: std::time::Duration::ZERO,
        behind: WhenBehind::Yield,
    });
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut first = res.completion(s).unwrap();
    gpu.launch_kernel(raw, &[]).unwrap();
    let mut second = res.completion(s).unwrap();
    let queries = || gpu.call_count(DriverCall::EventQuery);
    let (counter, waker) = CountingWaker::new();
    let before = res.wait_stats();
    // The first point queries (pending) and yields.
    assert!(poll_once(&mut first, &waker).is_pending());
    let after_first = queries();
    // The second is behind it: it yields without a query.
    for polls in 1..=3 {
        assert!(poll_once(&mut second, &waker).is_pending());
        assert_eq!(
            queries(),
            after_first,
            "a point behind a pending one queried"
        );
        assert_eq!(counter.count(), 1 + polls, "it yields: wakes its own task");
    }
    assert_eq!(res.notifications(), 0);
    assert_eq!(res.parked_points(), 2);
    // The first kernel and record run: the first point's query settles it.
    assert!(gpu.step() && gpu.step());
    assert_eq!(poll_once(&mut first, &waker), Poll::Ready(Ok(())));
    // No longer behind: the second queries, pending until its kernel ran.
    let q = queries();
    assert!(poll_once(&mut second, &waker).is_pending());
    assert_eq!(queries(), q + 1);
    gpu.run_until_idle();
    assert_eq!(poll_once(&mut second, &waker), Poll::Ready(Ok(())));
    assert_eq!(res.notifications(), 0, "no host function: nothing parked");
    drop((first, second));
    let stats = res.wait_stats().since(&before);
    assert_eq!(stats.parks, 0);
    assert_eq!(stats.notifications, 0);
    assert_eq!(
        stats.yields, 5,
        "one yield of the first, three behind, one after"
    );
    assert_eq!(
        stats.queries,
        queries() - before.queries - stats.frontier_queries
    );
}

/// A point yielding behind a pending one still parks when its yield budget
/// ends: the earlier point may never be polled.
#[test]
fn a_yielding_point_behind_parks_when_its_budget_ends() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    // Longer under Miri, where one poll can take milliseconds: the first
    // poll must end inside the budget.
    let yield_for = std::time::Duration::from_millis(if cfg!(miri) { 2000 } else { 5 });
    res.set_wait_policy(WaitPolicy {
        spin: std::time::Duration::ZERO,
        yield_for,
        query_every: std::time::Duration::ZERO,
        behind: WhenBehind::Yield,
    });
    let s = f.stream(0);
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let never_polled = res.completion(s).unwrap();
    let mut behind = res.completion(s).unwrap();
    let (_counter, waker) = CountingWaker::new();
    assert!(poll_once(&mut behind, &waker).is_pending());
    assert_eq!(res.notifications(), 0);
    std::thread::sleep(2 * yield_for);
    assert!(poll_once(&mut behind, &waker).is_pending());
    assert_eq!(
        res.notifications(),
        1,
        "out of budget: parked and asked for one"
    );
    assert_eq!(support::drive(&gpu, &mut behind), Ok(()));
    drop(never_polled);
}

/// `wait_stats` counts what futures did: here one query and park for the
/// first point, parks at once for the four behind it, one notification.
#[test]
fn wait_stats_count_points_queries_parks_and_notifications() {
    let f = support::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = support::async_resource(&f);
    res.set_wait_policy(WaitPolicy::PARK_AT_ONCE);
    let s = f.stream(0);
    let before = res.wait_stats();
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    let mut futs: Vec<_> = (0..5).map(|_| res.completion(s).unwrap()).collect();
    let (_counter, waker) = CountingWaker::new();
    for fut in &mut futs {
        assert!(poll_once(fut, &waker).is_pending());
    }
    gpu.run_until_idle();
    for fut in &mut futs {
        assert_eq!(poll_once(fut, &waker), Poll::Ready(Ok(())));
    }
    drop(futs);
    let stats = res.wait_stats().since(&before);
    let mut expected = WaitStats::default();
    expected.points = 5;
    expected.queries = 1;
    expected.parks = 5;
    expected.notifications = 1;
    assert_eq!(stats, expected);
}
