use crate::support;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{Access, AllocTag, DeviceMemoryResource};

#[test]
fn cross_stream_hooks_silence_the_detector() {
    let f = support::sim(3);
    let gpu = f.sim.clone().unwrap();
    let r = &f.resource;
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(4096, a, AllocTag::UNTAGGED).unwrap();
    let raw = |s| f.pool.raw(s).unwrap();
    gpu.launch_kernel(raw(a), &[MemAccess::write(&block)])
        .unwrap();
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    for s in [b, c] {
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        gpu.launch_kernel(raw(s), &[MemAccess::read(&block)])
            .unwrap();
        r.finish_block_use(block.id(), s, Access::Read).unwrap();
    }
    assert_eq!(r.pending_use_event_count(block.ptr()), Some(3));
    r.deallocate(block).unwrap();
    let next = r.allocate(4096, a, AllocTag::UNTAGGED).unwrap();
    gpu.launch_kernel(raw(a), &[MemAccess::write(&next)])
        .unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    r.deallocate(next).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
    let _ = gpu.mem_info().unwrap();
}

#[test]
fn missing_hooks_are_reported() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    let r = &f.resource;
    let (a, b) = (f.stream(0), f.stream(1));
    let block = r.allocate(4096, a, AllocTag::UNTAGGED).unwrap();
    let raw = |s| f.pool.raw(s).unwrap();
    gpu.launch_kernel(raw(a), &[MemAccess::write(&block)])
        .unwrap();
    gpu.launch_kernel(raw(b), &[MemAccess::read(&block)])
        .unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(gpu.races().len(), 2, "{:?}", gpu.races());
}
