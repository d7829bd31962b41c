//! Waiting allocations: back-pressure, first come first served, cancellation.

use crate::support;

use support::bounded::BoundedExt;

use std::sync::Arc;
use std::task::Poll;

use streamalloc::AsyncResource;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, ResourceError, SimResource, StreamId};
use support::{CountingWaker, poll_once};

const BLOCK: usize = 4096;
const TAG: AllocTag = AllocTag("test");

fn small(
    blocks: usize,
    streams: usize,
    manual: bool,
) -> (support::Fixture<SimGpu>, AsyncResource<SimResource>) {
    let b = SimGpu::builder().capacity(blocks * BLOCK);
    let b = if manual { b.manual() } else { b };
    let f = support::sim_with(b.build(), streams);
    let res = support::async_resource(&f);
    (f, res)
}

#[test]
fn try_allocate_fails_at_once_and_changes_nothing() {
    let (f, res) = small(2, 1, true);
    let s = f.stream(0);
    let _a = res.try_allocate(BLOCK, s, TAG).unwrap();
    let _b = res.try_allocate(BLOCK, s, TAG).unwrap();
    let before = res.bytes_outstanding();
    assert!(matches!(
        res.try_allocate(BLOCK, s, TAG),
        Err(ResourceError::OutOfMemory {
            requested: BLOCK,
            ..
        })
    ));
    assert_eq!(res.bytes_outstanding(), before);
    assert_eq!(res.waiting_allocations(), 0);
}

#[test]
fn waiters_are_served_first_come_first_served() {
    let (f, res) = small(2, 1, true);
    let s = f.stream(0);
    let a = res.try_allocate(BLOCK, s, TAG).unwrap();
    let b = res.try_allocate(BLOCK, s, TAG).unwrap();
    let mut waiters: Vec<_> = (0..3).map(|_| res.allocate(BLOCK, s, TAG)).collect();
    let wakers: Vec<_> = (0..3).map(|_| CountingWaker::new()).collect();
    for (w, (_, waker)) in waiters.iter_mut().zip(&wakers) {
        assert!(poll_once(w, waker).is_pending());
        assert!(w.is_waiting());
    }
    assert_eq!(res.waiting_allocations(), 3);

    // One block comes back (reusable on its stream at once): only the head
    // is woken, and it gets it.
    drop(res.deallocate(a).unwrap());
    // At least once (see `a_woken_waiter_that_is_dropped_passes_the_wake_on`).
    assert!(wakers[0].0.count() >= 1);
    assert_eq!(wakers[2].0.count(), 0);
    // Memory that came back is the head's: a try_allocate may not take it.
    let before = res.bytes_outstanding();
    assert_eq!(
        res.try_allocate(BLOCK, s, TAG).unwrap_err(),
        ResourceError::AllocationsWaiting { waiting: 3 }
    );
    assert_eq!(res.bytes_outstanding(), before);
    assert_eq!(res.waiting_allocations(), 3);
    let first = match poll_once(&mut waiters[0], &wakers[0].1) {
        Poll::Ready(Ok(block)) => block,
        other => panic!("head not served: {other:?}"),
    };
    // The third may not overtake the second.
    assert!(poll_once(&mut waiters[2], &wakers[2].1).is_pending());
    assert!(poll_once(&mut waiters[1], &wakers[1].1).is_pending());
    assert_eq!(res.waiting_allocations(), 2);

    drop(res.deallocate(b).unwrap());
    assert!(matches!(
        poll_once(&mut waiters[1], &wakers[1].1),
        Poll::Ready(Ok(_))
    ));
    assert!(poll_once(&mut waiters[2], &wakers[2].1).is_pending());
    drop(res.deallocate(first).unwrap());
    assert!(matches!(
        poll_once(&mut waiters[2], &wakers[2].1),
        Poll::Ready(Ok(_))
    ));
    assert_eq!(res.waiting_allocations(), 0);
}

#[test]
fn a_woken_waiter_that_is_dropped_passes_the_wake_on() {
    let (f, res) = small(1, 1, true);
    let s = f.stream(0);
    let a = res.try_allocate(BLOCK, s, TAG).unwrap();
    let mut w1 = res.allocate(BLOCK, s, TAG);
    let mut w2 = res.allocate(BLOCK, s, TAG);
    let (c1, k1) = CountingWaker::new();
    let (c2, k2) = CountingWaker::new();
    assert!(poll_once(&mut w1, &k1).is_pending());
    assert!(poll_once(&mut w2, &k2).is_pending());
    drop(res.deallocate(a).unwrap());
    // At least once: the watchdog's period may wake the head too (memory
    // returned to other devices or budgets, as other tests of this binary
    // do, no longer does: `wake_scope.rs`).
    assert!(c1.count() >= 1, "the head is woken");
    assert_eq!(c2.count(), 0);
    // Cancelled after its wake-up, before it ran.
    drop(w1);
    assert!(c2.count() >= 1, "the wake-up moved to the next waiter");
    let block = match poll_once(&mut w2, &k2) {
        Poll::Ready(Ok(b)) => b,
        other => panic!("not served: {other:?}"),
    };
    assert_eq!(res.waiting_allocations(), 0);
    drop(res.deallocate(block).unwrap());
}

#[test]
fn hopeless_or_invalid_requests_fail_at_once() {
    let (f, res) = small(2, 1, true);
    let s = f.stream(0);
    let (_c, waker) = CountingWaker::new();
    let mut huge = res.allocate(3 * BLOCK, s, TAG);
    assert!(matches!(
        poll_once(&mut huge, &waker),
        Poll::Ready(Err(ResourceError::OutOfMemory { .. }))
    ));
    let mut unknown = res.allocate(BLOCK, StreamId::new(0, 9), TAG);
    assert!(matches!(
        poll_once(&mut unknown, &waker),
        Poll::Ready(Err(ResourceError::ForeignStream { .. }))
    ));
    assert_eq!(res.waiting_allocations(), 0);
    assert_eq!(res.bytes_outstanding(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_freed_on_another_stream_serves_a_waiter_once_executed() {
    let (f, res) = small(1, 2, false);
    let (s0, s1) = (f.stream(0), f.stream(1));
    let a = res.try_allocate(BLOCK, s0, TAG).unwrap();
    let waiting = tokio::spawn({
        let res = res.clone();
        async move { res.allocate(BLOCK, s1, TAG).bounded("allocate").await }
    });
    while res.waiting_allocations() == 0 {
        tokio::task::yield_now().await;
    }
    // Not awaited: the notification, not the handle, returns the memory.
    drop(res.deallocate(a).unwrap());
    let block = tokio::time::timeout(support::guard(10), waiting)
        .await
        .expect("hang guard")
        .unwrap()
        .unwrap();
    assert_eq!(block.stream(), s1);
    res.reap_pending().bounded("reap_pending").await.unwrap();
    assert_eq!(res.bytes_outstanding(), BLOCK);
    res.deallocate(block)
        .unwrap()
        .bounded("deallocate")
        .await
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_leak_and_others_are_served() {
    let (f, res) = small(2, 2, false);
    let res = Arc::new(res);
    let gpu = f.sim.clone().unwrap();
    let pool = f.pool.clone();
    // Fill the device, so that every task below has to wait.
    let held = [
        res.try_allocate(BLOCK, f.stream(0), TAG).unwrap(),
        res.try_allocate(BLOCK, f.stream(1), TAG).unwrap(),
    ];
    let mut tasks = Vec::new();
    for i in 0..12 {
        let res = res.clone();
        let (gpu, pool) = (gpu.clone(), pool.clone());
        let s = f.stream(i % 2);
        tasks.push(tokio::spawn(async move {
            let block = res.allocate(BLOCK, s, TAG).bounded("allocate").await?;
            gpu.launch_kernel(pool.raw(s)?, &[MemAccess::write(&block)])
                .unwrap();
            res.completion(s)?.bounded("completion").await?;
            res.deallocate(block)?.bounded("deallocate").await
        }));
    }
    while res.waiting_allocations() < 12 {
        tokio::task::yield_now().await;
    }
    // Cancel every third waiter, in the middle of the queue and at its head.
    let mut kept = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        if i % 3 == 0 {
            t.abort();
            assert!(t.await.unwrap_err().is_cancelled());
        } else {
            kept.push(t);
        }
    }
    assert_eq!(res.waiting_allocations(), 8);
    for block in held {
        drop(res.deallocate(block).unwrap());
    }
    for t in kept {
        let r = tokio::time::timeout(support::guard(20), t)
            .await
            .expect("hang guard")
            .unwrap();
        assert_eq!(r, Ok(()));
    }
    res.reap_pending().bounded("reap_pending").await.unwrap();
    assert_eq!(res.waiting_allocations(), 0);
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
