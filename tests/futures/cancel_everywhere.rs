//! Every future a service awaits, cancelled mid-way: polled once (it
//! returned `Pending`, its work queued on a device that has not run it),
//! then dropped on the polling thread or on another thread, as a cancelled
//! handler's task may be. Each test then checks what the future's
//! `# Cancel safety` promises (the operation done entirely or not at all,
//! and which), that the race detector saw nothing, that a later call
//! works, and that a final shutdown leaves 0 B outstanding.

use crate::support;

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AllocTag, AsyncResource, Budget, CacheConfig, Device, ResourceBuilder};
use streamalloc::{Backend, CachingResource, DeviceBlock, StreamOrderedResource};
use streamalloc::{DeviceMemoryResource, DriverCall, ResourceError, Stats};
use streamalloc::{HostPool, HostPoolConfig, SleepMode, SleepPlan};
use support::{CountingWaker, drive, poll_once};

const MIB: usize = 1 << 20;
const WEIGHTS: AllocTag = AllocTag("weights");
const TAG: AllocTag = AllocTag("cancel");
/// 1024 f32: one page, the host pool's smallest class.
const LEN: usize = 1024;

/// Where a future polled once is dropped.
#[derive(Debug, Clone, Copy)]
enum DropOn {
    /// The thread that polled it.
    PollingThread,
    /// Another thread, while the polling thread waits.
    AnotherThread,
}

impl DropOn {
    const BOTH: [DropOn; 2] = [DropOn::PollingThread, DropOn::AnotherThread];

    fn drop<F: Send>(self, future: F) {
        match self {
            DropOn::PollingThread => drop(future),
            DropOn::AnotherThread => std::thread::scope(|s| {
                s.spawn(move || drop(future)).join().unwrap();
            }),
        }
    }
}

/// Polls `future` once: it must wait (its work is queued, not run).
fn poll_pending<F: Future + Unpin>(future: &mut F) {
    let (_count, waker) = CountingWaker::new();
    assert!(
        poll_once(future, &waker).is_pending(),
        "the first poll finished: nothing to cancel mid-way"
    );
}

/// A manual simulated device (it runs only when the test says), 64 GiB.
fn manual_gpu() -> Arc<SimGpu> {
    SimGpu::builder().manual().capacity(64 << 30).build()
}

/// Drives a final shutdown of `res` to its end and checks it leaves nothing
/// outstanding, and that the device saw no race.
fn shut_down_to_zero<R: DeviceMemoryResource + ?Sized + 'static>(
    gpu: &SimGpu,
    res: &AsyncResource<R>,
) {
    let report = drive(gpu, &mut Box::pin(res.shutdown())).unwrap();
    assert_eq!(report.bytes_outstanding, 0, "{report:?}");
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

// ---- sleep and wake ----

/// A cached stack on a manual device, with 8 MiB of weights written by a
/// kernel the device has not run yet.
fn weights_on_a_cache() -> (Arc<SimGpu>, Device, AsyncResource<Cached>, DeviceBlock) {
    let gpu = manual_gpu();
    let device = Device::sim(&gpu, 1);
    let layers = ResourceBuilder::new().cache(CacheConfig::default());
    let res = AsyncResource::build(&device, &layers).unwrap();
    let s = device.stream(0).unwrap();
    let weights = res.try_allocate(8 * MIB, s, WEIGHTS).unwrap();
    let raw = device.streams().raw(s).unwrap();
    gpu.launch_kernel(raw, &[MemAccess::write(&weights)])
        .unwrap();
    (gpu, device, res, weights)
}

/// The stack `ResourceBuilder::new().cache(..)` builds on a device.
type Cached = CachingResource<StreamOrderedResource<Backend>>;

fn offload_weights() -> SleepPlan {
    SleepPlan::new().tag(WEIGHTS, SleepMode::Offload)
}

/// `sleep` promises, dropped after its first poll: the sleep is in effect,
/// its memory not given back yet (done in full by a later
/// `settle_sleep` once the host saw the GPU done), and `wake` ends it.
#[test]
fn a_sleep_dropped_mid_way_is_in_effect_and_a_later_settle_and_wake_finish_it() {
    for drop_on in DropOn::BOTH {
        let (gpu, device, res, weights) = weights_on_a_cache();
        let s = device.stream(0).unwrap();
        let mapped = res.inner().physical_bytes();
        let plan = offload_weights();
        let mut sleep = Box::pin(res.sleep(&plan));
        poll_pending(&mut sleep);
        drop_on.drop(sleep);

        assert!(
            res.inner().is_asleep(),
            "{drop_on:?}: the sleep is in effect"
        );
        assert_eq!(
            res.inner().physical_bytes(),
            mapped,
            "{drop_on:?}: nothing unmapped before the host saw the GPU done"
        );
        assert!(
            !res.inner().settle_sleep().unwrap(),
            "{drop_on:?}: the sleep's work has not run: nothing to give back yet"
        );
        // A use while asleep is refused, and changes nothing.
        assert!(matches!(
            res.inner()
                .prepare_block_use(weights.id(), s, streamalloc::Access::Read),
            Err(ResourceError::BlockAsleep { .. })
        ));

        gpu.run_until_idle();
        assert!(res.inner().settle_sleep().unwrap(), "{drop_on:?}");
        assert!(
            res.inner().physical_bytes() + 8 * MIB <= mapped,
            "{drop_on:?}: the weights' pages went back"
        );
        drive(&gpu, &mut Box::pin(res.wake())).unwrap();
        assert!(!res.inner().is_asleep());
        assert!(res.inner().physical_bytes() >= mapped);
        // The weights are usable again, after their restore.
        let raw = device.streams().raw(s).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::read(&weights)])
            .unwrap();
        drop(res.deallocate(weights).unwrap());
        shut_down_to_zero(&gpu, &res);
        assert_eq!(
            gpu.host_bytes(),
            0,
            "{drop_on:?}: the offload's pinned memory went back"
        );
    }
}

/// A sleep dropped mid-way, then woken at once, before the device ran the
/// sleep's work: the wake orders the restore after it.
#[test]
fn a_sleep_dropped_mid_way_is_ended_by_a_wake_before_the_device_ran_it() {
    for drop_on in DropOn::BOTH {
        let (gpu, device, res, weights) = weights_on_a_cache();
        let s = device.stream(0).unwrap();
        let plan = offload_weights();
        let mut sleep = Box::pin(res.sleep(&plan));
        poll_pending(&mut sleep);
        drop_on.drop(sleep);

        drive(&gpu, &mut Box::pin(res.wake())).unwrap();
        assert!(!res.inner().is_asleep(), "{drop_on:?}");
        let raw = device.streams().raw(s).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::write(&weights)])
            .unwrap();
        // A later sleep and wake work in full.
        drive(&gpu, &mut Box::pin(res.sleep(&plan))).unwrap();
        assert!(res.inner().is_asleep());
        drive(&gpu, &mut Box::pin(res.wake())).unwrap();
        drop(res.deallocate(weights).unwrap());
        shut_down_to_zero(&gpu, &res);
        assert_eq!(gpu.host_bytes(), 0, "{drop_on:?}");
    }
}

/// `wake` promises, dropped after its first poll: nothing lost, the
/// blocks are awake and ordered after their restores (done in full); the
/// offload's pinned memory goes back at a later settle, once the host saw
/// the copies back done.
#[test]
fn a_wake_dropped_mid_way_is_done_and_a_later_settle_frees_its_host_memory() {
    for drop_on in DropOn::BOTH {
        let (gpu, device, res, weights) = weights_on_a_cache();
        let s = device.stream(0).unwrap();
        let plan = offload_weights();
        drive(&gpu, &mut Box::pin(res.sleep(&plan))).unwrap();
        assert!(gpu.host_bytes() >= 8 * MIB, "the offload pinned memory");

        let mut wake = Box::pin(res.wake());
        poll_pending(&mut wake);
        drop_on.drop(wake);

        assert!(!res.inner().is_asleep(), "{drop_on:?}: awake");
        // A use on the block's stream follows its restore: no race.
        let raw = device.streams().raw(s).unwrap();
        gpu.launch_kernel(raw, &[MemAccess::write(&weights)])
            .unwrap();
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{drop_on:?}: {:#?}", gpu.races());
        res.inner().settle_sleep().unwrap();
        assert_eq!(
            gpu.host_bytes(),
            0,
            "{drop_on:?}: the restores were seen done: the pinned memory went back"
        );
        // A later cycle works.
        drive(&gpu, &mut Box::pin(res.sleep(&plan))).unwrap();
        drive(&gpu, &mut Box::pin(res.wake())).unwrap();
        drop(res.deallocate(weights).unwrap());
        shut_down_to_zero(&gpu, &res);
    }
}

// ---- shutdown ----

/// A stack with statistics, a cache and a budget; a buffer freed (its free
/// queued, not run) and one still held.
fn service<R: DeviceMemoryResource + ?Sized + 'static>(
    make: impl FnOnce(&Device, &Budget, &Stats) -> AsyncResource<R>,
) -> (
    Arc<SimGpu>,
    Device,
    Budget,
    AsyncResource<R>,
    streamalloc::Buffer<f32>,
) {
    let gpu = manual_gpu();
    let device = Device::sim(&gpu, 2);
    let budget = Budget::new(64 * MIB);
    let stats = Stats::new();
    let res = make(&device, &budget, &stats);
    let s = device.stream(0).unwrap();
    let freed = res.try_allocate_buffer::<f32>(MIB, s, TAG).unwrap();
    let held = res.try_allocate_buffer::<f32>(MIB, s, TAG).unwrap();
    drop(freed);
    (gpu, device, budget, res, held)
}

/// `shutdown` promises, dropped after its first poll (waiting for the
/// pending frees): the resource is closed (done), the frees and releases
/// done so far stay done, nothing else changes; buffers held still free,
/// and a later shutdown finishes the drain to 0 B.
fn a_shutdown_dropped_mid_way<R: DeviceMemoryResource + ?Sized + 'static>(
    drop_on: DropOn,
    make: impl FnOnce(&Device, &Budget, &Stats) -> AsyncResource<R>,
) {
    let (gpu, device, budget, res, held) = service(make);
    let s = device.stream(0).unwrap();
    let mut shutdown = Box::pin(res.shutdown());
    poll_pending(&mut shutdown);
    drop_on.drop(shutdown);

    assert!(
        matches!(res.try_allocate(MIB, s, TAG), Err(ResourceError::Closed)),
        "{drop_on:?}: the resource stays closed"
    );
    assert!(matches!(
        drive(&gpu, &mut res.allocate(MIB, s, TAG)),
        Err(ResourceError::Closed)
    ));
    assert_eq!(res.waiting_allocations(), 0);
    // What was served still works, and frees.
    let raw = device.streams().raw(s).unwrap();
    gpu.launch_kernel(raw, &[MemAccess::write(held.block())])
        .unwrap();
    drop(held);
    let report = drive(&gpu, &mut Box::pin(res.shutdown())).unwrap();
    assert_eq!(report.bytes_outstanding, 0, "{drop_on:?}: {report:?}");
    assert_eq!(report.budget_in_use, Some(0), "{drop_on:?}: {report:?}");
    assert_eq!(budget.in_use(), 0);
    let stats = report.stats.unwrap();
    assert_eq!(stats.overall.current_bytes, 0, "{drop_on:?}");
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{drop_on:?}: {:#?}", gpu.races());
    // And a third shutdown, of a drained resource, is ready at once.
    let report = drive(&gpu, &mut Box::pin(res.shutdown())).unwrap();
    assert_eq!(report.bytes_outstanding, 0);
}

#[test]
fn a_shutdown_of_the_typed_handle_dropped_mid_way_leaves_it_closed_and_a_later_one_finishes() {
    for drop_on in DropOn::BOTH {
        a_shutdown_dropped_mid_way(drop_on, |device, budget, stats| {
            let layers = ResourceBuilder::new()
                .stats_with(stats)
                .cache(CacheConfig::default())
                .budget(budget);
            AsyncResource::build(device, &layers).unwrap()
        });
    }
}

#[test]
fn a_shutdown_of_the_type_erased_handle_dropped_mid_way_leaves_it_closed_and_a_later_one_finishes()
{
    for drop_on in DropOn::BOTH {
        a_shutdown_dropped_mid_way(drop_on, |device, budget, stats| {
            let layers = ResourceBuilder::new()
                .stats_with(stats)
                .cache(CacheConfig::default())
                .retry_on_oom()
                .budget(budget);
            AsyncResource::build(device, &layers).unwrap().into_any()
        });
    }
}

// ---- copies through pinned host memory ----

/// A copy future promises, dropped after its first poll: it cancels
/// nothing (the copy runs: done in full) and proves nothing (the host
/// buffer stays busy until a notification or `ready` shows the copy
/// done); then the buffer reads and writes again, a later copy works, and
/// the block goes back to its pool.
fn a_copy_dropped_mid_way(drop_on: DropOn, to_device: bool) {
    let gpu = manual_gpu();
    let device = Device::sim(&gpu, 1);
    let res = AsyncResource::build(&device, &ResourceBuilder::new()).unwrap();
    let host = HostPool::new(&device, HostPoolConfig::new());
    let s = device.stream(0).unwrap();
    let mut dev = res.try_allocate_buffer::<f32>(LEN, s, TAG).unwrap();
    let mut buf = host.allocate::<f32>(LEN, TAG).unwrap();
    buf.as_mut_slice().unwrap().fill(1.5);
    let copies = gpu.call_count(DriverCall::MemcpyHostAsync);

    let mut copy = if to_device {
        res.copy_to_device(&buf, &mut dev, s).unwrap()
    } else {
        res.copy_to_host(&dev, &mut buf, s).unwrap()
    };
    poll_pending(&mut copy);
    drop_on.drop(copy);

    assert_eq!(
        gpu.call_count(DriverCall::MemcpyHostAsync),
        copies + 1,
        "{drop_on:?}: the copy stays queued"
    );
    assert_eq!(
        buf.pending_copies(),
        1,
        "{drop_on:?}: the drop proves nothing"
    );
    assert!(matches!(
        buf.as_mut_slice(),
        Err(ResourceError::HostBufferBusy { .. })
    ));
    if !to_device {
        // A copy to the host forbids reading too.
        assert!(buf.as_slice().is_err());
    }
    drive(&gpu, &mut Box::pin(buf.ready())).unwrap();
    assert_eq!(buf.pending_copies(), 0);
    buf.as_mut_slice().unwrap().fill(2.5);

    // A later copy, awaited, works.
    let mut again = res.copy_to_device(&buf, &mut dev, s).unwrap();
    drive(&gpu, &mut again).unwrap();
    assert_eq!(buf.pending_copies(), 0);
    drop((buf, dev));
    let pool = host.stats();
    assert_eq!(
        (pool.pending_bytes, pool.in_use_bytes),
        (0, 0),
        "{drop_on:?}: {pool:?}"
    );
    shut_down_to_zero(&gpu, &res);
}

#[test]
fn a_copy_to_the_device_dropped_mid_way_runs_and_the_buffer_is_busy_until_seen_done() {
    for drop_on in DropOn::BOTH {
        a_copy_dropped_mid_way(drop_on, true);
    }
}

#[test]
fn a_copy_to_the_host_dropped_mid_way_runs_and_the_buffer_is_busy_until_seen_done() {
    for drop_on in DropOn::BOTH {
        a_copy_dropped_mid_way(drop_on, false);
    }
}

// ---- waiting allocations ----

/// The woken head of the queue, cancelled on another thread before it ran:
/// its wake passes to the next waiter, which is served (a lost wake would
/// leave it waiting for the watchdog's period, or for good).
#[test]
fn a_woken_head_dropped_on_another_thread_passes_its_wake_on() {
    let gpu = SimGpu::builder().manual().capacity(MIB).build();
    let device = Device::sim(&gpu, 1);
    let res = AsyncResource::build(&device, &ResourceBuilder::new()).unwrap();
    let s = device.stream(0).unwrap();
    let held = res.try_allocate(MIB, s, TAG).unwrap();
    let mut head = res.allocate(MIB, s, TAG);
    let mut next = res.allocate(MIB, s, TAG);
    let (head_woken, head_waker) = CountingWaker::new();
    let (next_woken, next_waker) = CountingWaker::new();
    assert!(poll_once(&mut head, &head_waker).is_pending());
    assert!(poll_once(&mut next, &next_waker).is_pending());
    let mut freed = res.deallocate(held).unwrap();
    drive(&gpu, &mut freed).unwrap();
    assert!(head_woken.count() >= 1, "the head is woken");
    let before = next_woken.count();

    DropOn::AnotherThread.drop(head);
    assert!(
        next_woken.count() > before,
        "the cancelled head's wake did not move to the next waiter"
    );
    let block = match poll_once(&mut next, &next_waker) {
        Poll::Ready(r) => r.unwrap(),
        Poll::Pending => panic!("woken but not served"),
    };
    assert_eq!(res.waiting_allocations(), 0);
    assert_eq!(res.queue_stats().cancelled, 1);
    drop(res.deallocate(block).unwrap());
    shut_down_to_zero(&gpu, &res);
}
