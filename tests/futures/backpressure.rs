//! Back-pressure a service can see: waiting is counted and traced as
//! waiting (not failing), the queue's length and oldest wait are readable,
//! and tags carry a request's identity while statistics group by kind.

use std::time::Duration;

use streamalloc::AsyncResource;
use streamalloc::ResourceBuilder;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, Tag, gpu::sim::SimGpu};
use streamalloc::{Budget, FALLBACK_PERIOD, Stats};

const MIB: usize = 1 << 20;
const HANG: Duration = Duration::from_secs(20);

/// Stats over a budget of `limit` bytes, through the futures layer.
fn stack(
    limit: usize,
) -> (
    Device,
    Stats,
    AsyncResource<impl DeviceMemoryResource + 'static>,
) {
    let device = Device::sim(&SimGpu::new(), 1);
    let stats = Stats::new();
    let layers = ResourceBuilder::new()
        .tracing()
        .stats_with(&stats)
        .budget(&Budget::new(limit));
    let res = AsyncResource::build(&device, &layers).unwrap();
    (device, stats, res)
}

/// Yields until `f` holds (the simulator's device thread runs the frees).
async fn until(mut f: impl FnMut() -> bool) {
    tokio::time::timeout(HANG, async {
        while !f() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("never happened");
}

#[tokio::test]
async fn a_request_that_waits_is_counted_waited_not_failed() {
    let (device, stats, res) = stack(2 * MIB);
    let s = device.stream(0).unwrap();
    let first = res
        .allocate_buffer::<u8>(2 * MIB, s, AllocTag("input"))
        .await
        .unwrap();
    assert_eq!(res.queue_stats().waiting, 0);
    assert_eq!(res.oldest_wait(), None);

    let waiting = tokio::spawn({
        let res = res.clone();
        async move { res.allocate_buffer::<u8>(MIB, s, AllocTag("input")).await }
    });
    until(|| res.waiting_allocations() == 1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let q = res.queue_stats();
    assert_eq!(q.waiting, 1);
    assert!(q.oldest_wait.unwrap() >= Duration::from_millis(5), "{q:?}");

    drop(first);
    let second = tokio::time::timeout(HANG, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let q = res.queue_stats();
    assert_eq!((q.waiting, q.served, q.failed, q.cancelled), (0, 1, 0, 0));
    assert!(q.wait_max >= Duration::from_millis(5) && q.wait_total == q.wait_max);

    let snap = stats.snapshot();
    let input = snap.tag(AllocTag("input")).unwrap();
    assert_eq!(
        input.failed_allocations, 0,
        "a wait counted as a failure:\n{snap}"
    );
    assert!(input.refused_tries >= 1, "{snap}");
    assert_eq!(input.waited, 1);
    assert!(input.wait_max_ns >= 5_000_000, "{snap}");
    assert_eq!(input.wait_mean_ns(), input.wait_total_ns);
    assert_eq!(input.total_blocks, 2);
    drop(second);
}

#[tokio::test]
async fn a_wait_dropped_by_its_deadline_is_counted_cancelled() {
    let (device, stats, res) = stack(MIB);
    let s = device.stream(0).unwrap();
    let held = res
        .allocate_buffer::<u8>(MIB, s, AllocTag("held"))
        .await
        .unwrap();
    let late = tokio::time::timeout(
        Duration::from_millis(10),
        res.allocate_buffer::<u8>(MIB, s, AllocTag("late")),
    )
    .await;
    assert!(late.is_err(), "served past a full budget");
    let q = res.queue_stats();
    assert_eq!((q.waiting, q.served, q.failed, q.cancelled), (0, 0, 0, 1));
    let snap = stats.snapshot();
    let late = snap.tag(AllocTag("late")).unwrap();
    assert_eq!(
        (late.cancelled_waits, late.failed_allocations, late.waited),
        (1, 0, 0)
    );
    drop(held);
}

#[tokio::test]
async fn a_refusal_that_is_not_waited_is_still_a_failure() {
    let (device, stats, res) = stack(MIB);
    let s = device.stream(0).unwrap();
    let held = res.try_allocate(MIB, s, AllocTag("a")).unwrap();
    // `try_allocate` does not wait: its refusal is a failure.
    assert!(matches!(
        res.inner().allocate(MIB, s, AllocTag("b")),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    let snap = stats.snapshot();
    assert_eq!(snap.tag(AllocTag("b")).unwrap().failed_allocations, 1);
    assert_eq!(snap.tag(AllocTag("b")).unwrap().refused_tries, 0);
    drop(res.deallocate(held).unwrap());
}

#[tokio::test]
async fn tags_name_requests_and_stats_group_by_kind() {
    let (device, stats, res) = stack(8 * MIB);
    let s = device.stream(0).unwrap();
    let a = res
        .allocate_buffer::<u8>(MIB, s, Tag::for_request("input", "req-1"))
        .await
        .unwrap();
    let b = res
        .allocate_buffer::<u8>(MIB, s, Tag::for_request("input", String::from("req-2")))
        .await
        .unwrap();
    let tag = Tag::new("output").with_request("req-1");
    let r = res.reserve(&[MIB, MIB], s, &tag).await.unwrap();
    assert_eq!(r.tag(), &tag);
    assert_eq!(r.tag().request(), Some("req-1"));
    let snap = stats.snapshot();
    assert_eq!(snap.per_tag.len(), 2, "{snap}");
    assert_eq!(snap.tag(AllocTag("input")).unwrap().current_blocks, 2);
    assert_eq!(snap.tag(AllocTag("output")).unwrap().current_bytes, 2 * MIB);
    drop((a, b, r));
}

/// A reservation refused part way gives back what its try took, and that
/// is no news to the queue (its head is the reservation itself): it waits
/// for memory others give back instead of trying again at once, forever
/// (it used to spin, a worker busy and the stack churned, until others
/// freed). On a device of 2 MiB that runs nothing until stepped, the
/// only memory that comes back is what the try itself gave back (reusable
/// at once on its stream), so a reservation that waits tries a bounded
/// number of times however often its task could run; one that spins
/// tries on every turn.
#[tokio::test]
async fn a_reservation_refused_part_way_waits_instead_of_spinning() {
    let gpu = SimGpu::builder().manual().capacity(2 * MIB).build();
    let device = Device::sim(&gpu, 1);
    let stats = Stats::new();
    let layers = ResourceBuilder::new().tracing().stats_with(&stats);
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let held = res
        .allocate_buffer::<u8>(MIB, s, AllocTag("held"))
        .await
        .unwrap();
    let reservation = tokio::spawn({
        let res = res.clone();
        async move { res.reserve(&[MIB, MIB], s, AllocTag("r")).await }
    });
    // A current-thread runtime: each yield lets the reservation's task run
    // if anything woke it.
    let since = std::time::Instant::now();
    for _ in 0..1_000 {
        tokio::task::yield_now().await;
    }
    assert_eq!(res.waiting_allocations(), 1);
    let tries = stats.snapshot().tag(AllocTag("r")).unwrap().refused_tries;
    // Its queue's watchdog retries the head once a period (memory freed
    // where nothing reports it): on a loaded machine the yields may span
    // some. Memory returned to other devices and budgets (other tests of
    // this binary) no longer wakes it (`wake_scope.rs`).
    let watchdog = (since.elapsed().as_millis() / FALLBACK_PERIOD.as_millis()) as u64;
    assert!(
        tries <= 2 + watchdog,
        "{tries} refused tries with no memory coming back: the reservation spins"
    );
    drop(held);
    let r = tokio::time::timeout(HANG, async {
        loop {
            gpu.run_until_idle();
            if reservation.is_finished() {
                break reservation.await;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the reservation was never served")
    .unwrap()
    .unwrap();
    assert_eq!(r.bytes_left(), 2 * MIB);
}
