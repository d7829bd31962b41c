//! Several devices in one host: a resource per device, the registry, and
//! cross-device ordering on the simulated host.

use std::sync::Arc;

use streamalloc::DeviceRegistry;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, SimResource, StreamId};

fn host(devices: u32) -> (Vec<Arc<SimGpu>>, DeviceRegistry<SimResource>) {
    let gpus = SimGpu::builder().manual().build_host(devices);
    let registry = DeviceRegistry::new();
    for gpu in &gpus {
        let resource = Arc::new(SimResource::new(&Device::simulated(gpu, 2)));
        assert!(registry.set(gpu.ordinal(), resource).unwrap().is_none());
    }
    (gpus, registry)
}

#[test]
fn registry_set_get_reset() {
    let (_gpus, registry) = host(2);
    assert_eq!(registry.devices(), vec![0, 1]);
    let r1 = registry.get(1).unwrap();
    assert_eq!(r1.device_ordinal(), 1);

    // A resource of device 1 cannot be registered for device 0.
    let err = registry.set(0, r1.clone()).unwrap_err();
    assert_eq!(
        err,
        ResourceError::WrongDevice {
            expected: 0,
            found: 1
        }
    );
    assert_eq!(registry.get(0).unwrap().device_ordinal(), 0, "unchanged");

    assert!(registry.reset(1).is_some());
    assert_eq!(registry.devices(), vec![0]);
    assert!(matches!(
        registry.get(1),
        Err(ResourceError::DeviceUnavailable { device: 1, .. })
    ));
    assert!(registry.reset(1).is_none());
}

#[test]
fn a_resource_refuses_streams_and_blocks_of_another_device() {
    let (_gpus, registry) = host(2);
    let (r0, r1) = (registry.get(0).unwrap(), registry.get(1).unwrap());
    let s0 = r0.stream_pool().id(0).unwrap();
    let s1 = r1.stream_pool().id(0).unwrap();
    let kept = r0.allocate(1024, s0, AllocTag::UNTAGGED).unwrap();
    let before = (r0.live_bytes(), r0.live_blocks(), r0.bytes_outstanding());

    assert_eq!(
        r0.allocate(1024, s1, AllocTag::UNTAGGED).unwrap_err(),
        ResourceError::WrongDevice {
            expected: 0,
            found: 1
        }
    );
    let foreign = r1.allocate(2048, s1, AllocTag::UNTAGGED).unwrap();
    assert_eq!(
        r0.deallocate(foreign.clone()).unwrap_err(),
        ResourceError::WrongDevice {
            expected: 0,
            found: 1
        }
    );
    assert_eq!(
        r0.prepare_block_use(kept.id(), s1, streamalloc::Access::Read)
            .unwrap_err(),
        ResourceError::WrongDevice {
            expected: 0,
            found: 1
        }
    );
    assert_eq!(
        r0.allocate(64, StreamId::new(7, 0), AllocTag::UNTAGGED)
            .unwrap_err(),
        ResourceError::WrongDevice {
            expected: 0,
            found: 7
        }
    );
    assert_eq!(
        before,
        (r0.live_bytes(), r0.live_blocks(), r0.bytes_outstanding()),
        "nothing changed on device 0"
    );
    // The foreign block is still good on its own device.
    r1.deallocate(foreign).unwrap();
    r0.deallocate(kept).unwrap();
    r0.reap_pending().unwrap();
    r1.reap_pending().unwrap();
    assert_eq!(registry.bytes_outstanding(), 0);
}

/// Device 0 writes a block; device 1 copies it out; device 0 frees it. The
/// streams are ordered across devices with events, as CUDA allows.
fn cross_device_copy(ordered: bool) -> usize {
    let (gpus, registry) = host(2);
    let (g0, g1) = (&gpus[0], &gpus[1]);
    let (r0, r1) = (registry.get(0).unwrap(), registry.get(1).unwrap());
    let s0 = r0.stream_pool().id(0).unwrap();
    let s1 = r1.stream_pool().id(0).unwrap();
    let (raw0, raw1) = (
        r0.stream_pool().raw(s0).unwrap(),
        r1.stream_pool().raw(s1).unwrap(),
    );
    let src = r0.allocate(1 << 20, s0, AllocTag::UNTAGGED).unwrap();
    let dst = r1.allocate(1 << 20, s1, AllocTag::UNTAGGED).unwrap();
    g0.launch_kernel(raw0, &[MemAccess::write(&src)]).unwrap();
    if ordered {
        let written = g0.event_create().unwrap();
        g0.event_record(written, raw0).unwrap();
        g1.stream_wait_event(raw1, written).unwrap();
    }
    g1.copy_async(dst.ptr(), src.ptr(), 1 << 20, raw1).unwrap();
    if ordered {
        let copied = g1.event_create().unwrap();
        g1.event_record(copied, raw1).unwrap();
        g0.stream_wait_event(raw0, copied).unwrap();
    }
    r0.deallocate(src).unwrap();
    r1.deallocate(dst).unwrap();
    g0.run_until_idle();
    r0.reap_pending().unwrap();
    r1.reap_pending().unwrap();
    assert_eq!(registry.bytes_outstanding(), 0);
    g0.races().len()
}

#[test]
fn cross_device_copy_ordered_by_events_is_race_free() {
    assert_eq!(cross_device_copy(true), 0);
}

#[test]
fn cross_device_copy_without_events_is_reported() {
    // The copy's read races with the write, and the free with the read.
    assert_eq!(cross_device_copy(false), 2);
}

#[test]
fn addresses_of_two_devices_never_overlap() {
    let (_gpus, registry) = host(2);
    let (r0, r1) = (registry.get(0).unwrap(), registry.get(1).unwrap());
    let a = r0
        .allocate(1 << 20, r0.stream_pool().id(0).unwrap(), AllocTag::UNTAGGED)
        .unwrap();
    let b = r1
        .allocate(1 << 20, r1.stream_pool().id(0).unwrap(), AllocTag::UNTAGGED)
        .unwrap();
    assert!(a.ptr() + (1 << 20) <= b.ptr() || b.ptr() + (1 << 20) <= a.ptr());
    r0.deallocate(a).unwrap();
    r1.deallocate(b).unwrap();
}

#[test]
fn threads_on_two_devices_through_the_registry() {
    let gpus = SimGpu::builder().build_host(2);
    let registry = Arc::new(DeviceRegistry::<SimResource>::new());
    let mut streams = Vec::new();
    for gpu in &gpus {
        let device = Device::simulated(gpu, 4);
        streams.extend(device.streams().ids());
        registry
            .set(gpu.ordinal(), Arc::new(SimResource::new(&device)))
            .unwrap();
    }
    let handles: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                for i in 0..200usize {
                    let block = registry
                        .allocate(256 + i * 64, stream, AllocTag::UNTAGGED)
                        .unwrap();
                    assert_eq!(block.device(), stream.device());
                    registry.deallocate(block).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    for d in registry.devices() {
        let r = registry.get(d).unwrap();
        r.reap_pending().unwrap();
        assert_eq!(r.live_bytes(), 0);
        assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
    }
    assert_eq!(registry.bytes_outstanding(), 0);
    assert!(gpus[0].races().is_empty());
}

/// One budget across the resources of two devices: threads racing on both
/// never push the total past the limit, and the limit is really contended.
#[test]
fn one_budget_across_two_devices_with_racing_threads() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use streamalloc::{Budget, BudgetResource};

    // Small enough that even one thread alone reaches it (4 held blocks plus
    // up to 3 unreaped frees), so refusals do not depend on scheduling.
    const LIMIT: usize = 16 << 10;
    let budget = Budget::new(LIMIT);
    let registry = Arc::new(DeviceRegistry::<BudgetResource<SimResource>>::new());
    let mut streams = Vec::new();
    for gpu in SimGpu::builder().build_host(2) {
        let device = Device::simulated(&gpu, 8);
        streams.extend(device.streams().ids());
        let resource = BudgetResource::new(SimResource::new(&device), &budget);
        registry.set(gpu.ordinal(), Arc::new(resource)).unwrap();
    }
    let refused = Arc::new(AtomicUsize::new(0));
    let peak_seen = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = streams
        .into_iter()
        .map(|stream| {
            let (registry, budget) = (registry.clone(), budget.clone());
            let (refused, peak_seen) = (refused.clone(), peak_seen.clone());
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..300usize {
                    match registry.allocate(1024 + (i % 5) * 512, stream, AllocTag::UNTAGGED) {
                        Ok(b) => {
                            peak_seen.fetch_max(budget.in_use(), Ordering::AcqRel);
                            held.push(b);
                        }
                        Err(ResourceError::BudgetExceeded { limit, .. }) => {
                            assert_eq!(limit, LIMIT);
                            refused.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(e) => panic!("{e}"),
                    }
                    if held.len() > 3 {
                        registry.deallocate(held.remove(0)).unwrap();
                    }
                    if i % 4 == 0 {
                        registry
                            .get(stream.device())
                            .unwrap()
                            .reap_pending()
                            .unwrap();
                    }
                }
                for b in held {
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
    assert!(
        budget.peak() <= LIMIT,
        "peak {} over {LIMIT}",
        budget.peak()
    );
    assert!(peak_seen.load(Ordering::Acquire) <= LIMIT);
    assert!(
        refused.load(Ordering::Acquire) > 0,
        "the limit was never reached"
    );
    assert_eq!(budget.in_use(), 0);
    assert_eq!(registry.bytes_outstanding(), 0);
}
