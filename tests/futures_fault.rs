//! Device faults and failed notifications: every future resolves, none hangs.
//!
//! `tokio::time::timeout` is only a hang guard here: the fallback answers
//! within a few of its periods.

mod common;

use common::bounded::BoundedExt;

use std::time::Duration;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AllocTag, DriverCall, ResourceError, SimResource};
use streamalloc::{AsyncResource, Reaper};

const BLOCK: usize = 4096;
const TAG: AllocTag = AllocTag("fault");
const GUARD: Duration = common::guard(10);

fn slow(streams: usize) -> (common::Fixture<SimGpu>, AsyncResource<SimResource>) {
    let gpu = SimGpu::builder()
        .capacity(2 * BLOCK)
        // Slow enough that the futures park before the work is done, also
        // under Miri.
        .op_latency(Duration::from_millis(if cfg!(miri) { 500 } else { 20 }))
        .build();
    let f = common::sim_with(gpu, streams);
    let res = common::async_resource(&f);
    (f, res)
}

fn is_device_error(e: &ResourceError) -> bool {
    matches!(
        e,
        ResourceError::Driver { .. } | ResourceError::DeviceUnavailable { .. }
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_fault_fails_every_waiter_instead_of_hanging() {
    let (f, res) = slow(2);
    let gpu = f.sim.clone().unwrap();
    let (s0, s1) = (f.stream(0), f.stream(1));
    let held = res.try_allocate(BLOCK, s0, TAG).unwrap();
    let freed = res.try_allocate(BLOCK, s0, TAG).unwrap();
    for s in [s0, s1] {
        for _ in 0..50 {
            gpu.launch_kernel(f.pool.raw(s).unwrap(), &[MemAccess::write(&held)])
                .unwrap();
        }
    }
    let mut points = Vec::new();
    for _ in 0..10 {
        for s in [s0, s1] {
            points.push(tokio::spawn(
                res.completion(s).unwrap().bounded("completion"),
            ));
        }
    }
    // A free stuck behind the work, awaited.
    let free = tokio::spawn(res.deallocate(freed).unwrap().bounded("deallocate"));
    // An allocation on the other stream, waiting for that free to execute.
    let alloc = tokio::spawn({
        let res = res.clone();
        async move { res.allocate(BLOCK, s1, TAG).bounded("allocate").await }
    });
    let reap = tokio::spawn(res.reap_pending().bounded("reap_pending"));
    while res.parked_points() < 22 || res.waiting_allocations() < 1 {
        tokio::task::yield_now().await;
    }
    gpu.inject_device_fault();

    for p in points {
        let r = tokio::time::timeout(GUARD, p).await.expect("hang").unwrap();
        assert!(is_device_error(&r.unwrap_err()));
    }
    let r = tokio::time::timeout(GUARD, free)
        .await
        .expect("hang")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
    let r = tokio::time::timeout(GUARD, reap)
        .await
        .expect("hang")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
    let r = tokio::time::timeout(GUARD, alloc)
        .await
        .expect("hang")
        .unwrap();
    assert!(is_device_error(&r.unwrap_err()));
    assert_eq!(res.parked_points(), 0);
    assert_eq!(res.waiting_allocations(), 0);

    // New work fails at once.
    assert!(is_device_error(&res.completion(s0).unwrap_err()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_host_function_is_covered_by_the_fallback_query() {
    let f = common::sim_with(SimGpu::new(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let s = f.stream(0);
    let block = res.try_allocate(BLOCK, s, TAG).unwrap();
    gpu.fail_nth(DriverCall::LaunchHostFunc, 1);
    // Awaited free: its only notification's host function fails to queue.
    let r = tokio::time::timeout(GUARD, res.deallocate(block).unwrap().bounded("deallocate"))
        .await
        .expect("hang");
    assert_eq!(r, Ok(()));
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(gpu.call_count(DriverCall::LaunchHostFunc), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reaper_shutdown_on_a_dead_device_reports_instead_of_hanging() {
    let (f, res) = slow(1);
    let gpu = f.sim.clone().unwrap();
    let s = f.stream(0);
    let reaper = Reaper::spawn(&res);
    let block = res.try_allocate(BLOCK, s, TAG).unwrap();
    for _ in 0..20 {
        gpu.launch_kernel(f.pool.raw(s).unwrap(), &[MemAccess::write(&block)])
            .unwrap();
    }
    drop(res.deallocate(block).unwrap());
    gpu.inject_device_fault();
    let r = tokio::time::timeout(GUARD, reaper.shutdown())
        .await
        .expect("hang");
    // The free was pending when the device died: the drain reports it.
    assert!(is_device_error(&r.unwrap_err()));
    assert_eq!(res.parked_points(), 0);
}

/// One failed record of a free's notification is retried (by the
/// watchdog): the free completes and its bytes leave the accounting.
#[test]
fn one_failed_notification_record_is_retried() {
    let f = common::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let s = f.stream(0);
    let block = res.try_allocate(BLOCK, s, TAG).unwrap();
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    // The notifier's own record (no point has an event) fails.
    gpu.fail_nth(DriverCall::EventRecord, 1);
    let mut freed = res.deallocate(block).unwrap();
    common::drive(&gpu, &mut freed).unwrap();
    assert!(freed.is_complete());
    assert_eq!(res.bytes_outstanding(), 0);
}

/// A free whose notification can never be queued (every record fails) is
/// not reported complete: its bytes are still counted as pending.
#[test]
fn a_failed_free_is_not_complete() {
    let f = common::sim_with(SimGpu::builder().manual().build(), 1);
    let gpu = f.sim.clone().unwrap();
    let res = common::async_resource(&f);
    let s = f.stream(0);
    let block = res.try_allocate(BLOCK, s, TAG).unwrap();
    gpu.launch_kernel(f.pool.raw(s).unwrap(), &[]).unwrap();
    for nth in 1..=3 {
        gpu.fail_nth(DriverCall::EventRecord, nth);
    }
    let mut freed = res.deallocate(block).unwrap();
    let r = common::drive(&gpu, &mut freed);
    assert!(r.is_err(), "{r:?}");
    assert!(!freed.is_complete(), "a failed free reports complete");
    assert_eq!(res.bytes_outstanding(), BLOCK);
}

/// `finish_block_use` through the futures layer records the use and makes
/// its completion point; when either fails (an event record refused), the
/// call fails with nothing recorded: the free of the block then waits on no
/// use of the other stream, as if the call had not been made.
#[test]
fn a_failed_finish_records_no_use() {
    // Waits queued by the free of a block that stream 1 wrote, with its
    // finish failing at event record `fail` (`None`: the finish succeeds);
    // `finish: false` makes no finish call at all.
    let waits_at_free = |finish: bool, fail: Option<u64>| {
        let f = common::sim_with(SimGpu::builder().manual().build(), 2);
        let gpu = f.sim.clone().unwrap();
        let res = common::async_resource(&f);
        let (s0, s1) = (f.stream(0), f.stream(1));
        let block = res.try_allocate(BLOCK, s0, TAG).unwrap();
        res.prepare_block_use(block.id(), s1, streamalloc::Access::Write)
            .unwrap();
        gpu.launch_kernel(f.pool.raw(s1).unwrap(), &[MemAccess::write(&block)])
            .unwrap();
        if finish {
            if let Some(nth) = fail {
                gpu.fail_nth(DriverCall::EventRecord, nth);
            }
            let r = res.finish_block_use(block.id(), s1, streamalloc::Access::Write);
            assert_eq!(r.is_err(), fail.is_some(), "record {fail:?}: {r:?}");
        }
        let waits = gpu.call_count(DriverCall::StreamWaitEvent);
        drop(res.deallocate(block).unwrap());
        let waits = gpu.call_count(DriverCall::StreamWaitEvent) - waits;
        gpu.run_until_idle();
        waits
    };
    let (none, recorded) = (waits_at_free(false, None), waits_at_free(true, None));
    assert!(recorded > none, "a recorded use adds no wait at the free");
    for nth in 1..=2 {
        assert_eq!(
            waits_at_free(true, Some(nth)),
            none,
            "record {nth} failed: the failed finish left a use recorded"
        );
    }
}
