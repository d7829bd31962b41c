//! The graph API on the simulated device: capture a step with temporaries,
//! replay it, await each replay, drop it; failures leave no stream
//! capturing.

mod common;

use std::sync::Arc;

use common::drive;
use streamalloc::futures::AsyncResource;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::gpu::{CaptureMode, CaptureStatus, capture_code};
use streamalloc::{AllocTag, Device, ResourceError, SimResource, StreamId};

const TAG: AllocTag = AllocTag("graph");
const N: usize = 4096;

struct Scene {
    gpu: Arc<SimGpu>,
    res: AsyncResource<SimResource>,
    device: Device<SimGpu>,
}

fn scene() -> Scene {
    let gpu = SimGpu::builder().manual().build();
    let device = Device::simulated(&gpu, 2);
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
