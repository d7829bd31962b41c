//! Helpers of the reliability suites: counter snapshots, settling a
//! fixture's streams, and kernels written with the `Gpu` trait's memset and
//! copy so that one body runs on every backend.

use streamalloc::gpu::Gpu;
use streamalloc::{DeviceBlock, DeviceMemoryResource, StreamId, StreamOrderedResource};

use super::Fixture;

/// Every counter and map size of a resource a failed call must leave alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub live_bytes: usize,
    pub pending_free_bytes: usize,
    pub pending_per_stream_total: usize,
    pub bytes_outstanding: usize,
    pub live_blocks: usize,
    /// `pending_use_event_count` of each watched block, in order.
    pub use_events: Vec<Option<usize>>,
}

impl Snapshot {
    pub fn of<G: Gpu>(r: &StreamOrderedResource<G>, watched: &[&DeviceBlock]) -> Self {
        Snapshot {
            live_bytes: r.live_bytes(),
            pending_free_bytes: r.pending_free_bytes(),
            pending_per_stream_total: r.pending_per_stream_total(),
            bytes_outstanding: r.bytes_outstanding(),
            live_blocks: r.live_blocks(),
            use_events: watched
                .iter()
                .map(|b| r.pending_use_event_count(b.ptr()))
                .collect(),
        }
    }
}

/// The invariants that hold whenever no call is in flight.
pub fn assert_quiescent_invariants<G: Gpu>(r: &StreamOrderedResource<G>) {
    assert_eq!(r.pending_free_bytes(), r.pending_per_stream_total());
    assert_eq!(
        r.bytes_outstanding(),
        r.live_bytes() + r.pending_free_bytes()
    );
}

/// Synchronizes every stream of the fixture and, on the simulated device,
/// asserts that the race detector stayed silent.
pub fn settle<G: Gpu>(f: &Fixture<G>) {
    for &s in &f.streams {
        let raw = f.pool.raw(s).unwrap();
        // SAFETY: a stream of the fixture's pool, which it holds.
        unsafe { f.resource.gpu().stream_synchronize(raw) }.unwrap();
    }
    if let Some(sim) = &f.sim {
        sim.run_until_idle();
        let races = sim.races();
        assert!(races.is_empty(), "races: {races:#?}");
    }
}

/// Frees nothing more: reaps and asserts that no byte is left outstanding.
pub fn assert_drained<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    r.reap_pending().unwrap();
    assert_quiescent_invariants(r);
    assert_eq!(r.live_blocks(), 0);
    assert_eq!(r.live_bytes(), 0);
    assert_eq!(r.pending_free_bytes(), 0);
    assert_eq!(r.bytes_outstanding(), 0, "memory lost");
}

/// A "kernel" that writes `block` on `stream` (a memset).
pub fn write<G: Gpu>(f: &Fixture<G>, block: &DeviceBlock, stream: StreamId) {
    let raw = f.pool.raw(stream).unwrap();
    // SAFETY: `raw` is a stream of the fixture's pool; callers pass blocks
    // live in `f.resource` (the tests that write a freed block on purpose
    // run on the simulated device, which checks every address).
    unsafe {
        f.resource
            .gpu()
            .memset_async(block.ptr(), 0xab, block.size(), raw)
    }
    .unwrap();
}

/// A "kernel" that reads `src` into `dst` on `stream` (a copy).
pub fn read_into<G: Gpu>(f: &Fixture<G>, src: &DeviceBlock, dst: &DeviceBlock, stream: StreamId) {
    let raw = f.pool.raw(stream).unwrap();
    let len = src.size().min(dst.size());
    // SAFETY: as in `write`, for both blocks.
    unsafe { f.resource.gpu().copy_async(dst.ptr(), src.ptr(), len, raw) }.unwrap();
}
