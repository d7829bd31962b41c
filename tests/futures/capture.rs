//! The futures layer and the resource around a stream being captured into a
//! CUDA graph: nothing they do may query a captured event, synchronize the
//! capturing stream or queue a host function into the capture, so the
//! user's capture stays valid; what cannot be done during a capture is
//! refused with [`ResourceError::StreamCapturing`], changing nothing.

use crate::support;

use std::sync::Arc;
use std::task::Poll;

use streamalloc::CaptureId;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::gpu::{CaptureMode, CaptureStatus};
use streamalloc::{
    Access, AllocTag, Device, DeviceMemoryResource, DriverCall, ResourceError, SimResource,
    StreamId,
};
use streamalloc::{AsyncResource, WaitPolicy};
use support::{CountingWaker, drive, poll_once};

const TAG: AllocTag = AllocTag("capture");

struct Scene {
    gpu: Arc<SimGpu>,
    res: AsyncResource<SimResource>,
    device: Device<SimGpu>,
    s: StreamId,
}

impl Scene {
    fn new() -> Self {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, 2);
        let res = AsyncResource::on(&device).expect("async resource");
        // Query at every poll: the first poll is where a captured event
        // would be queried.
        res.set_wait_policy(WaitPolicy {
            query_every: std::time::Duration::ZERO,
            ..WaitPolicy::DEFAULT
        });
        let s = device.stream(0).unwrap();
        Scene {
            gpu,
            res,
            device,
            s,
        }
    }

    fn begin(&self) {
        let raw = self.device.raw(self.s).unwrap();
        self.gpu.begin_capture(raw, CaptureMode::Relaxed).unwrap();
    }

    fn status(&self) -> CaptureStatus {
        self.gpu
            .capture_status(self.device.raw(self.s).unwrap())
            .unwrap()
    }

    /// Ends the capture, asserting that it stayed valid; returns its id.
    fn end_valid(&self) -> CaptureId {
        let CaptureStatus::Active(capture) = self.status() else {
            panic!("the capture was invalidated: {:?}", self.status());
        };
        let raw = self.device.raw(self.s).unwrap();
        let graph = self.gpu.end_capture(raw).expect("the capture stays valid");
        self.gpu.graph_destroy(graph).unwrap();
        // Nothing of the futures layer joined the capture.
        for s in self.device.streams().ids() {
            let raw = self.device.raw(s).unwrap();
            assert_eq!(self.gpu.capture_status(raw).unwrap(), CaptureStatus::None);
        }
        capture
    }
}

fn is_capturing(e: &ResourceError, s: StreamId) -> bool {
    matches!(e, ResourceError::StreamCapturing { stream, capture: Some(_) } if *stream == s)
}

#[test]
fn awaiting_completion_on_a_capturing_stream_keeps_the_capture_valid() {
    let sc = Scene::new();
    sc.begin();
    let outcome = match sc.res.completion(sc.s) {
        Ok(mut fut) => {
            let (_c, waker) = CountingWaker::new();
            match poll_once(&mut fut, &waker) {
                Poll::Ready(r) => r,
                Poll::Pending => Ok(()),
            }
        }
        Err(e) => Err(e),
    };
    let e = outcome.expect_err("a completion point cannot be made in a capture");
    assert!(is_capturing(&e, sc.s), "{e}");
    assert!(e.to_string().contains("capturing"), "{e}");
    sc.end_valid();
    // After the capture, completions work again.
    let mut fut = sc.res.completion(sc.s).unwrap();
    drive(&sc.gpu, &mut fut).unwrap();
}

#[test]
fn finish_block_use_on_a_capturing_stream_is_refused_and_changes_nothing() {
    let sc = Scene::new();
    let block = sc.res.try_allocate(4096, sc.s, TAG).unwrap();
    let events_before = sc.res.inner().pending_use_event_count(block.ptr());
    sc.begin();
    let raw = sc.device.raw(sc.s).unwrap();
    sc.gpu
        .launch_kernel(raw, &[MemAccess::write(&block)])
        .unwrap();
    let e = sc
        .res
        .finish_block_use(block.id(), sc.s, Access::Write)
        .expect_err("refused");
    assert!(is_capturing(&e, sc.s), "{e}");
    assert_eq!(
        sc.res.inner().pending_use_event_count(block.ptr()),
        events_before
    );
    sc.end_valid();
    sc.res.deallocate(block).unwrap();
}

#[test]
fn frees_inside_a_capture_keep_it_valid_and_are_accounted_after_it() {
    let sc = Scene::new();
    let host_fns = sc.gpu.call_count(DriverCall::LaunchHostFunc);
    sc.begin();
    // A temporary through `deallocate`, one through an owned buffer's drop.
    let a = sc.res.try_allocate(4096, sc.s, TAG).unwrap();
    let buf = sc.res.try_allocate_buffer::<f32>(1024, sc.s, TAG).unwrap();
    let raw = sc.device.raw(sc.s).unwrap();
    sc.gpu
        .launch_kernel(raw, &[MemAccess::write(&a), MemAccess::write(buf.block())])
        .unwrap();
    let handle = sc.res.deallocate(a).unwrap();
    drop(buf);
    // Let the watchdog and the device do what they would meanwhile.
    sc.gpu.run_until_idle();
    std::thread::sleep(streamalloc::FALLBACK_PERIOD * 3);
    assert_eq!(
        sc.gpu.call_count(DriverCall::LaunchHostFunc),
        host_fns,
        "no notification is queued into a capture"
    );
    let capture = sc.end_valid();
    // The frees are nodes of the graph: its memory, counted while it lives.
    let mut handle = handle;
    drive(&sc.gpu, &mut handle).unwrap();
    assert!(sc.res.bytes_outstanding() > 0);
    assert_eq!(sc.res.bytes_outstanding(), sc.res.inner().graph_bytes());
    // Released (the graph is gone, never launched): they reach the
    // accounting behind the stream.
    sc.res.release_capture(capture, sc.s).unwrap();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

#[test]
fn reaping_the_resource_skips_a_capturing_stream() {
    let sc = Scene::new();
    let base = sc.res.inner().clone();
    sc.begin();
    let block = base.allocate(4096, sc.s, TAG).unwrap();
    base.deallocate(block).unwrap();
    base.reap_pending()
        .expect("reaping does not fail on a capture");
    assert_eq!(base.graph_bytes(), 4096, "still the graph's");
    let capture = sc.end_valid();
    base.reap_pending().unwrap();
    assert_eq!(base.graph_bytes(), 4096, "the graph's until released");
    base.release_capture(capture, sc.s).unwrap();
    assert_eq!((base.graph_bytes(), base.pending_free_bytes()), (0, 4096));
    base.reap_pending().unwrap();
    assert_eq!(base.bytes_outstanding(), 0);
}

#[test]
fn a_point_made_before_the_capture_completes_during_it() {
    let sc = Scene::new();
    let raw = sc.device.raw(sc.s).unwrap();
    sc.gpu.launch_kernel(raw, &[]).unwrap();
    let mut before = sc.res.completion(sc.s).unwrap();
    let (_c, waker) = CountingWaker::new();
    assert!(poll_once(&mut before, &waker).is_pending());
    sc.begin();
    sc.gpu.launch_kernel(raw, &[]).unwrap();
    // The pre-capture work runs; the future's own event was recorded
    // outside the capture, so querying it is legal.
    sc.gpu.run_until_idle();
    assert_eq!(drive(&sc.gpu, &mut before), Ok(()));
    sc.end_valid();
}

#[test]
fn a_launch_on_a_capturing_stream_is_refused_before_it_is_queued() {
    let sc = Scene::new();
    let x = sc.res.try_allocate_buffer::<f32>(256, sc.s, TAG).unwrap();
    sc.begin();
    let mut ran = false;
    let e = sc
        .res
        .launch(sc.s)
        .read(&x)
        .enqueue(|_raw| {
            ran = true;
            Ok::<(), ResourceError>(())
        })
        .expect_err("refused");
    assert!(!ran, "nothing is queued");
    assert!(is_capturing(&e, sc.s), "{e}");
    sc.end_valid();
    drop(x);
}

#[test]
fn a_block_of_another_stream_used_in_a_capture_is_refused_and_keeps_it_valid() {
    // Ordering the capturing stream after the block's allocation on
    // another stream would wait on an event recorded outside the capture,
    // which the driver refuses with STREAM_CAPTURE_ISOLATION and which
    // invalidates the capture (H200, `tests/cuda/graph.rs`).
    let sc = Scene::new();
    let other = sc.device.stream(1).unwrap();
    let block = sc.res.try_allocate(4096, other, TAG).unwrap();
    sc.begin();
    let e = sc
        .res
        .prepare_block_use(block.id(), sc.s, Access::Write)
        .expect_err("refused");
    assert!(is_capturing(&e, sc.s), "{e}");
    sc.end_valid();
    // After the capture, the same use is ordered as usual.
    sc.res
        .prepare_block_use(block.id(), sc.s, Access::Write)
        .unwrap();
    let mut used = sc
        .res
        .finish_block_use(block.id(), sc.s, Access::Write)
        .unwrap();
    drive(&sc.gpu, &mut used).unwrap();
    let mut freed = sc.res.deallocate(block).unwrap();
    drive(&sc.gpu, &mut freed).unwrap();
}

#[test]
fn freeing_in_a_capture_a_block_used_on_another_stream_keeps_the_capture_valid() {
    // Waiting, from the capture, on the other stream's use event recorded
    // before it would invalidate the capture. The graph adopts the block
    // instead (nothing queued in the capture) and its release frees it once,
    // after that use and the block's own stream.
    let sc = Scene::new();
    let other = sc.device.stream(1).unwrap();
    let block = sc.res.try_allocate(4096, sc.s, TAG).unwrap();
    sc.res
        .prepare_block_use(block.id(), other, Access::Read)
        .unwrap();
    let mut used = sc
        .res
        .finish_block_use(block.id(), other, Access::Read)
        .unwrap();
    drive(&sc.gpu, &mut used).unwrap();
    sc.begin();
    sc.res.inner().deallocate(block).unwrap();
    let capture = sc.end_valid();
    assert_eq!(
        sc.res.bytes_outstanding(),
        4096,
        "the graph's until its release"
    );
    sc.res.release_capture(capture, sc.s).unwrap();
    let mut reap = sc.res.reap_pending();
    drive(&sc.gpu, &mut reap).unwrap();
    assert_eq!(sc.res.bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty(), "{:?}", sc.gpu.races());
}

/// A capture begun on another thread while a free's notification records
/// the notifier's event on the stream (after it looked and saw no
/// capture): the record lands in the capture, and the lane must not wait
/// on it, or it joins the capture, which then cannot end
/// (`CUDA_ERROR_STREAM_CAPTURE_UNJOINED`; the whole-API model's open
/// failure at 30,000 cases). The notification comes after the capture.
#[test]
fn a_capture_begun_during_the_notifiers_record_still_ends() {
    let sc = Scene::new();
    let block = sc.res.try_allocate(4096, sc.s, TAG).unwrap();
    let records = sc.gpu.call_count(DriverCall::EventRecord);
    std::thread::scope(|scope| {
        let gate = sc.gpu.gate_nth(DriverCall::EventRecord, 1);
        let freer = scope.spawn(|| drop(sc.res.deallocate(block).unwrap()));
        assert!(
            gate.wait_entered(support::guard(10)),
            "the free's notification records the notifier's event"
        );
        sc.begin();
        gate.open();
        freer.join().unwrap();
    });
    assert_eq!(sc.gpu.call_count(DriverCall::EventRecord), records + 1);
    sc.end_valid();
    // After the capture the free is reaped as any other.
    sc.gpu.run_until_idle();
    drive(&sc.gpu, &mut sc.res.reap_pending()).unwrap();
    assert_eq!(sc.res.inner().bytes_outstanding(), 0);
    assert!(sc.gpu.races().is_empty());
}
