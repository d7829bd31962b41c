//! The caching tier under CUDA graph capture (issue 19, part 2): memory
//! handed out or freed on a capturing stream belongs to the capture's graph
//! until the graph is released, is reused within the graph and across its
//! replays, and returns to general use behind the last replay; budgets and
//! stats count it.

use std::sync::Arc;

use streamalloc::cache::{CacheConfig, CachingResource};
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::gpu::{CaptureId, CaptureMode, CaptureStatus, Gpu, RawGraph, RawGraphExec};
use streamalloc::{AllocTag, Device, DeviceBlock, DeviceMemoryResource, SimResource, StreamId};

const MIB: usize = 1 << 20;

struct Fixture {
    gpu: Arc<SimGpu>,
    device: Device<SimGpu>,
    /// The stream captured.
    s: StreamId,
    /// The stream the graph is replayed on.
    l: StreamId,
}

fn fixture() -> Fixture {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 3);
    let (s, l) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    Fixture { gpu, device, s, l }
}

impl Fixture {
    fn begin(&self, stream: StreamId) -> CaptureId {
        let raw = self.device.raw(stream).unwrap();
        self.gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
        match self.gpu.capture_status(raw).unwrap() {
            CaptureStatus::Active(id) => id,
            other => panic!("not capturing: {other:?}"),
        }
    }

    fn end(&self, stream: StreamId) -> (RawGraph, RawGraphExec) {
        let graph = self
            .gpu
            .end_capture(self.device.raw(stream).unwrap())
            .unwrap();
        let exec = self.gpu.graph_instantiate(graph).unwrap();
        (graph, exec)
    }

    fn write(&self, stream: StreamId, block: &DeviceBlock) {
        self.gpu
            .launch_kernel(self.device.raw(stream).unwrap(), &[MemAccess::write(block)])
            .unwrap();
    }

    /// Orders later work on `later` after the work queued on `earlier` so
    /// far.
    fn order(&self, later: StreamId, earlier: StreamId) {
        let event = Gpu::event_create(self.gpu.as_ref()).unwrap();
        self.gpu
            .event_record(event, self.device.raw(earlier).unwrap())
            .unwrap();
        self.gpu
            .stream_wait_event(self.device.raw(later).unwrap(), event)
            .unwrap();
    }

    fn replay(&self, exec: RawGraphExec, stream: StreamId, times: usize) {
        for _ in 0..times {
            self.gpu
                .graph_launch(exec, self.device.raw(stream).unwrap())
                .unwrap();
        }
    }

    fn destroy(&self, (graph, exec): (RawGraph, RawGraphExec)) {
        self.gpu.graph_exec_destroy(exec).unwrap();
        self.gpu.graph_destroy(graph).unwrap();
    }
}

/// The bug of issue 19: a block cached before a capture is handed out in it
/// and freed in it; right after, the cache handed the same address to the
/// next allocation while every replay still wrote there.
fn a_block_freed_in_a_capture_is_not_handed_out_while_the_graph_lives<R>(
    f: &Fixture,
    cache: &R,
) -> (CaptureId, (RawGraph, RawGraphExec), DeviceBlock, u64)
where
    R: DeviceMemoryResource,
{
    let warm = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &warm);
    cache.deallocate(warm).unwrap();
    // The replays come after everything before the capture, not after what
    // the stream does once it ended: a block handed out again meanwhile
    // races them.
    f.order(f.l, f.s);

    let capture = f.begin(f.s);
    let tmp = cache.allocate(MIB, f.s, AllocTag("step")).unwrap();
    f.write(f.s, &tmp);
    let graph_ptr = tmp.ptr();
    cache.deallocate(tmp).unwrap();
    let graph = f.end(f.s);

    let next = cache.allocate(MIB, f.s, AllocTag("other")).unwrap();
    assert_ne!(
        next.ptr(),
        graph_ptr,
        "the graph's block was handed to someone else while its replays write it"
    );
    f.write(f.s, &next);
    f.replay(graph.1, f.l, 3);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    (capture, graph, next, graph_ptr)
}

#[test]
fn arena_block_freed_in_a_capture_stays_with_the_graph() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let (capture, graph, next, graph_ptr) =
        a_block_freed_in_a_capture_is_not_handed_out_while_the_graph_lives(&f, &cache);
    assert!(cache.graph_bytes() >= MIB);
    cache.deallocate(next).unwrap();

    // Released: the graph's memory serves the stream again, after the last
    // replay.
    f.replay(graph.1, f.l, 1);
    f.destroy(graph);
    cache.release_capture(capture, f.l).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    let mut seen = Vec::new();
    for _ in 0..2 {
        let b = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
        f.write(f.s, &b);
        seen.push(b);
    }
    assert!(
        seen.iter().any(|b| b.ptr() == graph_ptr),
        "the released range is reused on its stream"
    );
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    for b in seen {
        cache.deallocate(b).unwrap();
    }
}

#[test]
fn size_class_block_freed_in_a_capture_stays_with_the_graph() {
    let f = fixture();
    let config = CacheConfig::default().virtual_memory(false);
    let cache = CachingResource::with_config(SimResource::new(&f.device), config);
    let (capture, graph, next, graph_ptr) =
        a_block_freed_in_a_capture_is_not_handed_out_while_the_graph_lives(&f, &cache);
    assert_eq!(cache.graph_bytes(), MIB);
    cache.deallocate(next).unwrap();
    f.destroy(graph);
    cache.release_capture(capture, f.l).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    let again = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &again);
    let other = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert!(again.ptr() == graph_ptr || other.ptr() == graph_ptr);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    cache.deallocate(again).unwrap();
    cache.deallocate(other).unwrap();
}
