//! Stream capture and graphs on a real GPU (run with `--include-ignored` on
//! the GPU machine). Each test fails, rather than skips, without a device.

mod common;

use std::time::Duration;

use streamalloc::AsyncResource;
use streamalloc::gpu::{CaptureMode, CaptureStatus, capture_code};
use streamalloc::{AllocTag, AsyncCudaResource, DeviceMemoryResource, ResourceError};

const GUARD: Duration = Duration::from_secs(30);
const TAG: AllocTag = AllocTag("graph");
const BYTES: usize = 1 << 20;

fn cuda(
    streams: usize,
) -> (
    common::Fixture<streamalloc::gpu::cuda::CudaGpu>,
    AsyncResource<AsyncCudaResource>,
) {
    let f = common::cuda(streams);
    let res = AsyncResource::new(f.resource.clone()).expect("async resource on CUDA");
    (f, res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_capture_replay_three_times_and_account_to_zero() {
    let (f, res) = cuda(2);
    let s = f.stream(0);
    let persistent = res.allocate(BYTES, s, TAG).await.unwrap();
    let ((), graph) = res
        .capture_graph(s, CaptureMode::Relaxed, |capture| {
            let raw = capture.raw_stream();
            let tmp = res.try_allocate(BYTES, s, TAG)?;
            // SAFETY: a stream of this program's pool; `tmp` was allocated
            // in this capture and `persistent` before it, neither freed.
            unsafe {
                res.gpu().memset_async(tmp.ptr(), 7, BYTES, raw)?;
                res.gpu()
                    .copy_async(persistent.ptr(), tmp.ptr(), BYTES, raw)?;
            }
            drop(res.deallocate(tmp)?);
            assert!(matches!(capture.status()?, CaptureStatus::Active(_)));
            Ok::<_, ResourceError>(())
        })
        .expect("the capture stays valid");
    for _ in 0..3 {
        // SAFETY: `persistent` lives until after the last replay completed.
        let done = unsafe { graph.launch(s) }.unwrap();
        assert_eq!(
            tokio::time::timeout(GUARD, done).await.expect("hang"),
            Ok(())
        );
    }
    assert_eq!(graph.launches(), 3);
    drop(graph);
    res.deallocate(persistent).unwrap().await.unwrap();
    tokio::time::timeout(GUARD, res.reap_pending())
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(f.resource.live_bytes(), 0);
    assert_eq!(f.resource.pending_free_bytes(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_awaiting_on_a_capturing_stream_keeps_the_capture_valid() {
    let (f, res) = cuda(2);
    let s = f.stream(0);
    let capture = res.begin_capture(s, CaptureMode::Relaxed).unwrap();
    let block = res.try_allocate(BYTES, s, TAG).unwrap();
    // Each of these would query a captured event or pull the notifier into
    // the capture: all refused, the capture untouched.
    let e = res.completion(s).unwrap_err();
    assert!(
        matches!(e, ResourceError::StreamCapturing { stream, capture: Some(_) } if stream == s),
        "{e}"
    );
    let e = res
        .finish_block_use(block.id(), s, streamalloc::Access::Write)
        .unwrap_err();
    assert!(matches!(e, ResourceError::StreamCapturing { .. }), "{e}");
    let handle = res.deallocate(block).unwrap();
    // The watchdog runs meanwhile (it must not query the capture either).
    tokio::time::sleep(streamalloc::FALLBACK_PERIOD * 3).await;
    f.resource.reap_pending().unwrap();
    assert!(matches!(
        capture.status().unwrap(),
        CaptureStatus::Active(_)
    ));
    let graph = capture.end().expect("the capture stays valid");
    drop(graph);
    tokio::time::timeout(GUARD, handle)
        .await
        .expect("hang")
        .unwrap();
    // The notifier streams never joined the capture.
    for s in f.pool.ids() {
        let raw = f.pool.raw(s).unwrap();
        // SAFETY: a stream of this program's pool.
        let status = unsafe { res.gpu().capture_status(raw) }.unwrap();
        assert_eq!(status, CaptureStatus::None);
    }
    tokio::time::timeout(GUARD, res.reap_pending())
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_illegal_calls_invalidate_as_the_simulator_says() {
    // The simulator's model, checked against the driver: a synchronize of
    // a capturing stream fails with STREAM_CAPTURE_UNSUPPORTED and the end
    // with STREAM_CAPTURE_INVALIDATED; a host function is refused without
    // touching the capture; a query of a captured event fails with
    // CAPTURED_EVENT.
    let (f, res) = cuda(2);
    let s = f.stream(0);
    let raw = f.pool.raw(s).unwrap();
    let gpu = res.gpu();
    // SAFETY (every block below): a stream of this program's pool, an event
    // made just above.
    unsafe {
        gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
        let e = gpu.launch_host_fn(raw, Box::new(|| {})).unwrap_err();
        assert_eq!(e.code(), capture_code::UNSUPPORTED);
        assert!(matches!(
            gpu.capture_status(raw).unwrap(),
            CaptureStatus::Active(_)
        ));
        let e = gpu.stream_synchronize(raw).unwrap_err();
        assert_eq!(e.code(), capture_code::UNSUPPORTED);
        assert_eq!(gpu.capture_status(raw).unwrap(), CaptureStatus::Invalidated);
        let e = gpu.end_capture(raw).unwrap_err();
        assert_eq!(e.code(), capture_code::INVALIDATED);

        // A wait on an event recorded outside the capture fails with
        // STREAM_CAPTURE_ISOLATION and invalidates the capture (seen on the
        // H200, driver 580, 2026-12-03; the simulator does the same); the
        // other stream does not join.
        let outside = gpu.event_create().unwrap();
        let other = f.pool.raw(f.stream(1)).unwrap();
        gpu.event_record(outside, other).unwrap();
        gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
        let e = gpu.stream_wait_event(raw, outside).unwrap_err();
        assert_eq!(e.code(), capture_code::ISOLATION);
        assert_eq!(gpu.capture_status(raw).unwrap(), CaptureStatus::Invalidated);
        assert_eq!(gpu.capture_status(other).unwrap(), CaptureStatus::None);
        let e = gpu.end_capture(raw).unwrap_err();
        assert_eq!(e.code(), capture_code::INVALIDATED);

        let event = gpu.event_create().unwrap();
        gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
        gpu.event_record(event, raw).unwrap();
        let e = gpu.event_query(event).unwrap_err();
        assert_eq!(e.code(), capture_code::CAPTURED_EVENT);
        let ended = gpu.end_capture(raw);
        // Whether the driver invalidates the capture on this query is what
        // the simulator assumes (it does, as seen on the H200 in issue 19).
        assert_eq!(
            ended.map(|_| ()).unwrap_err().code(),
            capture_code::INVALIDATED
        );
        gpu.event_destroy(event).unwrap();
        gpu.event_destroy(outside).unwrap();
    }
}

/// A buffer a capture allocated and kept (a graph memory node) on the
/// driver: refused before the first replay made its memory, usable after,
/// dropped between replays (the graph frees each replay's instance before
/// the next launch) and after the graph: the driver accepts every launch
/// and the books end at zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn cuda_a_kept_graph_buffer_is_freed_once_and_refused_until_replayed() {
    let (f, res) = cuda(2);
    let (s, other) = (f.stream(0), f.stream(1));
    let (kept, graph) = res
        .capture_graph(s, CaptureMode::Relaxed, |_| {
            res.try_allocate_buffer::<u8>(BYTES, s, TAG)
        })
        .expect("the capture stays valid");
    let mut kept = kept;
    assert!(
        matches!(
            kept.fill_bytes_on(s, 1),
            Err(ResourceError::GraphMemoryUnbacked { .. })
        ),
        "a use before the first replay was accepted"
    );
    // SAFETY: the graph touches only memory it allocated.
    let done = unsafe { graph.launch(s) }.unwrap();
    tokio::time::timeout(GUARD, done)
        .await
        .expect("hang")
        .unwrap();
    kept.fill_bytes_on(s, 1).unwrap();
    let mut copy = res.try_allocate_buffer::<u8>(BYTES, other, TAG).unwrap();
    copy.copy_from_on(other, &kept).unwrap();
    // Dropped between replays: the next launch frees this instance first.
    drop(kept);
    for stream in [other, s] {
        // SAFETY: as above.
        let done = unsafe { graph.launch(stream) }.unwrap();
        tokio::time::timeout(GUARD, done)
            .await
            .expect("hang")
            .unwrap();
    }
    drop((copy, graph));
    tokio::time::timeout(GUARD, res.reap_pending())
        .await
        .expect("hang")
        .unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    println!(
        "cuda: a kept graph buffer refused before its first replay, freed once across three launches"
    );
}
