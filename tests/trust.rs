//! What the crate trusts, and what it checks: a user's layer cannot lose
//! frees by leaving a method out, and a stream id reaches the driver only
//! through the pool that handed it out, so that neither a hand-made id nor
//! one of another pool or device instance (same ordinal) points a safe call
//! at memory the crate cannot vouch for.

mod common;

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::Buffer;
use streamalloc::CacheConfig;
use streamalloc::ResourceBuilder;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, DeviceBlock, DeviceMemoryResource, ResourceError, ResourceResult,
    SimResource, StreamId,
};

const TAG: AllocTag = AllocTag("trust");
const KIB_128: usize = 128 << 10;

/// A layer as a user writes one: it changes `allocate` (counts calls) and
/// writes the other required methods by hand, forwarding the rest with the
/// crate's macro. Before the trait had required reaping methods, a layer
/// like this with only `allocate`, `deallocate`, `device_ordinal` and
/// `bytes_outstanding` compiled, and its `reap_pending` said `Ok` while
/// every free below it stayed pending.
struct UserLayer<R> {
    inner: R,
    allocations: std::sync::atomic::AtomicUsize,
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for UserLayer<R> {
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.allocations
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.inner.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }
    streamalloc::forward_to_inner!(inner; reap_pending, pending_free_seq, reap_through,
        supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use,
        allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams,
        allocation_limit, budget_reliefs, capture_status, release_capture);
}

fn user_layer(inner: SimResource) -> UserLayer<SimResource> {
    UserLayer {
        inner,
        allocations: Default::default(),
    }
}

#[test]
fn a_user_layers_reap_drains_the_frees_below_it() {
    let f = common::sim_with(SimGpu::new(), 1);
    let layer = user_layer(SimResource::new(&f.device));
    let block = layer.allocate(KIB_128, f.stream(0), TAG).unwrap();
    layer.deallocate(block).unwrap();
    assert_eq!(layer.bytes_outstanding(), KIB_128, "the free is queued");
    layer.reap_pending().unwrap();
    assert_eq!(
        layer.bytes_outstanding(),
        0,
        "reap_pending said Ok: nothing may stay outstanding"
    );
    assert_eq!(f.sim.as_ref().unwrap().held_bytes(), 0);
}

#[tokio::test]
async fn a_user_layers_dealloc_handle_resolves_once_its_bytes_left() {
    let gpu = SimGpu::new();
    let f = common::sim_with(gpu, 1);
    let layer = user_layer(SimResource::new(&f.device));
    // SAFETY: the layer's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(layer, &f.device) }.unwrap();
    let block = res.try_allocate(KIB_128, f.stream(0), TAG).unwrap();
    res.deallocate(block).unwrap().await.unwrap();
    assert_eq!(
        res.bytes_outstanding(),
        0,
        "the DeallocHandle resolved Ok with the bytes still outstanding"
    );
}

/// Every safe entry point that takes a stream, given `bad`, on the bare
/// resource and on a cached stack: refused with `ForeignStream`, and
/// nothing changes (no block, no byte, no race).
fn refused_everywhere(f: &common::Fixture<SimGpu>, bad: StreamId) {
    refused_by(f, bad, &AsyncResource::on(&f.device).unwrap());
    // Each tier of the cache: the arena, the size classes, and the size
    // classes with no capture check (where a hit asks nothing below).
    for config in [
        CacheConfig::default(),
        CacheConfig::default().capture_aware(false),
        CacheConfig::default().virtual_memory(false),
        CacheConfig::default()
            .virtual_memory(false)
            .capture_aware(false),
    ] {
        let cached = ResourceBuilder::new().cache(config);
        refused_by(f, bad, &AsyncResource::build(&f.device, &cached).unwrap());
    }
}

fn refused_by<R: DeviceMemoryResource + 'static>(
    f: &common::Fixture<SimGpu>,
    bad: StreamId,
    res: &AsyncResource<R>,
) {
    let gpu = f.sim.clone().unwrap();
    let foreign = |r: ResourceResult<_>, what: &str| match r {
        Err(ResourceError::ForeignStream { stream }) => assert_eq!(stream, bad, "{what}"),
        Err(e) => panic!("{what}: {e}"),
        Ok(_) => panic!("{what} accepted {bad} of no pool of its own"),
    };
    let ok = f.stream(0);
    let mut held = res.try_allocate_buffer::<u32>(64, ok, TAG).unwrap();
    let other = res.try_allocate_buffer::<u32>(64, ok, TAG).unwrap();
    // A block cached on `ok`'s shard (same index as `bad`), which `bad`
    // must not take.
    let warm = res.inner().allocate(64, ok, TAG).unwrap();
    res.inner().deallocate(warm).unwrap();
    // The device runs on its own thread: let the free run and be counted
    // before the snapshot.
    gpu.run_until_idle();
    res.inner().reap_pending().unwrap();
    let before = (res.bytes_outstanding(), gpu.held_bytes());

    foreign(f.device.raw(bad).map(|_| ()), "Device::raw");
    foreign(res.inner().allocate(64, bad, TAG).map(drop), "allocate");
    foreign(res.try_allocate(64, bad, TAG).map(drop), "try_allocate");
    foreign(
        res.try_allocate_buffer::<u32>(4, bad, TAG).map(drop),
        "try_allocate_buffer",
    );
    foreign(
        Buffer::<u32>::allocate_in(res.inner().clone(), &f.device, 4, bad, TAG).map(drop),
        "Buffer::allocate_in",
    );
    foreign(held.fill_bytes_on(bad, 7), "fill_bytes_on");
    foreign(held.copy_from_on(bad, &other), "copy_from_on");
    foreign(held.read_on(bad).map(drop), "read_on");
    foreign(held.write_on(bad).map(drop), "write_on");
    foreign(
        res.prepare_block_use(held.id(), bad, Access::Read),
        "prepare_block_use",
    );
    foreign(
        res.inner().record_block_use(held.block(), bad),
        "record_block_use",
    );
    foreign(res.completion(bad).map(drop), "completion");
    foreign(res.inner().capture_status(bad).map(drop), "capture_status");
    foreign(
        res.inner()
            .release_capture(streamalloc::CaptureId::new(1 << 40), bad),
        "release_capture",
    );
    foreign(
        res.release_capture(streamalloc::CaptureId::new(1 << 40), bad),
        "AsyncResource::release_capture",
    );
    foreign(
        res.begin_capture(bad, streamalloc::gpu::CaptureMode::Relaxed)
            .map(drop),
        "begin_capture",
    );
    foreign(
        res.inner().prepare_block_use(held.id(), bad, Access::Write),
        "the stack's prepare_block_use",
    );
    foreign(
        res.inner().finish_block_use(held.id(), bad, Access::Write),
        "the stack's finish_block_use",
    );
    let mut launched = false;
    foreign(
        res.launch(bad)
            .write(&mut held)
            .enqueue(|_| {
                launched = true;
                Ok::<(), ResourceError>(())
            })
            .map(drop),
        "launch",
    );
    assert!(!launched, "the launch closure ran on a refused stream");

    assert_eq!((res.bytes_outstanding(), gpu.held_bytes()), before);
    drop((held, other));
    gpu.run_until_idle();
    res.inner().release_idle().unwrap();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_hand_made_stream_id_is_refused_by_every_entry_point() {
    let f = common::sim_with(SimGpu::new(), 2);
    refused_everywhere(&f, StreamId::new(0, 0));
}

#[test]
fn a_stream_of_another_pool_of_the_same_device_is_refused_by_every_entry_point() {
    let gpu = SimGpu::new();
    let f = common::sim_with(gpu.clone(), 2);
    let second = streamalloc::Device::simulated(&gpu, 2);
    refused_everywhere(&f, second.stream(0).unwrap());
}

#[test]
fn a_stream_of_another_device_of_the_same_ordinal_is_refused_by_every_entry_point() {
    let f = common::sim_with(SimGpu::new(), 2);
    let elsewhere = streamalloc::Device::simulated(&SimGpu::new(), 2);
    assert_eq!(elsewhere.ordinal(), f.device.ordinal());
    refused_everywhere(&f, elsewhere.stream(0).unwrap());
}

/// A resource of one device used with a `Device` of another simulated
/// device of the same ordinal: `allocate_in` refuses either's stream, and
/// neither device allocates anything.
#[test]
fn a_resource_used_with_another_device_of_the_same_ordinal_is_refused() {
    let (a, b) = (SimGpu::new(), SimGpu::new());
    let on_a = streamalloc::Device::simulated(&a, 1);
    let on_b = streamalloc::Device::simulated(&b, 1);
    let resource = Arc::new(SimResource::new(&on_a));
    for stream in [on_a.stream(0).unwrap(), on_b.stream(0).unwrap()] {
        let r = Buffer::<u8>::allocate_in(resource.clone(), &on_b, 4096, stream, TAG);
        assert!(
            matches!(r, Err(ResourceError::ForeignStream { stream: s }) if s == stream),
            "{:?}",
            r.map(drop)
        );
        assert_eq!(resource.bytes_outstanding(), 0);
        assert_eq!((a.held_bytes(), b.held_bytes()), (0, 0));
    }
    // Its own device works.
    let mut ok =
        Buffer::<u8>::allocate_in(resource.clone(), &on_a, 4096, on_a.stream(0).unwrap(), TAG)
            .unwrap();
    ok.fill_bytes_on(on_a.stream(0).unwrap(), 1).unwrap();
    drop(ok);
    a.run_until_idle();
    assert!(a.races().is_empty() && b.races().is_empty());
}

/// A `Device` put together from one simulated device and a pool of the
/// streams of another of the same ordinal is refused: the pool carries
/// its context. It used to be accepted (only the ordinal was compared).
#[test]
fn a_device_over_another_contexts_pool_is_refused() {
    let (a, b) = (SimGpu::new(), SimGpu::new());
    assert_eq!(
        streamalloc::Device::new(b.clone(), a.stream_pool(1)).err(),
        Some(ResourceError::WrongContext { device: 0 })
    );
    assert!(streamalloc::Device::new(a.clone(), a.stream_pool(1)).is_ok());
}

/// The same pair with the streams vouched for by hand (the `unsafe`
/// `StreamPool::from_raw`, whose contract this breaks on purpose): the
/// simulator still refuses every call on them (a stream handle names its
/// host), instead of running the work on its own stream of the same index,
/// and neither device allocates anything.
#[test]
fn a_device_over_another_simulated_devices_streams_runs_nothing() {
    let (a, b) = (SimGpu::new(), SimGpu::new());
    // SAFETY: not upheld on purpose (the stream is `a`'s, the backend
    // `b`): the simulator checks every handle, which is what is tested.
    let lied = unsafe { streamalloc::StreamPool::from_raw(0, vec![a.create_stream()], Vec::new()) };
    let mixed = streamalloc::Device::new(b.clone(), std::sync::Arc::new(lied)).unwrap();
    // `b` has a stream of the same index, which the handle must not name.
    let _own = b.stream_pool(1);
    let resource = SimResource::new(&mixed);
    let s = mixed.stream(0).unwrap();
    // Refused by the first call on the handle (the capture query before
    // the allocation), as an invalid handle.
    let err = resource.allocate(4096, s, TAG).unwrap_err();
    assert!(
        matches!(
            err,
            ResourceError::Driver {
                call: streamalloc::DriverCall::StreamGetCaptureInfo
                    | streamalloc::DriverCall::AllocAsync,
                code: 400,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(resource.bytes_outstanding(), 0);
    assert_eq!((a.held_bytes(), b.held_bytes()), (0, 0));
    assert!(a.races().is_empty() && b.races().is_empty());
}
