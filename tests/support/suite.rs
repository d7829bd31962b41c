//! The contract every resource stack keeps, one body for all (as RMM's `mr`
//! tests run one suite over each memory resource): a stack is a function
//! from the simulated device's stream-ordered resource to a
//! [`DeviceMemoryResource`], with `settle`, what makes a deallocated block's
//! free reach the resource below (a debug guard's flush; nothing for the
//! others). `tests/adaptors/contract.rs` runs it over the bare resource,
//! both tiers of the cache and each decorator.
//!
//! The decorator-specific checks stay beside: [`super::check_forwarding`]
//! (the tracking hooks reach the inner resource) and
//! [`super::check_bad_input`] (run here too, with nothing to observe).

use std::sync::Arc;

use streamalloc::gpu::sim::MemAccess;
use streamalloc::{Access, AllocTag, BlockState, DeviceMemoryResource, SimResource};

use super::sim;

const T: AllocTag = AllocTag("suite");

/// Blocks of several sizes on one stream: each at least its size, live, on
/// its stream, none overlapping another; freed, settled and reaped, nothing
/// is outstanding below and the stack gives back all it kept.
pub fn allocate_and_free<R: DeviceMemoryResource>(
    build: impl FnOnce(Arc<SimResource>) -> R,
    settle: impl Fn(&R),
) {
    let f = sim(1);
    let gpu = f.sim.clone().unwrap();
    let r = build(f.resource.clone());
    let s = f.stream(0);
    let sizes = [1, 100, 4096, 1 << 20, 3 << 20];
    let mut blocks: Vec<_> = sizes
        .iter()
        .map(|&n| r.allocate(n, s, T).unwrap())
        .collect();
    for (b, &n) in blocks.iter().zip(&sizes) {
        assert!(b.size() >= n, "{} bytes for a request of {n}", b.size());
        assert_eq!(b.stream(), s);
        assert_eq!(r.block_state(b.id()), Some(BlockState::Live));
    }
    assert!(r.bytes_outstanding() >= sizes.iter().sum::<usize>());
    blocks.sort_by_key(|b| b.ptr());
    for w in blocks.windows(2) {
        assert!(w[0].ptr() + w[0].size() as u64 <= w[1].ptr(), "overlap");
    }
    for b in blocks {
        let id = b.id();
        r.deallocate(b).unwrap();
        assert_ne!(r.block_state(id), Some(BlockState::Live));
    }
    settle(&r);
    // What the stack kept goes back as frees queued below: run them, reap.
    r.release_idle().unwrap();
    gpu.run_until_idle();
    r.reap_pending().unwrap();
    assert_eq!(f.resource.live_bytes(), 0);
    assert_eq!(f.resource.pending_free_bytes(), 0);
    assert_eq!(r.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A request of 0 bytes succeeds, frees, and leaves nothing outstanding.
pub fn zero_bytes<R: DeviceMemoryResource>(
    build: impl FnOnce(Arc<SimResource>) -> R,
    settle: impl Fn(&R),
) {
    let f = sim(1);
    let r = build(f.resource.clone());
    let before = r.bytes_outstanding();
    let b = r.allocate(0, f.stream(0), T).unwrap();
    r.deallocate(b).unwrap();
    settle(&r);
    r.release_idle().unwrap();
    f.sim.as_ref().unwrap().run_until_idle();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), before);
}

/// A block written on `a`, read on `b` through the use hooks, freed on `a`:
/// the memory handed out next, on either stream, is written with no race.
pub fn cross_stream_use<R: DeviceMemoryResource>(
    build: impl FnOnce(Arc<SimResource>) -> R,
    settle: impl Fn(&R),
) {
    let f = sim(2);
    let gpu = f.sim.clone().unwrap();
    let r = build(f.resource.clone());
    let (a, b) = (f.stream(0), f.stream(1));
    let raw = |s| f.pool.raw(s).unwrap();
    let block = r.allocate(1 << 20, a, T).unwrap();
    gpu.launch_kernel(raw(a), &[MemAccess::write(&block)])
        .unwrap();
    r.prepare_block_use(block.id(), b, Access::Read).unwrap();
    gpu.launch_kernel(raw(b), &[MemAccess::read(&block)])
        .unwrap();
    r.finish_block_use(block.id(), b, Access::Read).unwrap();
    r.deallocate(block).unwrap();
    settle(&r);
    for s in [b, a] {
        let next = r.allocate(1 << 20, s, T).unwrap();
        gpu.launch_kernel(raw(s), &[MemAccess::write(&next)])
            .unwrap();
        r.deallocate(next).unwrap();
        settle(&r);
    }
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:#?}", gpu.races());
}

/// Every case above, then [`super::check_bad_input`] (each bad call its own
/// error, nothing changed).
pub fn contract<R: DeviceMemoryResource>(
    build: impl Fn(Arc<SimResource>) -> R,
    settle: impl Fn(&R),
) {
    allocate_and_free(&build, &settle);
    zero_bytes(&build, &settle);
    cross_stream_use(&build, &settle);
    super::check_bad_input(&build, |_| ());
}
