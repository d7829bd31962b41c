//! The simulated device's model of stream capture: recording instead of
//! running, the illegal calls and the invalidation they cause, joins, graph
//! memory, and replays seen by the race detector.

use std::sync::Arc;

use streamalloc::Access;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::gpu::{CaptureMode, CaptureStatus, Gpu, GpuError, Graph, capture_code};

fn manual() -> Arc<SimGpu> {
    SimGpu::builder().manual().build()
}

fn code(e: &GpuError) -> i32 {
    e.code()
}

fn write(ptr: u64) -> MemAccess {
    MemAccess {
        ptr,
        access: Access::Write,
    }
}

#[test]
fn captured_work_is_recorded_not_run_and_replays_run_it() {
    let gpu = manual();
    let s = gpu.create_stream();
    let held_before = gpu.held_bytes();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    assert!(
        matches!(gpu.capture_status(s).unwrap(), CaptureStatus::Active(_)),
        "{:?}",
        gpu.capture_status(s)
    );
    let tmp = gpu.alloc_async(4096, s).unwrap();
    gpu.memset_async(tmp, 0, 4096, s).unwrap();
    gpu.launch_kernel(s, &[write(tmp)]).unwrap();
    gpu.free_async(tmp, s).unwrap();
    assert!(gpu.is_idle(), "captured work must not be queued");
    let raw = gpu.end_capture(s).unwrap();
    assert_eq!(gpu.capture_status(s).unwrap(), CaptureStatus::None);
    assert!(gpu.held_bytes() > held_before, "the graph holds its memory");

    let exec = gpu.graph_instantiate(raw).unwrap();
    for _ in 0..3 {
        gpu.graph_launch(exec, s).unwrap();
    }
    assert!(!gpu.is_idle(), "a replay queues the recorded work");
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());

    // Graph and executable both gone: the memory comes back.
    gpu.graph_destroy(raw).unwrap();
    assert!(
        gpu.held_bytes() > held_before,
        "the executable still holds it"
    );
    gpu.graph_exec_destroy(exec).unwrap();
    gpu.run_until_idle();
    assert_eq!(gpu.held_bytes(), held_before);
    // Handles are refused once destroyed.
    assert_eq!(code(&gpu.graph_launch(exec, s).unwrap_err()), 400);
    assert_eq!(code(&gpu.graph_destroy(raw).unwrap_err()), 400);
}

#[test]
fn querying_a_captured_event_fails_and_invalidates_the_capture() {
    let gpu = manual();
    let s = gpu.create_stream();
    let event = Gpu::event_create(gpu.as_ref()).unwrap();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.event_record(event, s).unwrap();
    let e = gpu.event_query(event).unwrap_err();
    assert_eq!(code(&e), capture_code::CAPTURED_EVENT);
    assert_eq!(gpu.capture_status(s).unwrap(), CaptureStatus::Invalidated);
    // Work queued on an invalidated capture is refused.
    let e = gpu.launch_kernel(s, &[]).unwrap_err();
    assert_eq!(code(&e), capture_code::INVALIDATED);
    let e = gpu.end_capture(s).unwrap_err();
    assert_eq!(code(&e), capture_code::INVALIDATED);
    assert_eq!(gpu.capture_status(s).unwrap(), CaptureStatus::None);
    // Synchronizing it fails the same way (the record stays captured).
    let e = gpu.event_synchronize(event).unwrap_err();
    assert_eq!(code(&e), capture_code::CAPTURED_EVENT);
    // A record outside any capture makes it an ordinary event again.
    gpu.event_record(event, s).unwrap();
    gpu.event_synchronize(event).unwrap();
    assert!(gpu.event_query(event).unwrap());
}

#[test]
fn synchronizing_a_capturing_stream_fails_and_invalidates_the_capture() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = gpu.stream_synchronize(s).unwrap_err();
    assert_eq!(code(&e), capture_code::UNSUPPORTED);
    let e = gpu.end_capture(s).unwrap_err();
    assert_eq!(code(&e), capture_code::INVALIDATED);
}

#[test]
fn querying_a_capturing_stream_fails_and_invalidates_the_capture() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.launch_kernel(s, &[]).unwrap();
    assert_eq!(gpu.stream_query(s), Ok(false), "busy before the capture");
    gpu.run_until_idle();
    assert_eq!(gpu.stream_query(s), Ok(true));
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = gpu.stream_query(s).unwrap_err();
    assert_eq!(code(&e), capture_code::UNSUPPORTED);
    let e = gpu.end_capture(s).unwrap_err();
    assert_eq!(code(&e), capture_code::INVALIDATED);
}

#[test]
fn a_host_function_on_a_capturing_stream_is_refused_and_the_capture_stays_valid() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = gpu.launch_host_fn(s, Box::new(|| {})).unwrap_err();
    assert_eq!(code(&e), capture_code::UNSUPPORTED);
    assert!(matches!(
        gpu.capture_status(s).unwrap(),
        CaptureStatus::Active(_)
    ));
    gpu.end_capture(s).unwrap();
}

#[test]
fn relaxed_capture_lets_other_streams_synchronize_global_does_not() {
    let gpu = manual();
    let (s, other) = (gpu.create_stream(), gpu.create_stream());
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.launch_kernel(other, &[]).unwrap();
    gpu.stream_synchronize(other).unwrap();
    gpu.end_capture(s).unwrap();

    gpu.begin_capture(s, CaptureMode::Global).unwrap();
    let e = std::thread::scope(|scope| {
        scope
            .spawn(|| gpu.stream_synchronize(other).unwrap_err())
            .join()
            .unwrap()
    });
    assert_eq!(code(&e), capture_code::UNSUPPORTED);
    assert_eq!(
        code(&gpu.end_capture(s).unwrap_err()),
        capture_code::INVALIDATED
    );
}

#[test]
fn a_stream_that_joins_a_capture_must_be_joined_back() {
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let (fork, join) = (
        Gpu::event_create(gpu.as_ref()).unwrap(),
        Gpu::event_create(gpu.as_ref()).unwrap(),
    );
    let buf = gpu.alloc_async(256, a).unwrap();
    gpu.stream_synchronize(a).unwrap();

    // Fork without a join back.
    gpu.begin_capture(a, CaptureMode::Relaxed).unwrap();
    gpu.event_record(fork, a).unwrap();
    gpu.stream_wait_event(b, fork).unwrap();
    assert_eq!(
        gpu.capture_status(b).unwrap(),
        gpu.capture_status(a).unwrap()
    );
    gpu.launch_kernel(b, &[write(buf)]).unwrap();
    assert_eq!(
        code(&gpu.end_capture(b).unwrap_err()),
        capture_code::UNMATCHED
    );
    assert_eq!(
        code(&gpu.end_capture(a).unwrap_err()),
        capture_code::UNJOINED
    );
    assert_eq!(gpu.capture_status(b).unwrap(), CaptureStatus::None);

    // Fork and join back: the graph captures both streams' work.
    gpu.begin_capture(a, CaptureMode::Relaxed).unwrap();
    gpu.event_record(fork, a).unwrap();
    gpu.stream_wait_event(b, fork).unwrap();
    gpu.launch_kernel(b, &[write(buf)]).unwrap();
    gpu.event_record(join, b).unwrap();
    gpu.stream_wait_event(a, join).unwrap();
    gpu.launch_kernel(a, &[write(buf)]).unwrap();
    let graph = gpu.end_capture(a).unwrap();
    assert_eq!(gpu.capture_status(b).unwrap(), CaptureStatus::None);
    let exec = gpu.graph_instantiate(graph).unwrap();
    gpu.graph_launch(exec, a).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_replay_writing_a_freed_block_is_reported() {
    let gpu = manual();
    let (s, other) = (gpu.create_stream(), gpu.create_stream());
    let block = gpu.alloc_async(1024, s).unwrap();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.launch_kernel(s, &[write(block)]).unwrap();
    let graph = Graph::end_capture_sim(&gpu, s);
    let exec = graph.instantiate().unwrap();
    // SAFETY: not needed on the simulator, whose calls are checked; the
    // launch is the point of the test.
    unsafe { exec.launch(s) }.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());

    // The block is freed and its address handed to another stream's
    // allocation; the next replay writes it.
    gpu.free_async(block, s).unwrap();
    gpu.run_until_idle();
    let reused = gpu.alloc_async(1024, other).unwrap();
    assert_eq!(reused, block, "the simulator reuses the address at once");
    unsafe { exec.launch(s) }.unwrap();
    let races = gpu.take_races();
    assert!(
        races
            .iter()
            .any(|r| r.addr == block && r.kind == RaceKind::Unordered),
        "{races:?}"
    );
}

#[test]
fn a_graphs_memory_is_not_handed_out_while_the_graph_lives() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let tmp = gpu.alloc_async(1 << 20, s).unwrap();
    gpu.free_async(tmp, s).unwrap();
    let graph = Graph::end_capture_sim(&gpu, s);
    let exec = graph.instantiate().unwrap();
    unsafe { exec.launch(s) }.unwrap();
    // Freed inside the graph, but the graph keeps the address.
    let outside = gpu.alloc_async(1 << 20, s).unwrap();
    assert_ne!(outside, tmp);
    gpu.free_async(outside, s).unwrap();
    drop(graph);
    drop(exec);
    gpu.run_until_idle();
    let after = gpu.alloc_async(1 << 20, s).unwrap();
    assert_eq!(after, tmp, "given back once graph and executable are gone");
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_graph_allocation_not_freed_in_the_graph_must_be_freed_before_the_next_launch() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let out = gpu.alloc_async(512, s).unwrap();
    gpu.launch_kernel(s, &[write(out)]).unwrap();
    let graph = Graph::end_capture_sim(&gpu, s);
    let exec = graph.instantiate().unwrap();
    unsafe { exec.launch(s) }.unwrap();
    let e = unsafe { exec.launch(s) }.unwrap_err();
    assert_eq!(code(&e), 1, "CUDA_ERROR_INVALID_VALUE");
    gpu.free_async(out, s).unwrap();
    unsafe { exec.launch(s) }.unwrap();
    gpu.free_async(out, s).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn capture_calls_refuse_bad_state() {
    let gpu = manual();
    let s = gpu.create_stream();
    assert_eq!(
        code(&gpu.end_capture(s).unwrap_err()),
        capture_code::ILLEGAL_STATE
    );
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    assert_eq!(
        code(&gpu.begin_capture(s, CaptureMode::Relaxed).unwrap_err()),
        capture_code::ILLEGAL_STATE
    );
    gpu.end_capture(s).unwrap();
}

#[test]
fn a_global_capture_ends_only_on_its_thread() {
    let gpu = manual();
    let s = gpu.create_stream();
    gpu.begin_capture(s, CaptureMode::Global).unwrap();
    let e = std::thread::scope(|scope| {
        scope
            .spawn(|| gpu.end_capture(s).unwrap_err())
            .join()
            .unwrap()
    });
    assert_eq!(code(&e), capture_code::WRONG_THREAD);
    gpu.end_capture(s).unwrap();
}

#[test]
fn a_wait_on_an_event_recorded_outside_the_capture_fails_and_invalidates_it() {
    // As the H200 answers (driver 580, `tests/cuda/graph.rs`): a capturing
    // stream may not wait on an event recorded outside its capture.
    let gpu = manual();
    let (s, other) = (gpu.create_stream(), gpu.create_stream());
    let outside = Gpu::event_create(gpu.as_ref()).unwrap();
    gpu.launch_kernel(other, &[]).unwrap();
    gpu.event_record(outside, other).unwrap();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let e = gpu.stream_wait_event(s, outside).unwrap_err();
    assert_eq!(code(&e), capture_code::ISOLATION);
    assert_eq!(gpu.capture_status(s).unwrap(), CaptureStatus::Invalidated);
    assert_eq!(gpu.capture_status(other).unwrap(), CaptureStatus::None);
    assert_eq!(
        code(&gpu.end_capture(s).unwrap_err()),
        capture_code::INVALIDATED
    );
}

#[test]
fn a_wait_across_two_captures_fails_and_invalidates_the_waiting_one() {
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let event = Gpu::event_create(gpu.as_ref()).unwrap();
    gpu.begin_capture(a, CaptureMode::Relaxed).unwrap();
    gpu.begin_capture(b, CaptureMode::Relaxed).unwrap();
    gpu.event_record(event, a).unwrap();
    let e = gpu.stream_wait_event(b, event).unwrap_err();
    assert_eq!(code(&e), capture_code::ISOLATION);
    assert_eq!(gpu.capture_status(b).unwrap(), CaptureStatus::Invalidated);
    assert_eq!(
        code(&gpu.end_capture(b).unwrap_err()),
        capture_code::INVALIDATED
    );
    gpu.end_capture(a).unwrap();
}

/// `Graph::end_capture` on the simulator, whose checked calls need no
/// proof.
trait EndCaptureSim {
    fn end_capture_sim(gpu: &Arc<SimGpu>, s: streamalloc::RawStream) -> Graph<SimGpu>;
}

impl EndCaptureSim for Graph<SimGpu> {
    fn end_capture_sim(gpu: &Arc<SimGpu>, s: streamalloc::RawStream) -> Graph<SimGpu> {
        // SAFETY: `s` is a stream of `gpu`, created above and not destroyed.
        unsafe { Graph::end_capture(gpu, s) }.unwrap()
    }
}

/// A graph writing `target`, captured on `s` and instantiated.
fn writer(gpu: &Arc<SimGpu>, s: streamalloc::RawStream, target: u64) -> Graph<SimGpu> {
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.launch_kernel(s, &[write(target)]).unwrap();
    Graph::end_capture_sim(gpu, s)
}

#[test]
fn two_launches_of_one_graph_on_two_streams_are_ordered() {
    // CUDA runs the launches of one executable graph one at a time, in the
    // order they were queued, whatever their streams.
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let target = gpu.alloc_async(1024, a).unwrap();
    gpu.run_until_idle();
    let exec = writer(&gpu, a, target).instantiate().unwrap();
    // SAFETY: not needed on the simulator, whose calls are checked.
    unsafe { exec.launch(a) }.unwrap();
    unsafe { exec.launch(b) }.unwrap();
    unsafe { exec.launch(a) }.unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    // The order holds for work queued after the last launch on its stream:
    // a write on `a` after the third launch follows the second (on `b`).
    gpu.launch_kernel(a, &[write(target)]).unwrap();
    gpu.free_async(target, a).unwrap();
    drop(exec);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn two_graphs_writing_one_buffer_unordered_still_race() {
    // Launches of two executables (even of one graph) are not ordered.
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let target = gpu.alloc_async(1024, a).unwrap();
    gpu.run_until_idle();
    let first = writer(&gpu, a, target).instantiate().unwrap();
    let graph = writer(&gpu, a, target);
    let (second, third) = (graph.instantiate().unwrap(), graph.instantiate().unwrap());
    unsafe { first.launch(a) }.unwrap();
    unsafe { second.launch(b) }.unwrap();
    let races = gpu.take_races();
    assert!(
        races
            .iter()
            .any(|r| r.addr == target && r.kind == RaceKind::Unordered),
        "{races:?}"
    );
    gpu.run_until_idle();
    unsafe { third.launch(a) }.unwrap();
    unsafe { second.launch(b) }.unwrap();
    let races = gpu.take_races();
    assert!(
        races
            .iter()
            .any(|r| r.addr == target && r.kind == RaceKind::Unordered),
        "two executables of one graph: {races:?}"
    );
    gpu.run_until_idle();
}

#[test]
fn a_range_handed_out_in_a_capture_and_kept_is_allocated_from_the_capture_on() {
    // Caller-managed memory (a cache's arena) is mapped already: a range
    // the capture handed out and did not free is the caller's from the end
    // of the capture, whether the graph runs or not.
    let gpu = manual();
    let s = gpu.create_stream();
    // An address of the caller's own memory: the simulator knows of it
    // only what the notes say.
    let arena = 1 << 44;
    for launches in [0, 2] {
        gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
        Gpu::note_suballocation(gpu.as_ref(), arena, 4096, s);
        gpu.launch_kernel(s, &[write(arena)]).unwrap();
        let graph = Graph::end_capture_sim(&gpu, s);
        let exec = graph.instantiate().unwrap();
        for _ in 0..launches {
            unsafe { exec.launch(s) }.unwrap();
        }
        // Used and freed on the stream, before, between or after replays.
        gpu.launch_kernel(s, &[write(arena)]).unwrap();
        drop((exec, graph));
        Gpu::note_subfree(gpu.as_ref(), arena, s);
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "{launches}: {:?}", gpu.races());
    }
}

#[test]
fn a_range_handed_out_in_an_invalidated_capture_is_allocated_from_the_capture_on() {
    // `cuMemMap` takes no stream: memory the caller mapped and handed out
    // during a capture stays mapped and the caller's whatever becomes of
    // the capture (`cuStreamEndCapture` of an invalidated one only returns
    // no graph). A note is no driver call: one made after the capture was
    // invalidated (a cache blind to captures, whose wait the driver
    // refused) counts as one made before. A range handed out and freed in
    // the capture is not left allocated.
    let gpu = manual();
    let (s, other) = (gpu.create_stream(), gpu.create_stream());
    let outside = Gpu::event_create(gpu.as_ref()).unwrap();
    gpu.launch_kernel(other, &[]).unwrap();
    gpu.event_record(outside, other).unwrap();
    let arena = 1 << 44;
    let (before, after, gone) = (arena, arena + 4096, arena + 8192);
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    Gpu::note_suballocation(gpu.as_ref(), before, 4096, s);
    gpu.stream_wait_event(s, outside).unwrap_err();
    assert_eq!(gpu.capture_status(s).unwrap(), CaptureStatus::Invalidated);
    Gpu::note_suballocation(gpu.as_ref(), after, 4096, s);
    Gpu::note_suballocation(gpu.as_ref(), gone, 4096, s);
    Gpu::note_subfree(gpu.as_ref(), gone, s);
    assert_eq!(
        code(&gpu.end_capture(s).unwrap_err()),
        capture_code::INVALIDATED
    );
    for addr in [before, after] {
        gpu.launch_kernel(s, &[write(addr)]).unwrap();
        Gpu::note_subfree(gpu.as_ref(), addr, s);
    }
    // Freed in the capture: the range is free for another stream.
    Gpu::note_suballocation(gpu.as_ref(), gone, 4096, other);
    gpu.launch_kernel(other, &[write(gone)]).unwrap();
    Gpu::note_subfree(gpu.as_ref(), gone, other);
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_range_freed_in_an_invalidated_capture_is_free_after_the_work_before_it() {
    // No graph comes of an invalidated capture: the free of a range the
    // caller handed out before it takes effect in the stream's order
    // before the capture (no replay would ever make it), after the uses
    // queued there, and the range may be handed out again. Checked
    // against those uses.
    let gpu = manual();
    let (s, other) = (gpu.create_stream(), gpu.create_stream());
    let outside = Gpu::event_create(gpu.as_ref()).unwrap();
    gpu.launch_kernel(other, &[]).unwrap();
    gpu.event_record(outside, other).unwrap();
    let arena = 1 << 44;
    Gpu::note_suballocation(gpu.as_ref(), arena, 4096, s);
    gpu.launch_kernel(s, &[write(arena)]).unwrap();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.stream_wait_event(s, outside).unwrap_err();
    Gpu::note_subfree(gpu.as_ref(), arena, s);
    gpu.end_capture(s).unwrap_err();
    Gpu::note_suballocation(gpu.as_ref(), arena, 4096, s);
    gpu.launch_kernel(s, &[write(arena)]).unwrap();
    Gpu::note_subfree(gpu.as_ref(), arena, s);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    // Not at the host's word: a stream not ordered after the uses before
    // the capture that freed the range races with them.
    Gpu::note_suballocation(gpu.as_ref(), arena, 4096, s);
    gpu.launch_kernel(s, &[write(arena)]).unwrap();
    gpu.begin_capture(s, CaptureMode::Relaxed).unwrap();
    gpu.stream_wait_event(s, outside).unwrap_err();
    Gpu::note_subfree(gpu.as_ref(), arena, s);
    gpu.end_capture(s).unwrap_err();
    Gpu::note_suballocation(gpu.as_ref(), arena, 4096, other);
    let races = gpu.races();
    assert!(
        races
            .iter()
            .all(|r| r.addr == arena && r.kind == RaceKind::Unordered && r.later.1 == 1),
        "{races:?}"
    );
    assert_eq!(races.len(), 1, "{races:?}");
    gpu.run_until_idle();
}

#[test]
fn a_graph_that_never_ran_releases_an_address_reused_from_another_stream_without_a_race() {
    // The address space hands a range whose free on `a` has executed to
    // an allocation on `b` (the driver's opportunistic reuse), here one
    // captured into a graph. That graph never runs: its release frees
    // nothing the replays touched, and the free on `a` was ordered before
    // the reuse by the address space. It used to be checked against the
    // history of the allocation freed on `a`, and reported as a race.
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let old = gpu.alloc_async(4096, a).unwrap();
    gpu.launch_kernel(a, &[write(old)]).unwrap();
    gpu.free_async(old, a).unwrap();
    gpu.run_until_idle();
    gpu.begin_capture(b, CaptureMode::Relaxed).unwrap();
    let tmp = gpu.alloc_async(4096, b).unwrap();
    assert_eq!(tmp, old, "the executed free's range is reused");
    gpu.launch_kernel(b, &[write(tmp)]).unwrap();
    gpu.free_async(tmp, b).unwrap();
    let raw = gpu.end_capture(b).unwrap();
    let exec = gpu.graph_instantiate(raw).unwrap();
    gpu.graph_destroy(raw).unwrap();
    gpu.graph_exec_destroy(exec).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    assert_eq!(gpu.held_bytes(), 0, "the address came back");
}

#[test]
fn a_capture_never_takes_a_range_whose_free_has_not_run() {
    // Graph memory is the graph's own address space in CUDA: a capture
    // does not take a range of the pool whose free is still queued (on
    // its own stream or any other), since the replays may run on any
    // stream, ordered after none of the work before that free. The range
    // freed and not yet run on `a` goes to a later allocation on `a`, not
    // to the capture; a replay on `b` then races nothing.
    let gpu = manual();
    let (a, b) = (gpu.create_stream(), gpu.create_stream());
    let old = gpu.alloc_async(4096, a).unwrap();
    gpu.run_until_idle();
    gpu.launch_kernel(a, &[write(old)]).unwrap();
    gpu.free_async(old, a).unwrap();
    gpu.begin_capture(a, CaptureMode::Relaxed).unwrap();
    let tmp = gpu.alloc_async(4096, a).unwrap();
    assert_ne!(tmp, old, "the capture took a range whose free is queued");
    gpu.launch_kernel(a, &[write(tmp)]).unwrap();
    gpu.free_async(tmp, a).unwrap();
    let raw = gpu.end_capture(a).unwrap();
    let exec = gpu.graph_instantiate(raw).unwrap();
    gpu.graph_launch(exec, b).unwrap();
    gpu.run_until_idle();
    gpu.graph_destroy(raw).unwrap();
    gpu.graph_exec_destroy(exec).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
