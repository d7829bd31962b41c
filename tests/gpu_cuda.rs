//! The CUDA path on a real GPU. Run on the GPU machine with
//! `scripts/gpu-run.sh` (these tests are ignored elsewhere).

mod common;

use streamalloc::gpu::Gpu;
use streamalloc::{Access, AllocTag, DeviceMemoryResource, ResourceError};

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_allocate_free_reap() {
    let f = common::cuda(2);
    let r = &f.resource;
    let s = f.stream(0);
    let sizes = [0usize, 4, 1 << 10, 1 << 20, 1 << 30];
    let blocks: Vec<_> = sizes
        .iter()
        .map(|&n| r.allocate(n, s, AllocTag("gpu")).expect("allocation"))
        .collect();
    assert_eq!(r.live_bytes(), sizes.iter().sum::<usize>());
    assert_eq!(blocks[0].ptr(), 0, "zero bytes gets address 0");
    for b in blocks {
        r.deallocate(b).unwrap();
    }
    assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
    println!("cuda: 0 B .. 1 GiB allocations, frees and reap: ok");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_out_of_memory_is_a_value_and_stream_stays_usable() {
    let f = common::cuda(1);
    let r = &f.resource;
    let s = f.stream(0);
    match r.allocate(1 << 50, s, AllocTag::UNTAGGED) {
        Err(ResourceError::OutOfMemory {
            requested,
            available,
            ..
        }) => {
            assert_eq!(requested, 1 << 50);
            println!("cuda: 1 PiB -> OutOfMemory (available {available} B)");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(r.bytes_outstanding(), 0);
    let b = r.allocate(1 << 20, s, AllocTag::UNTAGGED).unwrap();
    r.deallocate(b).unwrap();
    r.reap_pending().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_cross_stream_write_read_read_free() {
    let f = common::cuda(3);
    let r = &f.resource;
    let gpu = r.gpu().clone();
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let raw = |s| f.pool.raw(s).unwrap();
    let n = 8 << 20;
    let block = r.allocate(n, a, AllocTag::UNTAGGED).unwrap();
    let sink_b = r.allocate(n, b, AllocTag::UNTAGGED).unwrap();
    let sink_c = r.allocate(n, c, AllocTag::UNTAGGED).unwrap();
    r.prepare_block_use(block.id(), a, Access::Write).unwrap();
    // SAFETY: a stream of the fixture's pool; `block` is live in `r`.
    unsafe { gpu.memset_async(block.ptr(), 7, n, raw(a)) }.unwrap();
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    for (s, sink) in [(b, &sink_b), (c, &sink_c)] {
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        // SAFETY: a stream of the fixture's pool; both blocks live in `r`.
        unsafe { gpu.copy_async(sink.ptr(), block.ptr(), n, raw(s)) }.unwrap();
        r.finish_block_use(block.id(), s, Access::Read).unwrap();
    }
    assert_eq!(r.pending_use_event_count(block.ptr()), Some(3));
    r.deallocate(block).unwrap();
    r.deallocate(sink_b).unwrap();
    r.deallocate(sink_c).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
    assert!(r.pooled_events() >= 3, "events went back to the pool");
    println!(
        "cuda: write on A, read on B and C, free on A: ok ({} pooled events)",
        r.pooled_events()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_host_function_runs() {
    let f = common::cuda(1);
    let gpu = f.resource.gpu().clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // SAFETY: a stream of the fixture's pool, which it holds.
    unsafe {
        gpu.launch_host_fn(
            f.pool.raw(f.stream(0)).unwrap(),
            Box::new(move || tx.send(42).unwrap()),
        )
    }
    .unwrap();
    assert_eq!(rx.recv_timeout(std::time::Duration::from_secs(10)), Ok(42));
    println!("cuda: host function ran");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_registry_over_every_device_present() {
    use std::sync::Arc;
    use streamalloc::DeviceRegistry;
    use streamalloc::{AsyncCudaResource, Device, StreamId};

    let count = Device::cuda_count();
    assert!(count > 0, "a CUDA device");
    let registry = Arc::new(DeviceRegistry::<AsyncCudaResource>::new());
    // Each device's streams: a `StreamId` resolves only in the pool that
    // made it.
    let mut streams = Vec::new();
    for d in 0..count {
        let device = Device::open_cuda(d, 2).unwrap();
        registry
            .set(d, Arc::new(AsyncCudaResource::new(&device)))
            .unwrap();
        streams.extend(device.streams().ids());
    }
    // A device that does not exist, and a stream of it, are refused.
    assert!(matches!(
        Device::cuda(count, 1),
        Err(ResourceError::DeviceUnavailable { .. })
    ));
    let r0 = registry.get(0).unwrap();
    let nowhere = StreamId::new(count, 0);
    assert_eq!(
        r0.allocate(64, nowhere, AllocTag::UNTAGGED).unwrap_err(),
        ResourceError::WrongDevice {
            expected: 0,
            found: count
        }
    );
    assert_eq!(r0.bytes_outstanding(), 0);
    let threads: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                for i in 0..500usize {
                    let b = registry
                        .allocate(4096 + i, stream, AllocTag::UNTAGGED)
                        .unwrap();
                    registry.deallocate(b).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for d in registry.devices() {
        registry.get(d).unwrap().reap_pending().unwrap();
    }
    assert_eq!(registry.bytes_outstanding(), 0);
    println!(
        "cuda: registry over {count} device(s): wrong ordinal refused, threads on every device ok"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_memory_held_is_the_pools_reservation() {
    let f = common::cuda(1);
    let (r, gpu, s) = (&f.resource, f.resource.gpu(), f.stream(0));
    let before = gpu.memory_held().expect("pool attributes");
    assert_eq!(before.current, 0, "a fresh pool holds nothing");
    let block = r.allocate(64 << 20, s, AllocTag("held")).unwrap();
    let held = gpu.memory_held().unwrap();
    assert!(held.current >= 64 << 20, "{held:?}");
    assert!(held.high >= held.current, "{held:?}");
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    // The release threshold is raised: the pool keeps what it reserved.
    let kept = gpu.memory_held().unwrap();
    assert_eq!(kept.current, held.current, "{kept:?}");
    gpu.reset_memory_held_high().unwrap();
    assert_eq!(gpu.memory_held().unwrap().high, kept.current);
    println!("cuda: memory_held {held:?}, after free {kept:?}: ok");
}
