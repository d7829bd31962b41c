//! The caching tier under CUDA graph capture (issue 19, part 2): memory
//! handed out or freed on a capturing stream belongs to the capture's graph
//! until the graph is released, is reused within the graph and across its
//! replays, and returns to general use behind the last replay; budgets and
//! stats count it.

use crate::support;

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::CaptureId;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::gpu::{CaptureMode, CaptureStatus, Gpu, Graph, RawGraph, RawGraphExec};
use streamalloc::{
    Access, AllocTag, Device, DeviceBlock, DeviceMemoryResource, ResourceError, SimResource,
    StreamId,
};
use streamalloc::{Budget, BudgetResource, DebugGuardResource, GuardConfig, Stats, StatsResource};
use streamalloc::{CacheConfig, CachingResource};

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
/// next allocation while every replay still wrote there. (A capture is now
/// served no memory freed just before it, whose last kernel may still be
/// queued: see `a_capture_takes_no_memory_queued_work_still_touches`; the
/// block it gets instead must stay the graph's all the same.)
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
    // The two blocks freed before (the warm one, `next`) and the graph's.
    for _ in 0..3 {
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
    let (capture, graph, next, _) =
        a_block_freed_in_a_capture_is_not_handed_out_while_the_graph_lives(&f, &cache);
    // The capture's block is a graph allocation of the resource below,
    // which holds it for the graph.
    assert_eq!(cache.graph_bytes(), 0);
    assert_eq!(cache.inner().graph_bytes(), MIB);
    cache.deallocate(next).unwrap();
    f.destroy(graph);
    cache.release_capture(capture, f.l).unwrap();
    f.gpu.run_until_idle();
    cache.reap_pending().unwrap();
    assert_eq!(cache.inner().graph_bytes(), 0);
    assert_eq!(
        cache.bytes_outstanding(),
        cache.cached_bytes(),
        "only the cached blocks are left"
    );
    let again = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &again);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    cache.deallocate(again).unwrap();
}

/// A capture's frees serve its later allocations (no new memory), and
/// every replay runs them at the same addresses without a race.
#[test]
fn memory_freed_in_a_capture_is_reused_within_it_and_across_replays() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let capture = f.begin(f.s);
    let a = cache.allocate(MIB, f.s, AllocTag("a")).unwrap();
    f.write(f.s, &a);
    let a_ptr = a.ptr();
    cache.deallocate(a).unwrap();
    let creates = f.gpu.call_count(DriverCall::MemCreate);
    let b = cache.allocate(MIB, f.s, AllocTag("b")).unwrap();
    assert_eq!(b.ptr(), a_ptr, "the capture reuses what it freed");
    f.write(f.s, &b);
    let c = cache.allocate(MIB / 2, f.s, AllocTag("c")).unwrap();
    f.write(f.s, &c);
    cache.deallocate(b).unwrap();
    let d = cache.allocate(MIB / 2 + 4096, f.s, AllocTag("d")).unwrap();
    assert_eq!(
        d.ptr(),
        a_ptr,
        "a range at most twice the request is reused"
    );
    f.write(f.s, &d);
    cache.deallocate(c).unwrap();
    cache.deallocate(d).unwrap();
    assert_eq!(f.gpu.call_count(DriverCall::MemCreate), creates);
    let graph = f.end(f.s);
    assert_eq!(cache.leased_bytes(), 0);
    assert!(cache.graph_bytes() >= MIB + MIB / 2);

    f.replay(graph.1, f.s, 2);
    f.replay(graph.1, f.l, 0);
    f.gpu.run_until_idle();
    f.replay(graph.1, f.s, 1);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(graph);
    cache.release_capture(capture, f.s).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
}

/// A block allocated before the capture and freed in it: the replays use it
/// up to their free, so it stays with the graph; so does a block the
/// capture allocated and the user frees after it (the graph's output).
/// Launched through the crate's graph, which frees what a replay leaves of
/// a block the inner resource allocated in the capture once the user let
/// go of it.
#[test]
fn blocks_the_graph_uses_stay_with_it_whoever_frees_them() {
    for vm in [true, false] {
        let f = fixture();
        let config = CacheConfig::default().virtual_memory(vm);
        let cache = CachingResource::with_config(SimResource::new(&f.device), config);
        // SAFETY: the stack's bottom was made on `f.device` and the cache
        // allocates and resolves streams only through it.
        let res = unsafe { AsyncResource::with_device(cache, &f.device) }.unwrap();
        let cache = res.inner();
        let held_before = f.gpu.held_bytes();
        let input = cache.allocate(MIB, f.s, AllocTag("input")).unwrap();
        f.write(f.s, &input);
        f.order(f.l, f.s);
        let capture = res.begin_capture(f.s, CaptureMode::Relaxed).unwrap();
        f.write(f.s, &input);
        let output = cache.allocate(MIB, f.s, AllocTag("output")).unwrap();
        f.write(f.s, &output);
        let input_ptr = input.ptr();
        cache.deallocate(input).unwrap();
        let graph = capture.end().unwrap();
        // The user reads the output of a replay, then frees it.
        // SAFETY: the graph touches `input` (the graph's since its free in
        // the capture) and `output` (allocated in the capture).
        drop(unsafe { graph.launch(f.l) }.unwrap());
        f.gpu.run_until_idle();
        f.order(f.s, f.l);
        let output_ptr = output.ptr();
        cache.deallocate(output).unwrap();
        let expected = if vm { 2 * MIB } else { MIB };
        assert_eq!(cache.graph_bytes(), expected, "vm {vm}");

        let mut others = Vec::new();
        for _ in 0..3 {
            let b = cache.allocate(MIB, f.s, AllocTag("other")).unwrap();
            assert!(
                b.ptr() != input_ptr && b.ptr() != output_ptr,
                "vm {vm}: a block the graph uses was handed out"
            );
            f.write(f.s, &b);
            others.push(b);
        }
        // Once more: the instance of the inner resource's graph allocation
        // the last replay left is freed first, by the graph.
        // SAFETY: as above.
        drop(unsafe { graph.launch(f.l) }.unwrap());
        f.gpu.run_until_idle();
        assert!(f.gpu.races().is_empty(), "vm {vm}: {:?}", f.gpu.races());
        for b in others {
            cache.deallocate(b).unwrap();
        }
        drop(graph);
        assert_eq!(cache.graph_bytes(), 0, "vm {vm}");
        f.gpu.run_until_idle();
        assert!(f.gpu.races().is_empty(), "vm {vm}: {:?}", f.gpu.races());
        cache.trim().unwrap();
        cache.reap_pending().unwrap();
        f.gpu.run_until_idle();
        assert_eq!(
            f.gpu.held_bytes() - held_before,
            cache.bytes_outstanding(),
            "vm {vm}: the device holds what the books say"
        );
        assert_eq!(cache.leased_bytes(), 0, "vm {vm}");
    }
}

/// Released while replays are still queued: the memory serves its stream
/// again behind the last replay (an event wait, no synchronize), and is
/// given back to the device only once the replays ran.
#[test]
fn released_memory_comes_back_behind_the_last_replay() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let capture = f.begin(f.s);
    let tmp = cache.allocate(4 * MIB, f.s, AllocTag("tmp")).unwrap();
    f.write(f.s, &tmp);
    let ptr = tmp.ptr();
    cache.deallocate(tmp).unwrap();
    let graph = f.end(f.s);
    let held = cache.bytes_outstanding();
    assert!(held >= 4 * MIB);

    // Idle graph memory is not trimmed while the graph lives.
    assert_eq!(cache.trim().unwrap(), 0);
    cache.release_idle().unwrap();
    assert_eq!(cache.bytes_outstanding(), held);
    assert_eq!(cache.graph_bytes(), 4 * MIB);

    f.replay(graph.1, f.l, 3);
    f.destroy(graph);
    let syncs = f.gpu.call_count(DriverCall::StreamSynchronize)
        + f.gpu.call_count(DriverCall::EventSynchronize);
    cache.release_capture(capture, f.l).unwrap();
    assert_eq!(
        f.gpu.call_count(DriverCall::StreamSynchronize)
            + f.gpu.call_count(DriverCall::EventSynchronize),
        syncs,
        "the release waits for nothing on the host"
    );
    // The replays have not run: a trim gives nothing back yet.
    assert_eq!(cache.trim().unwrap(), 0);
    assert_eq!(cache.bytes_outstanding(), held);
    let again = cache.allocate(4 * MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert_eq!(again.ptr(), ptr, "reused on its stream, in stream order");
    f.write(f.s, &again);
    cache.deallocate(again).unwrap();
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    // Once a fence after the replays completed, the memory goes back.
    cache.trim().unwrap();
    f.gpu.run_until_idle();
    cache.trim().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0);
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
}

/// A release while the memory's stream is capturing another graph waits
/// for that capture's end (a wait queued then would join it); a release
/// ordered after a capturing stream is refused, changing nothing.
#[test]
fn a_release_waits_for_the_streams_to_leave_their_captures() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let first = f.begin(f.s);
    let tmp = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &tmp);
    let ptr = tmp.ptr();
    cache.deallocate(tmp).unwrap();
    let graph = f.end(f.s);

    let second = f.begin(f.s);
    let e = cache.release_capture(first, f.s).unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, capture: Some(c) } if stream == f.s && c == second),
        "{e}"
    );
    assert_eq!(cache.graph_bytes(), MIB, "nothing changed");
    f.destroy(graph);
    cache.release_capture(first, f.l).unwrap();
    assert_eq!(
        cache.graph_bytes(),
        MIB,
        "kept until the stream leaves its capture"
    );
    let inside = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert_ne!(inside.ptr(), ptr, "not the first graph's, not yet");
    f.write(f.s, &inside);
    cache.deallocate(inside).unwrap();
    let second_graph = f.end(f.s);
    assert!(
        f.gpu
            .capture_status(f.device.raw(f.s).unwrap())
            .is_ok_and(|s| s == CaptureStatus::None),
        "the release joined nothing into the capture"
    );
    // The next call on the stream outside a capture finishes the release.
    let after = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    assert_eq!(cache.graph_bytes(), MIB, "only the second graph's now");
    cache.deallocate(after).unwrap();
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(second_graph);
    cache.release_capture(second, f.s).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
}

/// A range a capture handed out that a user keeps is written by every
/// replay, which no hook sees. Its graph released while the range's stream
/// captures another graph (the release waits for that capture's end), a
/// use on a third stream follows the last replay all the same (the
/// released pool says where it ran), and once the release is done too (the
/// range's stream, then after the replay, is its last write), though the
/// range's last recorded write was on that third stream, before the
/// replay.
#[test]
fn a_kept_range_used_elsewhere_follows_the_last_replay_across_a_deferred_release() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let third = f.device.stream(2).unwrap();
    let write_on = |stream: StreamId, block: &DeviceBlock| {
        cache
            .prepare_block_use(block.id(), stream, Access::Write)
            .unwrap();
        f.write(stream, block);
        cache
            .finish_block_use(block.id(), stream, Access::Write)
            .unwrap();
    };
    let first = f.begin(f.s);
    let kept = cache.allocate(MIB, f.s, AllocTag("kept")).unwrap();
    f.write(f.s, &kept);
    let graph = f.end(f.s);
    write_on(third, &kept);
    // The launch's Safety 2: the user's work on the range goes first.
    f.order(f.l, third);
    f.replay(graph.1, f.l, 1);

    let second = f.begin(f.s);
    f.destroy(graph);
    cache.release_capture(first, f.l).unwrap();
    write_on(third, &kept);
    let second_graph = f.end(f.s);
    // The next call on the range's stream outside a capture finishes the
    // release.
    let other = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    cache.deallocate(other).unwrap();
    write_on(third, &kept);
    cache.deallocate(kept).unwrap();
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(second_graph);
    cache.release_capture(second, f.s).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
}

/// A miss inside a capture goes to the stream-ordered resource as a graph
/// allocation, which the graph frees itself: never cached, so the graph can
/// be launched again and again.
#[test]
fn a_miss_in_a_capture_is_a_graph_allocation_of_the_resource_below() {
    let f = fixture();
    let config = CacheConfig::default().virtual_memory(false);
    let cache = CachingResource::with_config(SimResource::new(&f.device), config);
    let capture = f.begin(f.s);
    let tmp = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &tmp);
    cache.deallocate(tmp).unwrap();
    let graph = f.end(f.s);
    assert_eq!(
        cache.cached_blocks(),
        0,
        "a graph's allocation is not cached"
    );
    assert_eq!(cache.graph_bytes(), 0);
    assert_eq!(cache.inner().graph_bytes(), MIB, "counted below");
    f.replay(graph.1, f.s, 3);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    f.destroy(graph);
    cache.release_capture(capture, f.s).unwrap();
    cache.reap_pending().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0);
}

/// Budgets and stats over a graph: the budget counts the memory the graph
/// holds while it lives, and both are back to 0 once the graph is released
/// and its last replay ran. On the stream-ordered resource alone, a free in
/// the capture (a node of the graph) stays counted until then too.
#[test]
fn budget_and_stats_return_to_zero_after_the_release_and_the_last_replay() {
    let f = fixture();
    let budget = Budget::new(1 << 30);
    let stats = Stats::new();
    let cached = StatsResource::new(
        BudgetResource::new(CachingResource::new(SimResource::new(&f.device)), &budget),
        &stats,
    );
    let plain_budget = Budget::new(1 << 30);
    let plain_stats = Stats::new();
    let plain = StatsResource::new(
        BudgetResource::new(SimResource::new(&f.device), &plain_budget),
        &plain_stats,
    );
    let capture = f.begin(f.s);
    for r in [&cached as &dyn DeviceMemoryResource, &plain] {
        let tmp = r.allocate(MIB, f.s, AllocTag("tmp")).unwrap();
        f.write(f.s, &tmp);
        r.deallocate(tmp).unwrap();
    }
    let graph = f.end(f.s);
    for (budget, stats, r) in [
        (&budget, &stats, &cached as &dyn DeviceMemoryResource),
        (&plain_budget, &plain_stats, &plain),
    ] {
        // Held by the graph, counted by the budget; no user holds it.
        r.reap_pending().unwrap();
        r.release_idle().unwrap();
        assert!(budget.in_use() >= MIB, "{}", budget.in_use());
        assert_eq!(stats.snapshot().overall.current_bytes, 0);
        assert_eq!(stats.snapshot().overall.peak_bytes, MIB);
    }
    f.replay(graph.1, f.l, 2);
    f.destroy(graph);
    cached.release_capture(capture, f.l).unwrap();
    plain.release_capture(capture, f.l).unwrap();
    f.gpu.run_until_idle();
    for (budget, stats, r) in [
        (&budget, &stats, &cached as &dyn DeviceMemoryResource),
        (&plain_budget, &plain_stats, &plain),
    ] {
        r.release_idle().unwrap();
        r.reap_pending().unwrap();
        r.release_idle().unwrap();
        assert_eq!(r.bytes_outstanding(), 0);
        assert_eq!(budget.in_use(), 0);
        assert_eq!(stats.snapshot().overall.current_bytes, 0);
    }
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
}

/// A stream that joins a capture (it waits on an event recorded in it)
/// allocates for the same graph: its block stays the graph's on that stream
/// too, and the release orders that stream after the replays as well.
#[test]
fn a_stream_that_joins_the_capture_allocates_for_its_graph() {
    let f = fixture();
    let cache = CachingResource::new(SimResource::new(&f.device));
    let side = f.device.stream(2).unwrap();
    let warm = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    f.write(side, &warm);
    cache.deallocate(warm).unwrap();
    f.order(f.l, side);
    let capture = f.begin(f.s);
    f.order(side, f.s); // `side` joins the capture
    assert_eq!(
        f.gpu.capture_status(f.device.raw(side).unwrap()).unwrap(),
        CaptureStatus::Active(capture)
    );
    let tmp = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    f.write(side, &tmp);
    let ptr = tmp.ptr();
    cache.deallocate(tmp).unwrap();
    f.order(f.s, side); // joined back
    let graph = f.end(f.s);
    let next = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    assert_ne!(next.ptr(), ptr, "the graph's block on the joined stream");
    f.write(side, &next);
    f.replay(graph.1, f.l, 2);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    cache.deallocate(next).unwrap();
    f.destroy(graph);
    cache.release_capture(capture, f.l).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    let again = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    f.write(side, &again);
    let other = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    f.write(side, &other);
    // The two blocks freed before (the warm one, `next`) and the graph's.
    let third = cache.allocate(MIB, side, AllocTag::UNTAGGED).unwrap();
    let reused = [&again, &other, &third].iter().any(|b| b.ptr() == ptr);
    assert!(reused, "the released range is reused on the joined stream");
    f.write(side, &third);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
    cache.deallocate(again).unwrap();
    cache.deallocate(other).unwrap();
    cache.deallocate(third).unwrap();
}

/// Issue 19's scene on any backend, through the gpu seam (memsets as the
/// kernels): the cache keeps the graph's block from the next allocation,
/// and the budget of a plain stream-ordered resource counts the graph's
/// allocation until the release and the last replay.
fn a_graph_keeps_its_memory_on_any_backend<G: Gpu>(f: support::Fixture<G>) {
    let gpu = f.resource.gpu().clone();
    let s = f.stream(0);
    let raw = f.device.raw(s).unwrap();
    let cache = CachingResource::new(f.resource.clone());
    let budget = Budget::new(1 << 30);
    let plain = BudgetResource::new(f.resource.clone(), &budget);

    let warm = cache.allocate(MIB, s, AllocTag::UNTAGGED).unwrap();
    // SAFETY (each memset below): a stream of the fixture's pool, and a
    // block live in the cache until its free, queued after the fill.
    unsafe { gpu.memset_async(warm.ptr(), 1, MIB, raw) }.unwrap();
    cache.deallocate(warm).unwrap();
    // SAFETY: a stream of the fixture's pool.
    unsafe { gpu.begin_capture(raw, CaptureMode::Relaxed) }.unwrap();
    // SAFETY: as above.
    let status = unsafe { gpu.capture_status(raw) }.unwrap();
    let capture = status.id().expect("capturing");
    let tmp = cache.allocate(MIB, s, AllocTag::UNTAGGED).unwrap();
    // SAFETY: as above (captured).
    unsafe { gpu.memset_async(tmp.ptr(), 2, MIB, raw) }.unwrap();
    let graph_ptr = tmp.ptr();
    cache.deallocate(tmp).unwrap();
    let node = plain.allocate(MIB, s, AllocTag::UNTAGGED).unwrap();
    // SAFETY: as above (the graph's own allocation, live in the graph).
    unsafe { gpu.memset_async(node.ptr(), 4, MIB, raw) }.unwrap();
    plain.deallocate(node).unwrap();
    // SAFETY: the stream the capture was begun on.
    let graph = unsafe { Graph::end_capture(&gpu, raw) }.unwrap();
    let exec = graph.instantiate().unwrap();

    let next = cache.allocate(MIB, s, AllocTag::UNTAGGED).unwrap();
    assert_ne!(
        next.ptr(),
        graph_ptr,
        "the graph's block went to someone else"
    );
    // SAFETY: as above.
    unsafe { gpu.memset_async(next.ptr(), 3, MIB, raw) }.unwrap();
    for _ in 0..3 {
        // SAFETY: a stream of the pool; the graph's memory is the cache's
        // (kept for it) or its own.
        unsafe { exec.launch(raw) }.unwrap();
    }
    cache.deallocate(next).unwrap();
    plain.reap_pending().unwrap();
    assert!(budget.in_use() >= MIB, "the graph's memory is counted");
    drop(exec);
    drop(graph);
    cache.release_capture(capture, s).unwrap();
    plain.release_capture(capture, s).unwrap();
    assert_eq!(cache.graph_bytes(), 0);
    // SAFETY: a stream of the pool.
    unsafe { gpu.stream_synchronize(raw) }.unwrap();
    cache.release_idle().unwrap();
    plain.reap_pending().unwrap();
    assert_eq!(cache.bytes_outstanding(), 0);
    assert_eq!(budget.in_use(), 0);
    if let Some(sim) = &f.sim {
        assert!(sim.races().is_empty(), "{:?}", sim.races());
    }
}

#[test]
fn a_graph_keeps_its_memory_on_any_backend_sim() {
    a_graph_keeps_its_memory_on_any_backend(support::sim(2));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_graph_keeps_its_memory_on_any_backend_cuda() {
    a_graph_keeps_its_memory_on_any_backend(support::cuda(2));
}

/// A debug guard over the cache does not quarantine a free made in a
/// capture (it would give the block back later, outside the capture, while
/// replays still use it): the cache below keeps it for the graph. Bad
/// input to `release_capture` is refused, changing nothing.
#[test]
fn a_guard_passes_frees_in_a_capture_to_the_graph_and_bad_releases_change_nothing() {
    let f = fixture();
    let guard = DebugGuardResource::new(
        CachingResource::new(SimResource::new(&f.device)),
        GuardConfig::new().max_blocks(8),
    );
    let before = guard.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    guard.deallocate(before).unwrap();
    assert_eq!(
        guard.quarantined_bytes(),
        MIB,
        "quarantined outside a capture"
    );
    let capture = f.begin(f.s);
    let tmp = guard.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
    f.write(f.s, &tmp);
    guard.deallocate(tmp).unwrap();
    assert_eq!(
        guard.quarantined_bytes(),
        MIB,
        "not quarantined in a capture"
    );
    let graph = f.end(f.s);
    assert_eq!(guard.inner().graph_bytes(), MIB);

    let other_device = SimGpu::builder().ordinal(1).build();
    let foreign = Device::simulated(&other_device, 1).stream(0).unwrap();
    let e = guard.release_capture(capture, foreign).unwrap_err();
    assert!(matches!(e, ResourceError::WrongDevice { .. }), "{e}");
    let unknown = Device::simulated(&f.gpu, 8).stream(7).unwrap();
    assert!(guard.release_capture(capture, unknown).is_err());
    assert_eq!(guard.inner().graph_bytes(), MIB, "nothing changed");

    f.replay(graph.1, f.s, 2);
    f.destroy(graph);
    guard.release_capture(capture, f.s).unwrap();
    assert_eq!(guard.inner().graph_bytes(), 0);
    f.gpu.run_until_idle();
    assert!(f.gpu.races().is_empty(), "{:?}", f.gpu.races());
}

/// What capture awareness costs: one capture query per allocation and one
/// per free the cache serves; none with it turned off (for programs that
/// never capture).
#[test]
fn the_cache_asks_once_per_call_unless_told_nothing_is_captured() {
    for (aware, per_pair) in [(true, 2), (false, 0)] {
        for vm in [true, false] {
            let f = fixture();
            let config = CacheConfig::default()
                .virtual_memory(vm)
                .capture_aware(aware);
            let cache = CachingResource::with_config(SimResource::new(&f.device), config);
            let warm = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
            cache.deallocate(warm).unwrap();
            let queries = f.gpu.call_count(DriverCall::StreamGetCaptureInfo);
            for _ in 0..10 {
                let b = cache.allocate(MIB, f.s, AllocTag::UNTAGGED).unwrap();
                cache.deallocate(b).unwrap();
            }
            assert_eq!(
                f.gpu.call_count(DriverCall::StreamGetCaptureInfo) - queries,
                10 * per_pair,
                "aware {aware}, vm {vm}"
            );
        }
    }
}

mod random;
mod streams;
