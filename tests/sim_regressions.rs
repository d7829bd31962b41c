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
    use streamalloc::{Access, AllocTag, DeviceMemoryResource, SimResource};
    let gpu = SimGpu::builder().manual().build();
    let pool = gpu.stream_pool(2);
    let (a, b) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    {
        let r1 = SimResource::new(gpu.clone(), pool.clone());
        let block = r1.allocate(256, a, AllocTag::UNTAGGED).unwrap();
        r1.finish_block_use(block.id(), a, Access::Write).unwrap();
        gpu.stream_synchronize(pool.raw(a).unwrap()).unwrap();
        // B's wait on the (already reached) write is queued, not yet run.
        r1.prepare_block_use(block.id(), b, Access::Read).unwrap();
        r1.finish_block_use(block.id(), b, Access::Read).unwrap();
        r1.deallocate(block).unwrap();
    }
    let r2 = SimResource::new(gpu.clone(), pool.clone());
    let block = r2.allocate(256, b, AllocTag::UNTAGGED).unwrap();
    r2.prepare_block_use(block.id(), a, Access::Write).unwrap();
    r2.finish_block_use(block.id(), a, Access::Write).unwrap();
    r2.deallocate(block).unwrap();
    r2.reap_pending().unwrap();
    assert!(gpu.is_idle());
    assert_eq!(r2.bytes_outstanding(), 0);
}
