//! Helpers for the adaptor tests: a resource that does not track block use,
//! and one check that an adaptor forwards everything it does not change.

#![allow(dead_code)]

use std::sync::Arc;

use streamalloc::error::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, DeviceMemoryResource, ResourceResult,
    SimResource, StreamId,
};

/// Forwards allocation, free and reaping to `R` but tracks no block use (the
/// trait's defaults), like a synchronous third-party resource would.
#[derive(Debug)]
pub struct NoTracking<R>(pub R);

impl<R: DeviceMemoryResource> DeviceMemoryResource for NoTracking<R> {
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
    let f = crate::common::sim(3);
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
