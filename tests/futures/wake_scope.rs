//! Memory coming back wakes the waiters that can use it, and no others:
//! memory of another device, or bytes of another budget, leave a waiter
//! asleep (it used to be woken by every return anywhere in the process, so
//! services, and tests run in parallel, woke each other's waiters and
//! counted tries nobody made). Memory of its own device, or of a budget
//! its stack charges on another device, wakes it (`nonblocking.rs`).

use crate::support;

use std::time::Instant;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, AsyncResource, Budget, Device, FALLBACK_PERIOD, ResourceBuilder};
use streamalloc::{CacheConfig, SleepMode, SleepPlan};
use support::{CountingWaker, drive, poll_once};

const MIB: usize = 1 << 20;
const TAG: AllocTag = AllocTag("wake-scope");
/// Returns of memory elsewhere, each of which used to wake the waiter.
const ROUNDS: usize = 100;

/// The wake-ups a waiter may get from its own watchdog since `since`: a
/// queue with waiters retries its head once a [`FALLBACK_PERIOD`] (memory
/// freed where nothing reports it), plus one for a period begun before.
fn watchdog_wakes_since(since: Instant) -> usize {
    (since.elapsed().as_millis() / FALLBACK_PERIOD.as_millis()) as usize + 1
}

#[test]
fn memory_returned_on_another_device_leaves_this_devices_waiter_asleep() {
    let gpu = SimGpu::builder().manual().capacity(MIB).build();
    let device = Device::sim(&gpu, 1);
    let res = AsyncResource::build(&device, &ResourceBuilder::new()).unwrap();
    let s = device.stream(0).unwrap();
    let held = res.try_allocate(MIB, s, TAG).unwrap();
    let mut waiting = res.allocate(MIB, s, TAG);
    let (woken, waker) = CountingWaker::new();
    assert!(poll_once(&mut waiting, &waker).is_pending());

    // Another simulated device in the same process gives memory back,
    // again and again.
    let other_gpu = SimGpu::builder().manual().build();
    let other_device = Device::sim(&other_gpu, 1);
    let other = AsyncResource::build(&other_device, &ResourceBuilder::new()).unwrap();
    let t = other_device.stream(0).unwrap();
    let since = Instant::now();
    let before = woken.count();
    for _ in 0..ROUNDS {
        let block = other.try_allocate(MIB, t, TAG).unwrap();
        let mut freed = other.deallocate(block).unwrap();
        drive(&other_gpu, &mut freed).unwrap();
        assert_eq!(other.bytes_outstanding(), 0, "the free was applied");
    }
    let wakes = woken.count() - before;
    let allowed = watchdog_wakes_since(since);
    assert!(
        wakes <= allowed,
        "{wakes} wake-ups from {ROUNDS} returns of another device's memory \
         (its own watchdog accounts for {allowed})"
    );

    // Its own device's memory serves it.
    let mut freed = res.deallocate(held).unwrap();
    drive(&gpu, &mut freed).unwrap();
    let block = drive(&gpu, &mut waiting).unwrap();
    let mut freed = res.deallocate(block).unwrap();
    drive(&gpu, &mut freed).unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_release_of_another_budget_leaves_a_waiter_under_this_one_asleep() {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::sim(&gpu, 1);
    let budget = Budget::new(MIB);
    let res = AsyncResource::build(&device, &ResourceBuilder::new().budget(&budget)).unwrap();
    let s = device.stream(0).unwrap();
    let held = res.try_allocate(MIB, s, TAG).unwrap();
    let mut waiting = res.allocate(MIB, s, TAG);
    let (woken, waker) = CountingWaker::new();
    assert!(poll_once(&mut waiting, &waker).is_pending());

    // A budget nobody on this stack charges takes and gives back bytes.
    let unrelated = Budget::new(MIB);
    let since = Instant::now();
    let before = woken.count();
    for _ in 0..ROUNDS {
        unrelated.try_reserve(MIB).unwrap().commit();
        unrelated.release(MIB);
    }
    let wakes = woken.count() - before;
    let allowed = watchdog_wakes_since(since);
    assert!(
        wakes <= allowed,
        "{wakes} wake-ups from {ROUNDS} releases of an unrelated budget \
         (its own watchdog accounts for {allowed})"
    );
    assert_eq!(res.waiting_allocations(), 1);

    // Its own budget's bytes serve it.
    let mut freed = res.deallocate(held).unwrap();
    drive(&gpu, &mut freed).unwrap();
    assert_eq!(budget.in_use(), 0);
    let block = drive(&gpu, &mut waiting).unwrap();
    let mut freed = res.deallocate(block).unwrap();
    drive(&gpu, &mut freed).unwrap();
    assert_eq!(budget.in_use(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A sleep gives its pages back to the device: an allocation waiting there
/// in another stack's queue may fit now, and is woken (a sleep's unmaps
/// are no drain of frees, and used to wake nobody: the waiter tried again
/// only at its watchdog's next period).
#[test]
fn a_sleep_wakes_the_waiters_of_other_stacks_on_its_device() {
    const WEIGHTS: AllocTag = AllocTag("weights");
    let gpu = SimGpu::builder().manual().capacity(16 * MIB).build();
    let device = Device::sim(&gpu, 1);
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let sleeper = AsyncResource::build(&device, &layers).unwrap();
    let other = AsyncResource::build(&device, &ResourceBuilder::new()).unwrap();
    let s = device.stream(0).unwrap();
    let weights = sleeper.try_allocate(8 * MIB, s, WEIGHTS).unwrap();
    let mut waiting = other.allocate(12 * MIB, s, TAG);
    let (woken, waker) = CountingWaker::new();
    assert!(poll_once(&mut waiting, &waker).is_pending());

    let plan = SleepPlan::new().tag(WEIGHTS, SleepMode::Discard);
    let before = woken.count();
    drive(&gpu, &mut Box::pin(sleeper.sleep(&plan))).unwrap();
    assert!(
        woken.count() > before,
        "the sleep's pages went back, and nobody was woken"
    );
    let block = match poll_once(&mut waiting, &waker) {
        std::task::Poll::Ready(r) => r.unwrap(),
        std::task::Poll::Pending => panic!("woken but not served"),
    };
    let mut freed = other.deallocate(block).unwrap();
    drive(&gpu, &mut freed).unwrap();
    drive(&gpu, &mut Box::pin(sleeper.wake())).unwrap();
    drop(sleeper.deallocate(weights).unwrap());
    for res in [sleeper.into_any(), other.into_any()] {
        let report = drive(&gpu, &mut Box::pin(res.shutdown())).unwrap();
        assert_eq!(report.bytes_outstanding, 0, "{report:?}");
    }
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
