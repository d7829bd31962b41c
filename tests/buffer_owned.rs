//! Owned buffers on the simulated device: a handler cancelled anywhere, an
//! aborted task and a panicking one leak nothing; uses across streams are
//! ordered, and a use that escapes its guard is caught.

mod common;

use std::sync::Arc;
use std::task::Poll;

use common::{CountingWaker, drive, poll_once};
use streamalloc::AsyncResource;
use streamalloc::Buffer;
use streamalloc::gpu::sim::{MemAccess, RaceKind, SimGpu};
use streamalloc::{AllocTag, Device, ResourceError, SimResource, StreamId};

const TAG: AllocTag = AllocTag("buffer");
/// Elements of each handler buffer (f32).
const N: usize = 1024;
const BYTES: usize = N * 4;

/// A manual device that holds exactly two handler buffers.
fn tight() -> (Arc<SimGpu>, AsyncResource<SimResource>, Vec<StreamId>) {
    let gpu = SimGpu::builder().manual().capacity(2 * BYTES).build();
    let device = Device::simulated(&gpu, 3);
    let pool = device.streams().clone();
    let res = AsyncResource::new(Arc::new(SimResource::new(&device))).expect("async resource");
    (gpu, res, pool.ids().collect())
}

fn sim_err(e: streamalloc::gpu::GpuError, s: StreamId) -> ResourceError {
    e.for_request(0, s)
}

/// The card's request handler: memory, a fill, a launch, its completion.
async fn handler(
    res: AsyncResource<SimResource>,
    gpu: Arc<SimGpu>,
    s: [StreamId; 2],
) -> Result<(), ResourceError> {
    let mut x = res.allocate_buffer::<f32>(N, s[0], TAG).await?; // await 1
    x.fill_bytes_on(s[0], 0)?;
    let mut y = res.allocate_buffer::<f32>(N, s[1], TAG).await?; // await 2
    let (xp, yp) = (x.block().clone(), y.block().clone());
    let ((), done) = res.launch(s[1]).read(&x).write(&mut y).enqueue(|raw| {
        gpu.launch_kernel(raw, &[MemAccess::read(&xp), MemAccess::write(&yp)])
            .map_err(|e| sim_err(e, s[1]))
    })?;
    done.await?; // await 3
    Ok(())
}

/// Runs the handler, cancelling it at its `k`-th suspension; returns how
/// many times it suspended (all of them when it completed).
fn cancelled_at(k: usize) -> (usize, bool) {
    let (gpu, res, s) = tight();
    // Two blockers fill the device: the handler's allocations wait for them.
    let mut blockers = vec![
        res.try_allocate_buffer::<f32>(N, s[2], TAG).unwrap(),
        res.try_allocate_buffer::<f32>(N, s[2], TAG).unwrap(),
    ];
    let (_c, waker) = CountingWaker::new();
    let mut fut = Box::pin(handler(res.clone(), gpu.clone(), [s[0], s[1]]));
    let mut suspended = 0;
    let completed = loop {
        match poll_once(&mut fut, &waker) {
            Poll::Ready(r) => {
                r.expect("handler");
                break true;
            }
            Poll::Pending if suspended == k => {
                drop(fut);
                break false;
            }
            Poll::Pending => {
                suspended += 1;
                drop(blockers.pop());
                gpu.run_until_idle();
            }
        }
    };
    drop(blockers);
    gpu.run_until_idle();
    drive(&gpu, &mut res.reap_pending()).expect("reap");
    assert_eq!(res.bytes_outstanding(), 0, "cancelled at suspension {k}");
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
    (suspended, completed)
}

#[test]
fn a_handler_cancelled_at_each_await_leaves_nothing_outstanding() {
    let mut k = 0;
    loop {
        let (suspended, completed) = cancelled_at(k);
        if completed {
            // Memory, memory, completion: each await suspended once.
            assert_eq!(suspended, 3, "every await point was a cancellation point");
            assert_eq!(k, 3);
            break;
        }
        k += 1;
        assert!(k < 10, "the handler never completes");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_task_leaves_nothing_outstanding() {
    let gpu = SimGpu::builder()
        .op_latency(std::time::Duration::from_millis(50))
        .build();
    let device = Device::simulated(&gpu, 2);
    let pool = device.streams().clone();
    let res = AsyncResource::new(Arc::new(SimResource::new(&device))).unwrap();
    let s = [pool.id(0).unwrap(), pool.id(1).unwrap()];
    let task = tokio::spawn(handler(res.clone(), gpu.clone(), s));
    // Abort while the launch is (most likely) still queued on the device.
    while res.bytes_outstanding() < 2 * BYTES && !task.is_finished() {
        tokio::task::yield_now().await;
    }
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled(), "aborted mid-launch");
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_task_leaves_nothing_outstanding() {
    let gpu = SimGpu::new();
    let device = Device::simulated(&gpu, 2);
    let pool = device.streams().clone();
    let res = AsyncResource::new(Arc::new(SimResource::new(&device))).unwrap();
    let s = pool.id(0).unwrap();
    let r2 = res.clone();
    let task = tokio::spawn(async move {
        let mut x = r2.allocate_buffer::<u64>(N, s, TAG).await.unwrap();
        x.fill_bytes_on(s, 7).unwrap();
        panic!("the handler panics holding a buffer");
    });
    assert!(task.await.unwrap_err().is_panic());
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// The enqueue closure queues the kernel, then panics: the launch is still
/// recorded, so the frees during unwinding wait for the kernel.
#[test]
fn an_enqueue_that_panics_still_orders_the_frees_after_its_kernel() {
    let (gpu, res, s) = tight();
    let x = res.try_allocate_buffer::<f32>(N, s[0], TAG).unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let xp = x.block().clone();
        let _ = res.launch(s[1]).read(&x).enqueue(|raw| {
            gpu.launch_kernel(raw, &[MemAccess::read(&xp)]).unwrap();
            panic!("the closure panics after queuing the kernel");
            #[allow(unreachable_code)]
            Ok::<(), ResourceError>(())
        });
    }));
    assert!(unwound.is_err());
    drop(x); // the free on s[0] must wait for the kernel on s[1]
    gpu.run_until_idle();
    drive(&gpu, &mut res.reap_pending()).unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// Written on one stream, read on two others, dropped: every use ordered.
#[test]
fn written_on_one_stream_read_on_two_others_and_dropped_has_no_race() {
    let (gpu, res, s) = tight();
    let mut x = res.try_allocate_buffer::<f32>(N, s[0], TAG).unwrap();
    {
        let w = x.write_on(s[0]).unwrap();
        gpu.launch_kernel(res.stream_pool().raw(s[0]).unwrap(), &[w.sim_access()])
            .unwrap();
    }
    for &reader in &s[1..] {
        let view = x.slice(N / 2..).unwrap();
        let r = view.read_on(reader).unwrap();
        gpu.launch_kernel(res.stream_pool().raw(reader).unwrap(), &[r.sim_access()])
            .unwrap();
    }
    drop(x);
    gpu.run_until_idle();
    drive(&gpu, &mut res.reap_pending()).unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// A view's address used after its guard, on a stream the guard did not
/// order: the race detector reports it (this test fails if buffers ever
/// stop being checked, or the detector stops seeing them).
#[test]
fn a_view_that_escapes_its_guard_is_reported() {
    let (gpu, res, s) = tight();
    let mut x = res.try_allocate_buffer::<f32>(N, s[0], TAG).unwrap();
    x.fill_bytes_on(s[0], 1).unwrap();
    let escaped = {
        let view = x.slice(..N / 2).unwrap();
        let guard = view.read_on(s[1]).unwrap();
        guard.sim_access()
    };
    // Read on s[2], which nothing ordered after the fill on s[0].
    gpu.launch_kernel(res.stream_pool().raw(s[2]).unwrap(), &[escaped])
        .unwrap();
    let races = gpu.take_races();
    assert!(
        races.iter().any(|r| r.kind == RaceKind::Unordered),
        "expected an unordered access, got {races:?}"
    );
    drop(x);
    gpu.run_until_idle();
}

#[test]
fn views_are_bounds_checked_and_change_nothing() {
    let (_gpu, res, s) = tight();
    let mut x = res.try_allocate_buffer::<f32>(N, s[0], TAG).unwrap();
    assert!(matches!(
        x.slice(N - 1..N + 1),
        Err(ResourceError::OutOfBounds { start, end, len }) if (start, end, len) == (N - 1, N + 1, N)
    ));
    assert!(x.slice_mut(N + 1..).is_err());
    let view = x.slice(10..20).unwrap();
    assert_eq!(view.len(), 10);
    assert_eq!(view.ptr(), x.block().ptr() + 40);
    assert!(view.slice(5..11).is_err());
    assert_eq!(view.slice(5..10).unwrap().ptr(), x.block().ptr() + 60);
    let base = x.block().ptr();
    let mut view = x.slice_mut(10..20).unwrap();
    assert!(view.slice_mut(5..11).is_err());
    let inner = view.slice_mut(5..=6).unwrap();
    assert_eq!(
        (inner.ptr(), inner.len(), inner.num_bytes()),
        (base + 60, 2, 8)
    );
    let shared = view.as_view();
    assert_eq!((shared.ptr(), shared.len()), (base + 40, 10));
    assert_eq!(res.bytes_outstanding(), BYTES);
}

#[test]
fn a_size_that_overflows_is_an_error_and_allocates_nothing() {
    let (_gpu, res, s) = tight();
    let r = res.try_allocate_buffer::<u64>(usize::MAX / 4, s[0], TAG);
    assert!(matches!(
        r,
        Err(ResourceError::SizeOverflow { elem_size: 8, .. })
    ));
    let mut fut = res.allocate_buffer::<u64>(usize::MAX / 4, s[0], TAG);
    let (_c, waker) = CountingWaker::new();
    assert!(matches!(
        poll_once(&mut fut, &waker),
        Poll::Ready(Err(ResourceError::SizeOverflow { .. }))
    ));
    assert_eq!(res.bytes_outstanding(), 0);
}

#[test]
fn into_block_opts_out_of_the_free() {
    let (gpu, res, s) = tight();
    let x = res.try_allocate_buffer::<u8>(BYTES, s[0], TAG).unwrap();
    let block = x.into_block().unwrap();
    gpu.run_until_idle();
    assert_eq!(
        res.bytes_outstanding(),
        BYTES,
        "nothing freed on the way out"
    );
    drive(&gpu, &mut res.deallocate(block).unwrap()).unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}

#[test]
fn helpers_copy_and_fill_through_buffers_in_order() {
    let (gpu, res, s) = tight();
    let mut a = res.try_allocate_buffer::<f32>(N, s[0], TAG).unwrap();
    let mut b = res.try_allocate_buffer::<f32>(N, s[1], TAG).unwrap();
    a.fill_bytes_on(s[0], 3).unwrap();
    b.copy_from_on(s[2], &a).unwrap(); // reads a (written on s0), writes b (born on s1)
    drop(a);
    drop(b);
    gpu.run_until_idle();
    drive(&gpu, &mut res.reap_pending()).unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn sync_resources_hand_out_buffers_too() {
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let x: Buffer<u32> = f.resource.allocate_buffer(256, f.stream(0), TAG).unwrap();
    {
        let r = x.read_on(f.stream(1)).unwrap();
        gpu.launch_kernel(f.pool.raw(f.stream(1)).unwrap(), &[r.sim_access()])
            .unwrap();
    }
    drop(x);
    gpu.run_until_idle();
    streamalloc::DeviceMemoryResource::reap_pending(&*f.resource).unwrap();
    assert_eq!(
        streamalloc::DeviceMemoryResource::bytes_outstanding(&*f.resource),
        0
    );
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
