//! Regression tests for bugs found in the simulated device by the
//! reliability work (each failed before its fix).

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;

/// CUDA: a wait queued on an event keeps the record it saw, even if the event
/// is destroyed and another one is created afterwards. The simulator reused
/// the destroyed event's slot with its counters reset, so the queued wait
/// never completed.
#[test]
fn a_queued_wait_survives_destroy_and_slot_reuse() {
    let gpu = SimGpu::builder().manual().build();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let e1 = gpu.event_create().unwrap();
    gpu.event_record(e1, a).unwrap();
    gpu.run_until_idle();
    assert!(gpu.event_query(e1).unwrap());
    gpu.stream_wait_event(b, e1).unwrap();
    gpu.event_destroy(e1).unwrap();
    let e2 = gpu.event_create().unwrap();
    // A never-recorded event is complete, and waiting on it is a no-op.
    assert!(gpu.event_query(e2).unwrap());
    gpu.stream_wait_event(a, e2).unwrap();
    gpu.stream_synchronize(b).unwrap();
    gpu.stream_synchronize(a).unwrap();
    assert!(gpu.is_idle());
    // The new event works as any other.
    gpu.event_record(e2, a).unwrap();
    gpu.stream_wait_event(b, e2).unwrap();
    gpu.run_until_idle();
    assert!(gpu.is_idle());
    assert!(gpu.event_query(e2).unwrap());
}

/// The same through the resource: a resource dropped while its waits are
/// queued, and a second resource on the same device creating events.
#[test]
fn a_dropped_resource_does_not_wedge_the_next_one() {
    use streamalloc::{Access, AllocTag, Device, DeviceMemoryResource, SimResource};
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 2);
    let pool = device.streams();
    let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    {
        let r1 = SimResource::new(&device);
        let block = r1.allocate(256, a, AllocTag::UNTAGGED).unwrap();
        r1.finish_block_use(block.id(), a, Access::Write).unwrap();
        gpu.stream_synchronize(pool.raw(a).unwrap()).unwrap();
        // B's wait on the (already reached) write is queued, not yet run.
        r1.prepare_block_use(block.id(), b, Access::Read).unwrap();
        r1.finish_block_use(block.id(), b, Access::Read).unwrap();
        r1.deallocate(block).unwrap();
    }
    let r2 = SimResource::new(&device);
    let block = r2.allocate(256, b, AllocTag::UNTAGGED).unwrap();
    r2.prepare_block_use(block.id(), a, Access::Write).unwrap();
    r2.finish_block_use(block.id(), a, Access::Write).unwrap();
    r2.deallocate(block).unwrap();
    r2.reap_pending().unwrap();
    assert!(gpu.is_idle());
    assert_eq!(r2.bytes_outstanding(), 0);
}

/// The reuse rules of docs/DESIGN.md ("What the driver's pool does about reuse"),
/// which the simulated address space must follow so that a missing wait the
/// GPU would expose, the simulator exposes too.
mod reuse_rules {
    use streamalloc::gpu::Gpu;
    use streamalloc::gpu::sim::{MemAccess, SimGpu};
    use streamalloc::{AllocTag, DeviceBlock, StreamId};

    fn block(ptr: u64, size: usize) -> DeviceBlock {
        let id = streamalloc::BlockId::new(streamalloc::ResourceId::fresh(), 1);
        DeviceBlock::new(id, ptr, size, StreamId::new(0, 0), AllocTag::UNTAGGED)
    }

    #[test]
    fn same_stream_reuses_at_once() {
        let gpu = SimGpu::builder().manual().build();
        let a = gpu.create_stream();
        let x = gpu.alloc_async(4096, a).unwrap();
        gpu.launch_kernel(a, &[MemAccess::write(&block(x, 4096))])
            .unwrap();
        gpu.free_async(x, a).unwrap();
        assert_eq!(gpu.alloc_async(4096, a).unwrap(), x);
    }

    #[test]
    fn another_stream_does_not_take_a_free_still_queued() {
        let gpu = SimGpu::builder().manual().build();
        let (a, b) = (gpu.create_stream(), gpu.create_stream());
        let x = gpu.alloc_async(4096, a).unwrap();
        gpu.launch_kernel(a, &[MemAccess::write(&block(x, 4096))])
            .unwrap();
        gpu.free_async(x, a).unwrap();
        let y = gpu.alloc_async(4096, b).unwrap();
        assert_ne!(y, x);
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    }

    #[test]
    fn another_stream_takes_an_executed_free() {
        let gpu = SimGpu::builder().manual().build();
        let (a, b) = (gpu.create_stream(), gpu.create_stream());
        let x = gpu.alloc_async(4096, a).unwrap();
        gpu.free_async(x, a).unwrap();
        // The free runs; no host synchronization orders B after it.
        while gpu.step() {}
        assert!(gpu.is_idle());
        assert_eq!(gpu.alloc_async(4096, b).unwrap(), x);
    }

    #[test]
    fn another_stream_ordered_after_the_free_takes_it_while_busy() {
        let gpu = SimGpu::builder().manual().build();
        let (a, b) = (gpu.create_stream(), gpu.create_stream());
        let x = gpu.alloc_async(4096, a).unwrap();
        gpu.launch_kernel(a, &[MemAccess::write(&block(x, 4096))])
            .unwrap();
        gpu.free_async(x, a).unwrap();
        let after_free = gpu.event_create().unwrap();
        gpu.event_record(after_free, a).unwrap();
        gpu.stream_wait_event(b, after_free).unwrap();
        assert!(!gpu.is_idle(), "stream A is still busy");
        let y = gpu.alloc_async(4096, b).unwrap();
        assert_eq!(y, x);
        gpu.launch_kernel(b, &[MemAccess::write(&block(y, 4096))])
            .unwrap();
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    }

    #[test]
    fn zero_bytes_is_address_zero_and_huge_is_out_of_memory() {
        let gpu = SimGpu::builder().manual().capacity(1 << 30).build();
        let a = gpu.create_stream();
        assert_eq!(gpu.alloc_async(0, a).unwrap(), 0);
        gpu.free_async(0, a).unwrap();
        assert!(matches!(
            gpu.alloc_async(1 << 50, a),
            Err(streamalloc::gpu::GpuError::OutOfMemory { available }) if available == 1 << 30
        ));
        // The stream stays usable.
        let x = gpu.alloc_async(256, a).unwrap();
        gpu.free_async(x, a).unwrap();
        gpu.stream_synchronize(a).unwrap();
        assert_eq!(gpu.free_bytes(), 1 << 30);
    }
}

/// The detector reports each kind of bug between two streams on one
/// allocation: an earlier unordered access between streams A and B did hide
/// a later use after free between the same streams (reports were
/// de-duplicated by address and streams alone).
#[test]
fn an_earlier_race_does_not_hide_a_use_after_free() {
    use streamalloc::gpu::sim::{MemAccess, RaceKind};
    use streamalloc::{AllocTag, BlockId, DeviceBlock, ResourceId, StreamId};
    let gpu = SimGpu::builder().manual().build();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let x = gpu.alloc_async(4096, a).unwrap();
    let block = DeviceBlock::new(
        BlockId::new(ResourceId::fresh(), 1),
        x,
        4096,
        StreamId::new(0, 0),
        AllocTag::UNTAGGED,
    );
    // B reads without being ordered after the allocation on A: unordered.
    gpu.launch_kernel(b, &[MemAccess::read(&block)]).unwrap();
    // The free on A is ordered after B's read; then B, ordered after the
    // free, reads again: a use after free.
    let read_done = gpu.event_create().unwrap();
    gpu.event_record(read_done, b).unwrap();
    gpu.stream_wait_event(a, read_done).unwrap();
    gpu.free_async(x, a).unwrap();
    let freed = gpu.event_create().unwrap();
    gpu.event_record(freed, a).unwrap();
    gpu.stream_wait_event(b, freed).unwrap();
    gpu.launch_kernel(b, &[MemAccess::read(&block)]).unwrap();
    let kinds: Vec<RaceKind> = gpu.races().iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [RaceKind::Unordered, RaceKind::UseAfterFree]);
}

/// Dropping a threaded `SimGpu` stops its device thread before returning, so
/// that nothing it held (here, a host function a fault kept from running)
/// outlives it. The thread was detached: Miri reported "the main thread
/// terminated without waiting for all remaining threads".
#[test]
fn dropping_a_threaded_device_stops_its_thread() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Release);
        }
    }

    let gpu = SimGpu::builder()
        .op_latency(Duration::from_millis(20))
        .build();
    let s = gpu.create_stream();
    let dropped = Arc::new(AtomicBool::new(false));
    gpu.launch_kernel(s, &[]).unwrap();
    let guard = SetOnDrop(dropped.clone());
    gpu.launch_host_fn(
        s,
        Box::new(move || {
            let _guard = guard;
        }),
    )
    .unwrap();
    gpu.inject_device_fault();
    drop(gpu);
    assert!(
        dropped.load(Ordering::Acquire),
        "the queued host function outlived the device"
    );
}

/// Issue 18: `SimGpu` had no `destroy_stream`, so every `AsyncResource` built
/// and dropped left its notifier stream behind (5,000 of them made 1,000
/// allocate/free pairs 16 times slower). Destroyed streams are refused, and
/// their slots serve new streams once their queues drained.
#[test]
#[cfg_attr(miri, ignore = "5,000 resources, each with a watchdog thread")]
fn async_resources_built_and_dropped_leave_no_stream_behind() {
    use std::sync::Arc;
    use streamalloc::AsyncResource;
    use streamalloc::SimResource;

    let gpu = SimGpu::builder().manual().build();
    let device = streamalloc::Device::simulated(&gpu, 1);
    let r = Arc::new(SimResource::new(&device));
    let (slots, live) = (gpu.stream_count(), gpu.live_stream_count());
    for _ in 0..5000 {
        drop(AsyncResource::new(r.clone()).unwrap());
    }
    assert_eq!(
        gpu.live_stream_count(),
        live,
        "every notifier stream destroyed"
    );
    assert!(
        // A lane destroyed with a notification still queued keeps its slot
        // until the (manual) device runs it: a few, never thousands.
        gpu.stream_count() <= slots + 8,
        "{} slots: destroyed streams' slots are reused",
        gpu.stream_count()
    );
}

/// A destroyed stream: work queued before still runs; every later call on
/// it is refused as an invalid handle, and so is a second destroy.
#[test]
fn a_destroyed_stream_is_refused_and_its_work_still_runs() {
    use streamalloc::gpu::{GpuError, sim::MemAccess};
    let gpu = SimGpu::builder().manual().build();
    let s = Gpu::create_stream(&*gpu).unwrap();
    let ptr = gpu.alloc_async(4096, s).unwrap();
    gpu.launch_kernel(
        s,
        &[MemAccess {
            ptr,
            access: streamalloc::Access::Write,
        }],
    )
    .unwrap();
    gpu.free_async(ptr, s).unwrap();
    gpu.destroy_stream(s).unwrap();
    let refused = |r: Result<(), GpuError>| {
        assert!(
            matches!(r, Err(GpuError::Driver { code: 400, .. })),
            "{r:?}"
        )
    };
    refused(gpu.destroy_stream(s));
    refused(gpu.alloc_async(64, s).map(drop));
    refused(gpu.launch_kernel(s, &[]));
    refused(gpu.stream_synchronize(s));
    gpu.run_until_idle();
    assert_eq!(gpu.free_bytes(), 16 << 30, "the queued free ran");
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    // The slot serves a new stream, which sees none of the old one's work
    // as its own.
    let t = Gpu::create_stream(&*gpu).unwrap();
    let q = gpu.alloc_async(4096, t).unwrap();
    gpu.launch_kernel(
        t,
        &[MemAccess {
            ptr: q,
            access: streamalloc::Access::Read,
        }],
    )
    .unwrap();
    gpu.free_async(q, t).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
