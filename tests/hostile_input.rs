//! Bad input found by the outside review (issue 18): each is refused with
//! its own error and changes nothing.

mod checks;
mod common;

use std::sync::Arc;

use checks::Snapshot;
use streamalloc::cache::{CacheConfig, CachingResource};
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    AllocTag, DeviceBlock, DeviceMemoryResource, DriverCall, ResourceError, SimResource,
};

const T: AllocTag = AllocTag("hostile");

/// A cache configured to cache blocks of any size: a request near
/// `usize::MAX` used to overflow its size-class arithmetic (a panic in
/// debug). It now bypasses the classes and the device refuses it.
#[test]
fn a_request_near_usize_max_through_a_cache_is_out_of_memory() {
    let f = common::sim(1);
    let cache = CachingResource::with_config(
        f.resource.clone(),
        CacheConfig::default().max_block_size(usize::MAX),
    );
    for bytes in [usize::MAX, usize::MAX - 4095, (usize::MAX >> 1) + 2] {
        let err = cache.allocate(bytes, f.stream(0), T).unwrap_err();
        assert!(
            matches!(err, ResourceError::OutOfMemory { .. }),
            "{bytes}: {err:?}"
        );
    }
    assert_eq!(cache.cached_bytes() + cache.leased_bytes(), 0);
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

/// A stream of device 1 put in a pool of device 0 (by `StreamPool::from_raw`):
/// the simulated device refuses the allocation on it, as it refuses every
/// other call on a stream it does not own, instead of handing out a block no
/// free can return.
#[test]
fn an_allocation_on_another_devices_stream_is_refused() {
    let gpus = SimGpu::builder().manual().build_host(2);
    let stranger = gpus[1].create_stream();
    // SAFETY: a stream of a simulated device; nothing is dereferenced.
    let pool =
        Arc::new(unsafe { streamalloc::StreamPool::from_raw(0, vec![stranger], Vec::new()) });
    let r = SimResource::new(&streamalloc::Device::new(gpus[0].clone(), pool.clone()).unwrap());
    let s = pool.id(0).unwrap();
    let before = Snapshot::of(&r, &[]);
    let err = r.allocate(4096, s, T).unwrap_err();
    assert!(
        matches!(
            err,
            // The first call on the stream (whether it is capturing, asked
            // before allocating) is refused.
            ResourceError::Driver {
                call: DriverCall::StreamGetCaptureInfo | DriverCall::AllocAsync,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(Snapshot::of(&r, &[]), before);
    assert_eq!(gpus[0].free_bytes(), 16 << 30);
    assert_eq!(gpus[1].free_bytes(), 16 << 30);
}

/// A hand-built descriptor with the right id, address and size but another
/// stream is not the block: refused, and the block stays live.
#[test]
fn a_descriptor_with_the_wrong_stream_is_refused() {
    let f = common::sim(2);
    let r = &f.resource;
    let block = r.allocate(4096, f.stream(0), T).unwrap();
    let forged = DeviceBlock::new(block.id(), block.ptr(), block.size(), f.stream(1), T);
    let before = Snapshot::of(r, &[&block]);
    assert_eq!(
        r.deallocate(forged),
        Err(ResourceError::UnknownBlock { block: block.id() })
    );
    assert_eq!(Snapshot::of(r, &[&block]), before);
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
}

/// Two pools of the same device: a stream id of one is refused by a
/// resource of the other, rather than resolved to its stream of the same
/// index.
#[test]
fn another_pools_stream_on_the_same_device_is_refused() {
    let gpu = SimGpu::builder().manual().build();
    let (mine, theirs) = (gpu.stream_pool(2), gpu.stream_pool(2));
    let r = SimResource::new(&streamalloc::Device::new(gpu.clone(), mine.clone()).unwrap());
    let foreign = theirs.id(0).unwrap();
    let before = Snapshot::of(&r, &[]);
    let err = r.allocate(4096, foreign, T).unwrap_err();
    assert_eq!(err, ResourceError::ForeignStream { stream: foreign });
    assert_eq!(
        mine.raw(foreign),
        Err(ResourceError::ForeignStream { stream: foreign })
    );
    assert_eq!(r.pending_free_seq(foreign), 0);
    assert_eq!(r.reap_through(foreign, 1), 0);
    assert_eq!(Snapshot::of(&r, &[]), before);
    // The pool's own ids still work, and so does a hand-built id (no pool
    // named: the pool of the device).
    let block = r.allocate(64, mine.id(1).unwrap(), T).unwrap();
    r.deallocate(block).unwrap();
    let hand = streamalloc::StreamId::new(0, 1);
    assert_eq!(mine.raw(hand), mine.raw(mine.id(1).unwrap()));
}

/// `reap_through` with a sequence number the stream never handed out
/// (`u64::MAX`) drains nothing: those frees may not have run.
#[test]
fn reap_through_a_number_never_handed_out_drains_nothing() {
    let f = common::sim(1);
    let r = &f.resource;
    let s = f.stream(0);
    let block = r.allocate(4096, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(r.pending_free_bytes(), 4096);
    assert_eq!(r.reap_through(s, u64::MAX), 0);
    assert_eq!(r.reap_through(s, 2), 0, "one past the last free");
    assert_eq!(r.pending_free_bytes(), 4096);
    assert_eq!(r.bytes_outstanding(), 4096);
    let seq = r.pending_free_seq(s);
    assert_eq!(seq, 1);
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
}
