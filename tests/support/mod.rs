//! What every test binary shares (each names it with
//! `#[path = "../support/mod.rs"] mod support;`): fixtures on every backend
//! ([`fixture`]), the arena's cache ([`arena`]), the poll-time harness
//! ([`bounded`]), counter snapshots and settling ([`checks`]), where proptest keeps its
//! failing cases ([`regressions`]), and, here,
//! for the adaptor tests, a resource that does not track block use and one
//! check that an adaptor forwards everything it does not change.

// Each binary uses part of this folder.
#![allow(dead_code, unused_imports)]

pub mod arena;
pub mod bounded;
pub mod checks;
pub mod fixture;
pub mod regressions;
pub mod suite;

pub use checks::*;
pub use fixture::*;

use std::sync::Arc;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, DeviceMemoryResource, ResourceResult,
    SimResource, StreamId,
};

/// Forwards allocation, free and reaping to `R` but tracks no block use, like
/// a synchronous third-party resource would.
#[derive(Debug)]
pub struct NoTracking<R>(pub R);

// SAFETY: blocks and streams are `R`'s, unchanged; the block-use hooks
// say there is no tracking (so buffers refuse cross-stream uses).
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for NoTracking<R> {
    streamalloc::forward_to_inner!(0; allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams, allocation_limit, budget_reliefs, capture_status, release_capture);
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.0.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.0.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.0.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.0.bytes_outstanding()
    }
    fn reap_pending(&self) -> ResourceResult<()> {
        self.0.reap_pending()
    }
    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.0.pending_free_seq(stream)
    }
    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.0.reap_through(stream, seq)
    }
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.0.block_state(block)
    }
    fn supports_block_use_tracking(&self) -> bool {
        false
    }
    // Nothing to record: a resource without tracking orders only work on a
    // block's own stream, which buffers check through the answer above.
    fn record_block_use(&self, _: &DeviceBlock, _: StreamId) -> ResourceResult<()> {
        Ok(())
    }
    fn prepare_block_use(&self, _: BlockId, _: StreamId, _: Access) -> ResourceResult<()> {
        Ok(())
    }
    fn finish_block_use(&self, _: BlockId, _: StreamId, _: Access) -> ResourceResult<()> {
        Ok(())
    }
}

/// Checks that the adaptor built by `wrap` around a manual simulated
/// resource forwards the tracking hooks, `block_state`,
/// `pending_free_seq`, `reap_through` and `reap_pending` to it, by watching
/// the inner resource and the device change. `release` makes a deallocated
/// block's free reach the inner resource (a debug guard's flush; nothing
/// for the others).
pub fn check_forwarding<A: DeviceMemoryResource>(
    wrap: impl FnOnce(Arc<SimResource>) -> A,
    release: impl Fn(&A),
) {
    let f = sim(3);
    let gpu = f.sim.clone().unwrap();
    let inner = f.resource.clone();
    let r = wrap(inner.clone());
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let raw = |s| f.pool.raw(s).unwrap();

    assert!(r.supports_block_use_tracking());
    assert_eq!(r.device_ordinal(), inner.device_ordinal());

    let block = r.allocate(4096, a, AllocTag("fwd")).unwrap();
    let (id, ptr) = (block.id(), block.ptr());
    assert_eq!(r.block_state(id), Some(BlockState::Live));
    assert_eq!(inner.live_bytes(), 4096);
    assert_eq!(r.bytes_outstanding(), 4096);
    assert_eq!(inner.pending_use_event_count(ptr), Some(0));

    // prepare + finish of a read on b attach the allocation-order event and
    // b's read event to the inner's record.
    r.prepare_block_use(id, b, Access::Read).unwrap();
    gpu.launch_kernel(raw(b), &[MemAccess::read(&block)])
        .unwrap();
    r.finish_block_use(id, b, Access::Read).unwrap();
    assert_eq!(inner.pending_use_event_count(ptr), Some(2));
    r.record_block_use(&block, c).unwrap();
    assert_eq!(inner.pending_use_event_count(ptr), Some(3));

    // The free waits on b's and c's events, and is tallied with a sequence
    // number that the adaptor reports.
    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    r.deallocate(block).unwrap();
    release(&r);
    assert_eq!(gpu.call_count(DriverCall::StreamWaitEvent), waits + 2);
    assert_eq!(r.block_state(id), Some(BlockState::Retired));
    let seq = r.pending_free_seq(a);
    assert!(seq > 0);
    assert_eq!(seq, inner.pending_free_seq(a));
    assert_eq!(inner.pending_free_bytes(), 4096);
    gpu.run_until_idle();
    assert_eq!(r.reap_through(a, seq), 4096);
    assert_eq!(inner.pending_free_bytes(), 0);

    // reap_pending reaches the inner: it synchronizes and drains.
    let block = r.allocate(1024, a, AllocTag("fwd")).unwrap();
    r.deallocate(block).unwrap();
    release(&r);
    assert_eq!(inner.pending_free_bytes(), 1024);
    let syncs = gpu.call_count(DriverCall::StreamSynchronize);
    r.reap_pending().unwrap();
    assert_eq!(inner.pending_free_bytes(), 0);
    assert!(gpu.call_count(DriverCall::StreamSynchronize) > syncs);
    assert_eq!(r.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Checks that the adaptor built by `wrap` refuses bad input with the right
/// error and changes nothing: not the inner resource's counts, not the
/// device's queued work, not what `observe` reports about the adaptor
/// itself (its budget, its counters, its quarantine).
pub fn check_bad_input<A: DeviceMemoryResource, O: PartialEq + std::fmt::Debug>(
    wrap: impl FnOnce(Arc<SimResource>) -> A,
    observe: impl Fn(&A) -> O,
) {
    use streamalloc::ResourceError;

    let f = sim(2);
    let other = sim(1);
    let gpu = f.sim.clone().unwrap();
    let inner = f.resource.clone();
    let r = wrap(inner.clone());
    let s = f.stream(0);
    let kept = r.allocate(128, s, AllocTag("kept")).unwrap();
    let freed = r.allocate(64, s, AllocTag("freed")).unwrap();
    r.deallocate(freed.clone()).unwrap();
    let foreign = other.resource.allocate(32, other.stream(0), T).unwrap();

    let state = |r: &A| {
        (
            inner.live_bytes(),
            inner.pending_free_bytes(),
            inner.live_blocks(),
            r.bytes_outstanding(),
            r.block_state(kept.id()),
            inner.pending_use_event_count(kept.ptr()),
            [
                DriverCall::AllocAsync,
                DriverCall::FreeAsync,
                DriverCall::EventRecord,
                DriverCall::StreamWaitEvent,
                DriverCall::MemsetAsync,
            ]
            .map(|c| gpu.call_count(c)),
            observe(r),
        )
    };
    let before = state(&r);

    assert!(matches!(
        r.deallocate(freed.clone()),
        Err(ResourceError::DoubleFree { .. })
    ));
    assert!(matches!(
        r.deallocate(foreign.clone()),
        Err(ResourceError::ForeignBlock { .. })
    ));
    let forged = DeviceBlock::new(kept.id(), kept.ptr(), 4096, s, T);
    assert!(matches!(
        r.deallocate(forged),
        Err(ResourceError::UnknownBlock { .. })
    ));
    assert!(matches!(
        r.allocate(64, StreamId::new(0, 99), T),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert!(matches!(
        r.allocate(64, StreamId::new(5, 0), T),
        Err(ResourceError::WrongDevice { .. })
    ));
    assert!(matches!(
        r.prepare_block_use(kept.id(), StreamId::new(0, 99), Access::Read),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert!(r.finish_block_use(foreign.id(), s, Access::Read).is_err());
    assert!(r.record_block_use(&freed, f.stream(1)).is_err());
    assert_eq!(state(&r), before);
    r.deallocate(kept).unwrap();
}

const T: AllocTag = AllocTag("bad");
