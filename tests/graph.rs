//! The graph API on the simulated device: capture a step with temporaries,
//! replay it, await each replay, drop it; failures leave no stream
//! capturing.

mod common;

use std::sync::Arc;

use common::drive;
use streamalloc::AsyncResource;
use streamalloc::DriverCall;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::gpu::{CaptureMode, CaptureStatus, capture_code};
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceError, SimResource, StreamId};
use streamalloc::{Budget, BudgetResource};
use streamalloc::{CacheConfig, CachingResource};

const TAG: AllocTag = AllocTag("graph");
const N: usize = 4096;

struct Scene {
    gpu: Arc<SimGpu>,
    res: AsyncResource<SimResource>,
    device: Device<SimGpu>,
}

fn scene() -> Scene {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 3);
    let res = AsyncResource::on(&device).expect("async resource");
    Scene { gpu, res, device }
}

impl Scene {
    fn s(&self, i: usize) -> StreamId {
        self.device.stream(i).unwrap()
    }

    fn status(&self, i: usize) -> CaptureStatus {
        let raw = self.device.raw(self.s(i)).unwrap();
        self.gpu.capture_status(raw).unwrap()
    }
}

#[test]
fn a_step_with_temporaries_replays_with_memory_flat_and_no_race() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let input = sc.res.try_allocate_buffer::<f32>(N, s, TAG).unwrap();
    let output = sc.res.try_allocate_buffer::<f32>(N, s, TAG).unwrap();
    let held_before_capture = sc.gpu.held_bytes();
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            assert_eq!(capture.stream(), s);
            let raw = capture.raw_stream();
            let mut a = sc.res.try_allocate_buffer::<f32>(N, s, TAG)?;
            let mut b = sc.res.try_allocate_buffer::<f32>(N, s, TAG)?;
            a.fill_bytes_on(s, 0)?;
            sc.gpu.launch_kernel(
                raw,
                &[MemAccess::read(input.block()), MemAccess::write(a.block())],
            )?;
            b.copy_from_on(s, &a)?;
            sc.gpu.launch_kernel(
                raw,
                &[MemAccess::read(b.block()), MemAccess::write(output.block())],
            )?;
            assert!(matches!(capture.status()?, CaptureStatus::Active(id) if id == capture.id()));
            Ok::<_, ResourceError>(())
        })
        .unwrap();
    assert_eq!(sc.status(0), CaptureStatus::None);
    let held_graph = sc.gpu.held_bytes();
    assert!(
        held_graph > held_before_capture,
        "the graph holds its temporaries"
    );
    for i in 0..3 {
        // The last replay runs on `other`: the release goes behind it.
        let stream = if i == 0 { s } else { other };
        // SAFETY: `input` and `output` outlive every replay (awaited here).
        let mut done = unsafe { graph.launch(stream) }.unwrap();
        drive(&sc.gpu, &mut done).unwrap();
        assert_eq!(sc.gpu.held_bytes(), held_graph, "memory held stays flat");
    }
    assert_eq!(graph.launches(), 3);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    // The temporaries are the graph's while it lives: counted, as CUDA
    // keeps them reserved for it.
    assert_eq!(sc.res.inner().graph_bytes(), 2 * N * 4);
    assert_eq!(sc.res.bytes_outstanding(), 4 * N * 4);
    drop(graph);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.inner().graph_bytes(), 0);
    assert_eq!(
        sc.res.bytes_outstanding(),
        2 * N * 4,
        "once the graph is dropped, only input and output are outstanding"
    );
    sc.gpu.run_until_idle();
    assert_eq!(
        sc.gpu.held_bytes(),
        held_before_capture,
        "the graph's memory came back"
    );
    drop((input, output));
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    // The replay on stream 1 read `input`, written on stream 0 before the
    // capture: ordered by the completion awaited between replays.
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

#[test]
fn launching_on_a_capturing_stream_is_refused() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| Ok::<_, ResourceError>(()))
        .unwrap();
    let capture = sc.res.begin_capture(other, CaptureMode::Relaxed).unwrap();
    let e = unsafe { graph.launch(other) }.unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, .. } if stream == other),
        "{e}"
    );
    assert_eq!(graph.launches(), 0);
    drop(capture.end().unwrap());
}

#[test]
fn a_failing_or_panicking_capture_leaves_no_stream_capturing_and_no_memory_held() {
    let sc = scene();
    let s = sc.s(0);
    let held = sc.gpu.held_bytes();
    let e = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| {
            let _tmp = sc.res.try_allocate(N, s, TAG)?;
            Err::<(), _>(ResourceError::Shutdown)
        })
        .unwrap_err();
    assert_eq!(e, ResourceError::Shutdown);
    assert_eq!(sc.status(0), CaptureStatus::None);

    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = sc
            .res
            .capture_graph(s, CaptureMode::Relaxed, |_| -> Result<(), ResourceError> {
                panic!("inside the capture")
            });
    }));
    assert!(panicked.is_err());
    assert_eq!(sc.status(0), CaptureStatus::None);
    sc.gpu.run_until_idle();
    assert_eq!(
        sc.gpu.held_bytes(),
        held,
        "the abandoned captures' memory came back"
    );
    // The stream works again.
    let mut done = sc.res.completion(s).unwrap();
    drive(&sc.gpu, &mut done).unwrap();
}

#[test]
fn beginning_a_capture_on_a_capturing_or_unknown_stream_is_refused() {
    let sc = scene();
    let s = sc.s(0);
    let capture = sc.res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    match sc.res.begin_capture(s, CaptureMode::Relaxed) {
        Err(ResourceError::Driver { code, .. }) => assert_eq!(code, capture_code::ILLEGAL_STATE),
        other => panic!("expected ILLEGAL_STATE, got {other:?}"),
    }
    // The first capture is untouched.
    assert!(matches!(
        capture.status().unwrap(),
        CaptureStatus::Active(_)
    ));
    drop(capture.end().unwrap());
    let foreign = StreamId::new(0, 99);
    assert!(matches!(
        sc.res.begin_capture(foreign, CaptureMode::Relaxed),
        Err(ResourceError::ForeignStream { .. })
    ));
}

#[test]
fn an_invalidated_capture_fails_at_its_end() {
    let sc = scene();
    let s = sc.s(0);
    let capture = sc.res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    // The user's own illegal call.
    let e = sc.gpu.stream_synchronize(capture.raw_stream()).unwrap_err();
    assert_eq!(e.code(), capture_code::UNSUPPORTED);
    assert_eq!(capture.status().unwrap(), CaptureStatus::Invalidated);
    match capture.end() {
        Err(ResourceError::Driver { code, .. }) => assert_eq!(code, capture_code::INVALIDATED),
        other => panic!("expected the invalidation, got {other:?}"),
    }
    assert_eq!(sc.status(0), CaptureStatus::None);
}

#[test]
fn a_replay_touching_a_buffer_freed_since_is_reported() {
    // What `launch`'s safety contract forbids, caught by the simulator.
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let input = sc.res.try_allocate(N, s, TAG).unwrap();
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |c| {
            sc.gpu
                .launch_kernel(c.raw_stream(), &[MemAccess::write(&input)])
                .map_err(ResourceError::from)
        })
        .unwrap();
    let ptr = input.ptr();
    let mut freed = sc.res.deallocate(input).unwrap();
    drive(&sc.gpu, &mut freed).unwrap();
    let reused = sc.res.try_allocate(N, other, TAG).unwrap();
    assert_eq!(reused.ptr(), ptr);
    let mut done = unsafe { graph.launch(s) }.unwrap();
    drive(&sc.gpu, &mut done).unwrap();
    let races = sc.gpu.take_races();
    assert!(
        races
            .iter()
            .any(|r| r.addr == ptr && r.kind == RaceKind::Unordered),
        "{races:?}"
    );
    drop(graph);
    sc.res.deallocate(reused).unwrap();
}

/// When the user lets go of a buffer a capture allocated and did not free.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Drop {
    /// Inside the capture (on another thread): the graph frees it.
    DuringCapture,
    /// After the capture, before the graph ever ran.
    BeforeFirstReplay,
    /// After the first of two replays (the bug of issue 30).
    BetweenReplays,
    /// After both replays and the graph are gone.
    AfterGraph,
    /// After the graph is gone, which never ran.
    AfterUnlaunchedGraph,
}

/// Drops `value` on another thread.
fn drop_elsewhere<T: Send>(value: T) {
    std::thread::scope(|scope| {
        scope.spawn(move || drop(value));
    });
}

/// A stack under test: its graph tally, and how to give back what it
/// caches (so that the device can be compared with the books).
trait Stack: DeviceMemoryResource + 'static {
    fn graph_bytes(&self) -> usize;
    fn settle(&self) {}
}

impl Stack for SimResource {
    fn graph_bytes(&self) -> usize {
        SimResource::graph_bytes(self)
    }
}

impl Stack for CachingResource<SimResource> {
    fn graph_bytes(&self) -> usize {
        CachingResource::graph_bytes(self) + self.inner().graph_bytes()
    }
    fn settle(&self) {
        self.trim().unwrap();
        assert_eq!(self.leased_bytes(), 0);
    }
}

impl Stack for BudgetResource<CachingResource<SimResource>> {
    fn graph_bytes(&self) -> usize {
        Stack::graph_bytes(self.inner())
    }
    fn settle(&self) {
        self.inner().settle();
    }
}

/// [`kept_case`] on the plain resource, on both kinds of cache, and on a
/// budget over a cache (whose count must come back to what is held).
fn a_buffer_the_capture_allocated_is_freed_once(when: Drop) {
    let sc = scene();
    kept_case(&sc.gpu, &sc.device, &sc.res, when, true);
    for vm in [false, true] {
        let sc = scene();
        let config = CacheConfig::default().virtual_memory(vm);
        let cache = CachingResource::with_config(SimResource::new(&sc.device), config);
        // SAFETY: the stack's bottom was made on `sc.device`, and the cache
        // allocates and resolves streams only through it.
        let res = unsafe { AsyncResource::with_device(cache, &sc.device) }.unwrap();
        // Under the arena (`vm`) the block is a range of the cache's mapped
        // memory, which the graph keeps across its replays; else the
        // resource below allocates it in the capture: a graph memory node.
        kept_case(&sc.gpu, &sc.device, &res, when, !vm);
    }
    let sc = scene();
    let budget = Budget::new(1 << 30);
    let cache = CachingResource::with_config(
        SimResource::new(&sc.device),
        CacheConfig::default().virtual_memory(false),
    );
    let stack = BudgetResource::new(cache, &budget);
    // SAFETY: as above.
    let res = unsafe { AsyncResource::with_device(stack, &sc.device) }.unwrap();
    kept_case(&sc.gpu, &sc.device, &res, when, true);
    assert_eq!(
        budget.in_use(),
        res.bytes_outstanding(),
        "{when:?}: the budget"
    );
}

/// A buffer allocated on the capturing stream by another thread (not the
/// capturing closure's own call), kept past the capture and dropped at
/// `when` on a third thread: the graph's memory comes back to the device
/// exactly once, the books agree with the device, and nothing races.
/// `node`: the block is a graph memory node (each replay makes it again).
fn kept_case<R: Stack>(
    gpu: &Arc<SimGpu>,
    device: &Device<SimGpu>,
    res: &AsyncResource<R>,
    when: Drop,
    node: bool,
) {
    const BYTES: usize = 64 << 10;
    let s = device.stream(0).unwrap();
    let other = device.stream(1).unwrap();
    let third = device.stream(2).unwrap();
    let held_before = gpu.held_bytes();
    let (kept, graph) = res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let kept = std::thread::scope(|scope| {
                scope
                    .spawn(|| res.try_allocate_buffer::<u8>(BYTES, s, TAG))
                    .join()
                    .unwrap()
            })?;
            gpu.launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
            if when == Drop::DuringCapture {
                drop_elsewhere(kept);
                return Ok::<_, ResourceError>(None);
            }
            Ok(Some(kept))
        })
        .unwrap();
    let mut kept = kept;
    if when == Drop::BeforeFirstReplay {
        drop_elsewhere(kept.take());
    }
    let launches = match when {
        Drop::AfterUnlaunchedGraph => 0,
        // A kept graph memory node holds the last replay's output: a second
        // launch is refused while the user holds it (below).
        Drop::AfterGraph if node => 1,
        _ => 2,
    };
    for i in 0..launches {
        // SAFETY: the graph touches only memory it allocated.
        let launched = unsafe { graph.launch(if i == 0 { s } else { other }) };
        let mut done = launched.unwrap_or_else(|e| panic!("{when:?}: launch {i}: {e}"));
        drive(gpu, &mut done).unwrap();
        if when == Drop::BetweenReplays && i == 0 {
            // Read on a third stream first: the graph's free of this
            // instance, before the next launch, must come after that read.
            let mut copy = res.try_allocate_buffer::<u8>(BYTES, third, TAG).unwrap();
            copy.copy_from_on(third, kept.as_ref().unwrap()).unwrap();
            if !node {
                // The next replay writes the same range: ordering the read
                // before the launch is the user's (`launch`'s Safety 2). A
                // node is made again by the replay, after the crate's free,
                // which follows the read by itself.
                let mut read = res.completion(third).unwrap();
                drive(gpu, &mut read).unwrap();
            }
            drop_elsewhere(kept.take());
            drop(copy);
        }
    }
    if when == Drop::AfterGraph && node {
        // SAFETY: as above.
        match unsafe { graph.launch(other) } {
            Err(ResourceError::Driver { code, call, .. }) => {
                assert_eq!((call, code), (DriverCall::GraphLaunch, 1))
            }
            other => panic!("a launch while the output is held: {other:?}"),
        }
        assert_eq!(graph.launches(), 1, "the refused launch changed nothing");
    }
    drop_elsewhere(graph);
    drop_elsewhere(kept);
    let mut reap = res.reap_pending();
    drive(gpu, &mut reap).unwrap();
    gpu.run_until_idle();
    res.inner().settle();
    let mut reap = res.reap_pending();
    drive(gpu, &mut reap).unwrap();
    gpu.run_until_idle();
    let stack = std::any::type_name::<R>();
    assert_eq!(res.inner().graph_bytes(), 0, "{when:?} {stack}");
    assert_eq!(
        gpu.held_bytes() - held_before,
        res.bytes_outstanding(),
        "{when:?} {stack}: the device holds what the books say"
    );
    assert!(
        gpu.races().is_empty(),
        "{when:?} {stack}: {:?}",
        gpu.races()
    );
}

#[test]
fn a_kept_buffer_dropped_during_the_capture_on_another_thread_is_freed_by_the_graph() {
    a_buffer_the_capture_allocated_is_freed_once(Drop::DuringCapture);
}

#[test]
fn a_kept_buffer_dropped_before_the_first_replay_is_freed_once() {
    a_buffer_the_capture_allocated_is_freed_once(Drop::BeforeFirstReplay);
}

#[test]
fn a_kept_buffer_dropped_between_replays_is_freed_once() {
    a_buffer_the_capture_allocated_is_freed_once(Drop::BetweenReplays);
}

#[test]
fn a_kept_buffer_dropped_after_the_graph_is_freed_once() {
    a_buffer_the_capture_allocated_is_freed_once(Drop::AfterGraph);
}

#[test]
fn a_kept_buffer_dropped_after_a_graph_that_never_ran_is_freed_once() {
    a_buffer_the_capture_allocated_is_freed_once(Drop::AfterUnlaunchedGraph);
}

#[test]
fn a_kept_buffer_freed_inside_another_capture_is_refused_and_stays_live() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| sc.res.try_allocate(N, s, TAG))
        .unwrap();
    let outstanding = sc.res.bytes_outstanding();
    let second = sc.res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = sc.res.inner().deallocate(kept.clone()).unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, capture: Some(c) } if stream == s && c == second.id()),
        "{e}"
    );
    assert_eq!(sc.res.bytes_outstanding(), outstanding, "nothing changed");
    assert!(matches!(second.status().unwrap(), CaptureStatus::Active(_)));
    drop(second.end().unwrap());
    // SAFETY: the graph touches only memory it allocated.
    let mut done = unsafe { graph.launch(other) }.unwrap();
    drive(&sc.gpu, &mut done).unwrap();
    sc.res.inner().deallocate(kept).unwrap();
    drop(graph);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A use recorded through the crate inside a capture (the graph's, at each
/// replay) left a captured event as the buffer's last write: every later
/// use on another stream failed with `CUDA_ERROR_CAPTURED_EVENT`.
#[test]
fn a_buffer_written_in_a_capture_is_usable_on_another_stream_after_it() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let mut buf = sc.res.try_allocate_buffer::<u8>(N, s, TAG).unwrap();
    let mut out = sc.res.try_allocate_buffer::<u8>(N, s, TAG).unwrap();
    buf.fill_bytes_on(s, 0).unwrap();
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| {
            buf.fill_bytes_on(s, 1)?;
            out.copy_from_on(s, &buf)?;
            Ok::<_, ResourceError>(())
        })
        .unwrap();
    // SAFETY: `buf` and `out` outlive the replay, awaited below.
    let mut done = unsafe { graph.launch(s) }.unwrap();
    drive(&sc.gpu, &mut done).unwrap();
    buf.fill_bytes_on(other, 2).unwrap();
    out.fill_bytes_on(other, 2).unwrap();
    drop(graph);
    drop((buf, out));
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// The first use of a block on another stream is ordered after its
/// allocation by an event recorded on the block's stream: recorded while
/// that stream is capturing, it was captured, and the wait pulled the other
/// stream into the capture (whose end then failed, unjoined).
#[test]
fn a_first_use_elsewhere_while_the_blocks_stream_captures_is_refused() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let mut buf = sc.res.try_allocate_buffer::<u8>(N, s, TAG).unwrap();
    let capture = sc.res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = buf.fill_bytes_on(other, 0).unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, .. } if stream == s),
        "{e}"
    );
    assert_eq!(
        sc.status(1),
        CaptureStatus::None,
        "the other stream stays out"
    );
    drop(capture.end().unwrap());
    buf.fill_bytes_on(other, 0).unwrap();
    drop(buf);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A driver failure freeing the last replay's instance before a launch (or
/// ordering that free) refuses the launch; the next launch frees what is
/// left, and the books still agree with the device.
#[test]
fn a_failed_instance_free_before_a_launch_is_finished_by_the_next_one() {
    for (call, on) in [(DriverCall::FreeAsync, 0), (DriverCall::StreamWaitEvent, 1)] {
        let sc = scene();
        let s = sc.s(0);
        let held_before = sc.gpu.held_bytes();
        let (kept, graph) = sc
            .res
            .capture_graph(s, CaptureMode::Relaxed, |capture| {
                let kept = sc.res.try_allocate_buffer::<u8>(N, s, TAG)?;
                sc.gpu
                    .launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
                Ok::<_, ResourceError>(kept)
            })
            .unwrap();
        // SAFETY: the graph touches only memory it allocated.
        let mut done = unsafe { graph.launch(s) }.unwrap();
        drive(&sc.gpu, &mut done).unwrap();
        drop(kept);
        // Launched on another stream than the last replay's (`on`), the
        // free first waits for that stream: an event wait that may fail.
        let next = sc.s(on);
        sc.gpu.fail_nth(call, 1);
        let e = unsafe { graph.launch(next) }.unwrap_err();
        assert!(
            matches!(e, ResourceError::Driver { call: c, .. } if c == call),
            "{call:?}: {e}"
        );
        assert_eq!(graph.launches(), 1, "{call:?}: refused");
        let mut done = unsafe { graph.launch(next) }.unwrap();
        drive(&sc.gpu, &mut done).unwrap();
        drop(graph);
        let mut reap = sc.res.reap_pending();
        drive(&sc.gpu, &mut reap).unwrap();
        sc.gpu.run_until_idle();
        assert_eq!(sc.res.bytes_outstanding(), 0, "{call:?}");
        assert_eq!(sc.gpu.held_bytes(), held_before, "{call:?}");
        assert!(sc.gpu.races().is_empty(), "{call:?}: {:?}", sc.gpu.races());
    }
}

/// A capture abandoned (dropped unended) while a block it allocated is
/// held: the graph never exists, and the block's later drop frees what the
/// device holds for it exactly once (nothing for graph memory, the range
/// for a cache's arena).
#[test]
fn a_kept_buffer_of_an_abandoned_capture_is_freed_once() {
    fn case<R: Stack>(gpu: &Arc<SimGpu>, device: &Device<SimGpu>, res: &AsyncResource<R>) {
        let s = device.stream(0).unwrap();
        let held_before = gpu.held_bytes();
        let capture = res.begin_capture(s, CaptureMode::Relaxed).unwrap();
        let kept = res.try_allocate_buffer::<u8>(N, s, TAG).unwrap();
        gpu.launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])
            .unwrap();
        drop(capture);
        drop_elsewhere(kept);
        let mut reap = res.reap_pending();
        drive(gpu, &mut reap).unwrap();
        gpu.run_until_idle();
        res.inner().settle();
        let stack = std::any::type_name::<R>();
        assert_eq!(res.inner().graph_bytes(), 0, "{stack}");
        assert_eq!(
            gpu.held_bytes() - held_before,
            res.bytes_outstanding(),
            "{stack}: the device holds what the books say"
        );
        assert!(gpu.races().is_empty(), "{stack}: {:?}", gpu.races());
    }
    let sc = scene();
    case(&sc.gpu, &sc.device, &sc.res);
    for vm in [false, true] {
        let sc = scene();
        let config = CacheConfig::default().virtual_memory(vm);
        let cache = CachingResource::with_config(SimResource::new(&sc.device), config);
        // SAFETY: as in `a_buffer_the_capture_allocated_is_freed_once`.
        let res = unsafe { AsyncResource::with_device(cache, &sc.device) }.unwrap();
        case(&sc.gpu, &sc.device, &res);
    }
}

/// A buffer allocated before the capture and dropped on another thread
/// while its stream captures an unrelated step: its free was captured into
/// the graph, which freed it at every replay, the second time the memory of
/// whatever had been allocated there since. The graph adopts it instead and
/// frees it once, at its release.
#[test]
fn a_buffer_from_before_the_capture_dropped_during_it_is_freed_once() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let held_before = sc.gpu.held_bytes();
    let mut old = sc.res.try_allocate_buffer::<u8>(N, s, TAG).unwrap();
    old.fill_bytes_on(s, 1).unwrap();
    // A read on another stream: the free must come after it too.
    let mut copy = sc.res.try_allocate_buffer::<u8>(N, other, TAG).unwrap();
    copy.copy_from_on(other, &old).unwrap();
    let old_ptr = old.block().ptr();
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            drop_elsewhere(old);
            assert!(matches!(capture.status()?, CaptureStatus::Active(_)));
            Ok::<_, ResourceError>(())
        })
        .unwrap();
    assert_eq!(
        sc.res.inner().graph_bytes(),
        N,
        "the graph's until its release"
    );
    for i in 0..3 {
        // SAFETY: the graph touches no memory.
        let mut done = unsafe { graph.launch(if i == 1 { other } else { s }) }.unwrap();
        drive(&sc.gpu, &mut done).unwrap();
        let b = sc.res.try_allocate_buffer::<u8>(N, other, TAG).unwrap();
        assert_ne!(
            b.block().ptr(),
            old_ptr,
            "handed out while the graph holds it"
        );
        drop(b);
    }
    drop(graph);
    drop(copy);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert_eq!(sc.res.inner().graph_bytes(), 0);
    assert_eq!(sc.gpu.held_bytes(), held_before);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// The release of a graph's memory goes behind its last launch only, which
/// CUDA orders after every earlier launch of the executable, whatever its
/// stream: replays queued on two streams and never awaited, then the graph
/// dropped and its memory reused, race with nothing (the simulator used to
/// report the first replay against the reuse).
#[test]
fn a_graph_dropped_after_unawaited_replays_on_two_streams_releases_behind_both() {
    let sc = scene();
    let (s, other, third) = (sc.s(0), sc.s(1), sc.s(2));
    let ((), graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let tmp = sc.res.try_allocate(N, s, TAG)?;
            sc.gpu
                .launch_kernel(capture.raw_stream(), &[MemAccess::write(&tmp)])?;
            drop(sc.res.deallocate(tmp)?);
            Ok::<_, ResourceError>(())
        })
        .unwrap();
    for stream in [s, other] {
        // SAFETY: the graph touches only memory it allocated.
        drop(unsafe { graph.launch(stream) }.unwrap());
    }
    drop(graph);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    for _ in 0..2 {
        let mut b = sc.res.try_allocate_buffer::<u8>(N, third, TAG).unwrap();
        b.fill_bytes_on(third, 1).unwrap();
    }
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A buffer a capture allocated and kept is a graph memory node: there is
/// no memory at its address until the graph's first replay makes it. A
/// safe use of it before that (a fill on its stream, a read on another)
/// is refused with `GraphMemoryUnbacked` and queues nothing; after the
/// first replay the same uses run, and nothing races.
#[test]
fn a_kept_graph_buffer_is_refused_until_a_replay_made_its_memory() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| {
            sc.res.try_allocate_buffer::<u8>(N, s, TAG)
        })
        .unwrap();
    let mut kept = kept;
    let queued = sc.gpu.call_count(DriverCall::MemsetAsync);
    let kept_id = kept.id();
    let unbacked = |r: streamalloc::ResourceResult<()>, what: &str| match r {
        Err(ResourceError::GraphMemoryUnbacked { block }) => assert_eq!(block, kept_id, "{what}"),
        other => panic!("{what} before the first replay: {other:?}"),
    };
    unbacked(kept.fill_bytes_on(s, 1), "a fill on its stream");
    let mut copy = sc.res.try_allocate_buffer::<u8>(N, other, TAG).unwrap();
    unbacked(copy.copy_from_on(other, &kept), "a read on another stream");
    assert_eq!(
        sc.gpu.call_count(DriverCall::MemsetAsync),
        queued,
        "a fill was queued"
    );
    // SAFETY: the graph touches only memory it allocated.
    let mut done = unsafe { graph.launch(s) }.unwrap();
    drive(&sc.gpu, &mut done).unwrap();
    kept.fill_bytes_on(s, 1).unwrap();
    copy.copy_from_on(other, &kept).unwrap();
    drop((copy, kept, graph));
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    sc.gpu.run_until_idle();
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A block the capture on stream 0 kept, a replay on stream 1 (writing
/// it) not awaited, the graph dropped, then the block: its free (an
/// ordinary one, the graph gone) frees the instance that replay made, and
/// must follow it. It used to be queued on stream 0 alone, racing the
/// replay's write.
#[test]
fn a_kept_block_freed_after_its_graph_follows_the_last_replay() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let kept = sc.res.try_allocate_buffer::<u8>(N, s, TAG)?;
            sc.gpu
                .launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
            Ok::<_, ResourceError>(kept)
        })
        .unwrap();
    // SAFETY: the graph touches only the block its capture allocated.
    let replay = unsafe { graph.launch(other) }.unwrap();
    drop(replay);
    drop(graph);
    drop(kept);
    sc.gpu.run_until_idle();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
    assert_eq!(sc.res.bytes_outstanding(), 0);
}

/// The same free while the stream of that last replay captures another
/// graph: ordering after it would record an event in that capture (and
/// join the block's stream to it, so that the capture could not end). The
/// free is refused instead, the block stays live, and the capture ends
/// and replays; once it is over the free goes through.
#[test]
fn a_kept_block_freed_while_the_last_replays_stream_captures_is_refused() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |_| sc.res.try_allocate(N, s, TAG))
        .unwrap();
    // SAFETY: the graph touches nothing.
    let mut replay = unsafe { graph.launch(other) }.unwrap();
    drive(&sc.gpu, &mut replay).unwrap();
    drop(graph);
    let outstanding = sc.res.bytes_outstanding();
    let second = sc.res.begin_capture(other, CaptureMode::Relaxed).unwrap();
    let e = sc.res.inner().deallocate(kept.clone()).unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, capture: Some(c) } if stream == other && c == second.id()),
        "{e}"
    );
    assert_eq!(sc.res.bytes_outstanding(), outstanding, "nothing changed");
    let second = second.end().expect("the capture ends: nothing joined it");
    drop(second);
    sc.res.inner().deallocate(kept).unwrap();
    sc.gpu.run_until_idle();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A block the capture on stream 0 kept and wrote, a replay on stream 1
/// not awaited, then a safe use of the block on stream 0: the use must
/// follow the replay that writes the block. Nothing ordered it (the
/// replay records no use of the block), and the two writes raced.
#[test]
fn a_kept_block_used_after_an_unawaited_replay_follows_it() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (mut kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let kept = sc.res.try_allocate_buffer::<u8>(N, s, TAG)?;
            sc.gpu
                .launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
            Ok::<_, ResourceError>(kept)
        })
        .unwrap();
    // SAFETY: the graph touches only the block its capture allocated.
    let replay = unsafe { graph.launch(other) }.unwrap();
    drop(replay);
    kept.fill_bytes_on(s, 7).unwrap();
    sc.gpu.run_until_idle();
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
    drop(kept);
    drop(graph);
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// The point of a replay's completion cannot be recorded (the event record
/// after the launch fails): the replay is queued all the same, so the
/// launch must not say `Err` (the caller would take the replay as not
/// launched). It used to. The launch succeeds, counts the replay, and its
/// future records the point when polled.
#[test]
fn a_launch_whose_completion_record_fails_still_returns_its_replay() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let kept = sc.res.try_allocate_buffer::<u8>(N, s, TAG)?;
            sc.gpu
                .launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
            Ok::<_, ResourceError>(kept)
        })
        .unwrap();
    sc.gpu.fail_nth(DriverCall::EventRecord, 1);
    // SAFETY: the graph touches only the block its capture allocated.
    let mut replay = unsafe { graph.launch(other) }.expect("the replay is queued");
    assert_eq!(graph.launches(), 1);
    drive(&sc.gpu, &mut replay).expect("the point is recorded when polled");
    // The kept block holds the replay's output: usable on any stream.
    let mut kept = kept;
    kept.fill_bytes_on(s, 1).unwrap();
    drop(kept);
    drop(graph);
    sc.gpu.run_until_idle();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A buffer holding a block an earlier capture kept, dropped (on another
/// thread) while its stream captures again: its free would be a node of
/// the second graph, and is refused. A drop cannot return that: the block
/// used to leak for good. The free is deferred to the end of the capture,
/// and made once.
#[test]
fn a_kept_buffer_dropped_during_another_capture_is_freed_when_it_ends() {
    let sc = scene();
    let (s, other) = (sc.s(0), sc.s(1));
    let (kept, graph) = sc
        .res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let kept = sc.res.try_allocate_buffer::<u8>(N, s, TAG)?;
            sc.gpu
                .launch_kernel(capture.raw_stream(), &[MemAccess::write(kept.block())])?;
            Ok::<_, ResourceError>(kept)
        })
        .unwrap();
    // SAFETY: the graph touches only the block its capture allocated.
    let mut replay = unsafe { graph.launch(other) }.unwrap();
    drive(&sc.gpu, &mut replay).unwrap();
    let second = sc.res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    drop_elsewhere(kept);
    drop(second.end().expect("nothing was captured into it"));
    // The free went to the graph, which frees the replay's instance
    // before its next launch: the launch is not refused.
    // SAFETY: as above.
    let mut replay = unsafe { graph.launch(other) }.expect("the kept block was let go");
    drive(&sc.gpu, &mut replay).unwrap();
    drop(graph);
    sc.gpu.run_until_idle();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert_eq!(sc.gpu.held_bytes(), 0, "every instance freed");
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}
