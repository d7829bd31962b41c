//! `Device`: a backend and its streams held together, opened as CUDA or the
//! simulator behind one type.

use streamalloc::LaunchRecorder;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    AllocTag, AsyncResource, Backend, Device, DeviceMemoryResource, ResourceError,
    StreamOrderedResource,
};
use streamalloc::{DebugGuardResource, GuardConfig, MemsetPoisonFill, PoisonFill};

const T: AllocTag = AllocTag("device");

#[test]
fn a_pool_of_another_device_is_refused() {
    let host = SimGpu::builder().manual().build_host(2);
    let foreign = host[1].stream_pool(1);
    assert_eq!(
        Device::new(host[0].clone(), foreign).err(),
        Some(ResourceError::WrongDevice {
            expected: 0,
            found: 1
        })
    );
}

#[test]
fn a_stream_past_the_pool_is_unknown() {
    let device = Device::sim(&SimGpu::builder().manual().build(), 2);
    assert_eq!(device.stream(1).unwrap().index(), 1);
    assert!(matches!(
        device.stream(2),
        Err(ResourceError::UnknownStream { pool_len: 2, .. })
    ));
}

/// `open` picks the simulator exactly where CUDA cannot be opened, so the
/// same assertion holds with and without a GPU.
#[test]
fn open_is_cuda_where_cuda_opens_and_the_simulator_elsewhere() {
    let cuda = Device::cuda(0, 1);
    let opened = Device::open(0, 1);
    assert_eq!(opened.simulator().is_some(), cuda.is_err(), "{cuda:?}");
    assert_eq!(opened.ordinal(), 0);
    assert_eq!(opened.streams().len(), 1);
    if Device::cuda_count() == 0 {
        assert!(matches!(
            cuda,
            Err(ResourceError::DeviceUnavailable { device: 0, .. })
        ));
    }
}

#[test]
fn the_simulators_race_detector_is_reachable_through_the_device() {
    let sim = SimGpu::builder().manual().build();
    let device = Device::sim(&sim, 2);
    assert!(matches!(&**device.gpu(), Backend::Sim(_)));
    let resource = StreamOrderedResource::new(&device);
    let (a, b) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let block = resource.allocate(1024, a, T).unwrap();
    // A read on b not ordered after the allocation on a: one race.
    let raw_b = device.raw(b).unwrap();
    device
        .simulator()
        .expect("simulated")
        .launch_kernel(raw_b, &[MemAccess::read(&block)])
        .unwrap();
    assert_eq!(sim.races().len(), 1, "the caller's handle sees it too");
    resource.deallocate(block).unwrap();
}

#[test]
fn a_launch_on_the_device_orders_against_other_streams() {
    let sim = SimGpu::builder().manual().build();
    let device = Device::sim(&sim, 2);
    let resource = StreamOrderedResource::new(&device);
    let (a, b) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let block = resource.allocate(1024, a, T).unwrap();
    LaunchRecorder::new(&resource, b)
        .read(&block)
        .launch(&device, |raw| -> Result<(), ResourceError> {
            Ok(sim.launch_kernel(raw, &[MemAccess::read(&block)])?)
        })
        .unwrap();
    resource.deallocate(block).unwrap();
    sim.run_until_idle();
    assert!(sim.races().is_empty(), "{:?}", sim.races());
}

#[test]
fn a_launch_on_a_stream_of_another_device_queues_nothing() {
    let host = SimGpu::builder().manual().build_host(2);
    let (d0, d1) = (Device::sim(&host[0], 1), Device::sim(&host[1], 1));
    let resource = StreamOrderedResource::new(&d0);
    let mut called = false;
    let result = LaunchRecorder::new(&resource, d1.stream(0).unwrap()).launch(
        &d0,
        |_| -> Result<(), ResourceError> {
            called = true;
            Ok(())
        },
    );
    assert!(matches!(result, Err(ResourceError::WrongDevice { .. })));
    assert!(!called);
}

#[test]
fn poison_fills_on_the_device() {
    let sim = SimGpu::builder().manual().build();
    let device = Device::sim(&sim, 1);
    // SAFETY: the guard is the poison's only user and fills only blocks live in a resource of this device.
    let poison = unsafe { MemsetPoisonFill::new(&device, 0xA5) };
    let resource = StreamOrderedResource::new(&device);
    let block = resource
        .allocate(4096, device.stream(0).unwrap(), T)
        .unwrap();
    let fills = sim.call_count(streamalloc::DriverCall::MemsetAsync);
    poison.fill(&block).unwrap();
    assert_eq!(
        sim.call_count(streamalloc::DriverCall::MemsetAsync),
        fills + 1
    );
    resource.deallocate(block).unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn an_awaitable_resource_on_the_device() {
    let device = Device::sim(&SimGpu::new(), 2);
    let res = AsyncResource::on(&device).unwrap();
    let s = device.stream(1).unwrap();
    let block = res.allocate(1 << 20, s, T).await.unwrap();
    res.completion(s).unwrap().await.unwrap();
    res.deallocate(block).unwrap().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

#[test]
fn a_stack_over_the_device_is_awaitable_with_the_same_device() {
    let device = Device::simulated(&SimGpu::builder().manual().build(), 1);
    let guard = DebugGuardResource::new(StreamOrderedResource::new(&device), GuardConfig::new());
    // SAFETY: the guard's bottom resource was made on `device`.
    assert!(unsafe { AsyncResource::with_device(guard, &device) }.is_ok());
    let other = Device::simulated(&SimGpu::builder().ordinal(3).manual().build(), 1);
    let guard = DebugGuardResource::new(StreamOrderedResource::new(&device), GuardConfig::new());
    assert!(matches!(
        // SAFETY: refused before anything is queued (another device).
        unsafe { AsyncResource::with_device(guard, &other) },
        Err(ResourceError::WrongDevice { .. })
    ));
}

/// `Backend` forwards every call, the ones with a default included (a
/// missed forward would answer `NOT_SUPPORTED` from the default).
#[test]
fn the_backend_forwards_the_calls_that_have_defaults() {
    use streamalloc::gpu::Gpu;
    let sim = SimGpu::builder().manual().build();
    let device = Device::sim(&sim, 1);
    let resource = StreamOrderedResource::new(&device);
    let block = resource
        .allocate(1 << 20, device.stream(0).unwrap(), T)
        .unwrap();
    let held = device.gpu().memory_held().expect("forwarded");
    assert_eq!(held, Gpu::memory_held(&*sim).unwrap());
    device.gpu().reset_memory_held_high().expect("forwarded");
    // Virtual memory: reserve, create, map, open, unmap, release, free.
    let gpu = device.gpu();
    let g = gpu.vm_granularity().expect("forwarded");
    assert_eq!(g, Gpu::vm_granularity(&*sim).unwrap());
    let addr = gpu.address_reserve(g).expect("forwarded");
    let page = gpu.mem_create(g).expect("forwarded");
    // SAFETY: `addr` is a fresh reservation of `g` bytes with nothing mapped,
    // `page` a live handle of `g` bytes; nothing ever touches the range, so
    // it can be unmapped, released and freed right after.
    unsafe {
        gpu.mem_map(addr, g, page).expect("forwarded");
        gpu.mem_set_access(addr, g).expect("forwarded");
        gpu.mem_unmap(addr, g).expect("forwarded");
        gpu.mem_release(page).expect("forwarded");
        gpu.address_free(addr, g).expect("forwarded");
    }
    let lane = device.gpu().create_stream().expect("forwarded");
    // SAFETY: `lane` was just made by this backend's `create_stream` and is not used again.
    unsafe { device.gpu().destroy_stream(lane) }.unwrap();
    resource.deallocate(block).unwrap();
}

/// Streams created elsewhere (a framework's) join an open-ended pool after
/// the resources on it were built: the cache serves them and orders a range
/// freed on one before another reuses it; a handle registered twice keeps
/// its id; a full pool refuses a new one and changes nothing.
#[test]
fn an_open_ended_pool_takes_streams_registered_after_its_resources() {
    use streamalloc::CachingResource;
    use streamalloc::StreamPool;
    let sim = SimGpu::builder().manual().build();
    let theirs = sim.stream_pool(3);
    let raw: Vec<_> = theirs.ids().map(|s| theirs.raw(s).unwrap()).collect();
    let pool = StreamPool::open_ended(0, 2);
    let device = Device::new(sim.clone(), pool.clone()).unwrap();
    let cache = CachingResource::new(StreamOrderedResource::new(&device));
    assert_eq!((pool.len(), pool.capacity()), (0, 2));
    // SAFETY: the simulated streams live as long as `sim`, which the device
    // holds; each names one stream on every thread.
    let a = unsafe { pool.register(raw[0]) }.unwrap();
    // SAFETY: as above.
    let again = unsafe { pool.register(raw[0]) }.unwrap();
    assert!(again == a && pool.find(raw[0]) == Some(a));
    // SAFETY: as above.
    let b = unsafe { pool.register(raw[1]) }.unwrap();
    assert_ne!(a, b);
    // SAFETY: as above.
    let full = unsafe { pool.register(raw[2]) };
    assert_eq!(
        full,
        Err(ResourceError::StreamPoolFull {
            device: 0,
            capacity: 2
        })
    );
    assert_eq!((pool.len(), pool.find(raw[2])), (2, None));

    let first = cache.allocate(1 << 20, a, T).unwrap();
    sim.launch_kernel(raw[0], &[MemAccess::write(&first)])
        .unwrap();
    let freed_at = first.ptr();
    cache.deallocate(first).unwrap();
    let second = cache.allocate(1 << 20, b, T).unwrap();
    sim.launch_kernel(raw[1], &[MemAccess::write(&second)])
        .unwrap();
    sim.run_until_idle();
    assert!(sim.races().is_empty(), "{:?}", sim.races());
    assert_eq!(second.ptr(), freed_at, "the range freed on a serves b");
    cache.deallocate(second).unwrap();
}

/// The futures layer makes a notifier per stream when it is built: a
/// stream registered later is refused, never served without one.
#[tokio::test]
async fn the_futures_layer_refuses_a_stream_registered_after_it() {
    use streamalloc::StreamPool;
    let sim = SimGpu::builder().build();
    let theirs = sim.stream_pool(2);
    let raw: Vec<_> = theirs.ids().map(|s| theirs.raw(s).unwrap()).collect();
    let pool = StreamPool::open_ended(0, 4);
    // SAFETY: the simulated streams live as long as `sim`.
    let early = unsafe { pool.register(raw[0]) }.unwrap();
    let res = AsyncResource::on(&Device::new(sim.clone(), pool.clone()).unwrap()).unwrap();
    // SAFETY: as above.
    let late = unsafe { pool.register(raw[1]) }.unwrap();
    let block = res.allocate(4096, early, T).await.unwrap();
    assert!(matches!(
        res.allocate(4096, late, T).await,
        Err(ResourceError::UnknownStream { stream, .. }) if stream == late
    ));
    drop(res.deallocate(block).unwrap());
}
