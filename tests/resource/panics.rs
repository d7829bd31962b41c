//! User code that panics — host functions on the simulated device's thread,
//! poison fills, `tracing` subscribers, decorators called from the
//! watchdog thread — leaves every counter consistent, loses no memory and
//! wedges nothing (issue 18).

use crate::support;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use streamalloc::AsyncResource;
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, DeviceMemoryResource, ResourceResult,
    SimResource, StreamId,
};
use streamalloc::{DebugGuardResource, GuardConfig, PoisonFill, TracingResource};

const T: AllocTag = AllocTag("panics");
/// How long a test waits for something that must happen before calling it
/// a hang (a guard, not a timing assertion).
const HANG: Duration = Duration::from_secs(10);

fn quietly<R>(f: impl FnOnce() -> R) -> std::thread::Result<R> {
    catch_unwind(AssertUnwindSafe(f))
}

/// A host function that panics on the threaded device's thread: the thread
/// survives, later host functions run, the stream synchronizes.
#[test]
fn a_panicking_host_function_does_not_kill_the_device_thread() {
    let gpu = SimGpu::new();
    let s = Gpu::create_stream(&*gpu).unwrap();
    gpu.launch_host_fn(s, Box::new(|| panic!("user host function")))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    gpu.launch_host_fn(s, Box::new(move || tx.send(()).unwrap()))
        .unwrap();
    rx.recv_timeout(HANG)
        .expect("the host function after the panicking one ran");
    gpu.stream_synchronize(s).unwrap();
    assert_eq!(gpu.host_fn_panics(), 1);

    // The resource's reaping still works on that device.
    let device = streamalloc::Device::simulated(&gpu, 1);
    let r = SimResource::new(&device);
    let block = r.allocate(4096, device.stream(0).unwrap(), T).unwrap();
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    assert_eq!(r.bytes_outstanding(), 0);
}

/// The same on a manual device, where host functions run on the thread that
/// synchronizes: the synchronize returns, and the stream is not left busy.
#[test]
fn a_panicking_host_function_does_not_wedge_a_manual_stream() {
    let gpu = SimGpu::builder().manual().build();
    let s = Gpu::create_stream(&*gpu).unwrap();
    gpu.launch_host_fn(s, Box::new(|| panic!("user host function")))
        .unwrap();
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = ran.clone();
    gpu.launch_host_fn(
        s,
        Box::new(move || {
            counter.fetch_add(1, Ordering::AcqRel);
        }),
    )
    .unwrap();
    gpu.stream_synchronize(s).unwrap();
    assert_eq!(ran.load(Ordering::Acquire), 1);
    assert!(gpu.is_idle());
    assert_eq!(gpu.host_fn_panics(), 1);
}

/// A poison fill that panics: the block stays live and usable, and freeing
/// it again (with a fill that works) succeeds. Held up under review; kept.
#[test]
fn a_panicking_poison_fill_leaves_the_block_live() {
    #[derive(Debug)]
    struct Panicky(AtomicUsize);
    impl PoisonFill for Panicky {
        fn fill(&self, _block: &DeviceBlock) -> ResourceResult<()> {
            if self.0.fetch_add(1, Ordering::AcqRel) == 0 {
                panic!("user poison fill");
            }
            Ok(())
        }
    }
    let f = support::sim(1);
    let guard = DebugGuardResource::new(
        f.resource.clone(),
        GuardConfig::new().poison(Panicky(AtomicUsize::new(0))),
    );
    let block = guard.allocate(4096, f.stream(0), T).unwrap();
    assert!(quietly(|| guard.deallocate(block.clone())).is_err());
    assert_eq!(guard.block_state(block.id()), Some(BlockState::Live));
    assert_eq!(guard.quarantined_bytes(), 0);
    guard
        .prepare_block_use(block.id(), f.stream(0), Access::Read)
        .unwrap();
    guard.deallocate(block.clone()).unwrap();
    assert_eq!(guard.block_state(block.id()), Some(BlockState::Quarantined));
    assert_eq!(guard.flush().unwrap(), 4096);
    f.resource.reap_pending().unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

/// A `tracing` subscriber that panics on every event.
struct PanickingSubscriber;

impl tracing::Subscriber for PanickingSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        panic!("user subscriber: {}", event.metadata().name());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A subscriber that panics on the event after the inner allocation: the
/// block goes back to the inner resource as the panic unwinds, instead of
/// staying live with no descriptor anyone holds.
#[test]
fn a_panicking_subscriber_after_the_allocation_leaks_nothing() {
    let f = support::sim(1);
    let r = TracingResource::new(f.resource.clone());
    let unwound = tracing::subscriber::with_default(PanickingSubscriber, || {
        quietly(|| r.allocate(4096, f.stream(0), T))
    });
    assert!(unwound.is_err());
    assert_eq!(f.resource.live_bytes(), 0, "no block without a descriptor");
    assert_eq!(f.resource.live_blocks(), 0);
    f.resource.reap_pending().unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 0);
    f.sim.as_ref().unwrap().run_until_idle();
    assert_eq!(f.sim.as_ref().unwrap().free_bytes(), 64 << 30);
}

/// A decorator whose `reap_through` panics the first `panics` times it is
/// called on the watchdog thread.
struct PanicsInBackground<R> {
    inner: R,
    panics: AtomicUsize,
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it (or panics before it does).
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for PanicsInBackground<R> {
    streamalloc::forward_to_inner!(inner; supports_block_use_tracking, record_block_use, prepare_block_use, finish_block_use, allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams, allocation_limit, budget_reliefs, capture_status, release_capture);
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.inner.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.inner.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }
    fn reap_pending(&self) -> ResourceResult<()> {
        self.inner.reap_pending()
    }
    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.inner.pending_free_seq(stream)
    }
    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        let background = std::thread::current().name() == Some("streamalloc-watchdog");
        if background
            && self
                .panics
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("user decorator on the watchdog thread");
        }
        self.inner.reap_through(stream, seq)
    }
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.inner.block_state(block)
    }
}

/// A decorator that panics when the watchdog thread calls it: the watchdog
/// survives, the notification that was being applied is not lost, and the
/// free reaches the accounting without anyone polling or synchronizing.
#[test]
fn a_decorator_panicking_on_the_watchdog_thread_wedges_nothing() {
    let device = streamalloc::Device::simulated(&SimGpu::new(), 1);
    let bottom = Arc::new(SimResource::new(&device));
    let stack = PanicsInBackground {
        inner: bottom.clone(),
        panics: AtomicUsize::new(2),
    };
    // SAFETY: the stack's bottom resource was made on `device`.
    let res = unsafe { AsyncResource::with_device(stack, &device) }.unwrap();
    let s = device.stream(0).unwrap();
    let block = res.try_allocate(4096, s, T).unwrap();
    // The handle is dropped: only the watchdog applies the notification.
    drop(res.deallocate(block).unwrap());
    let start = Instant::now();
    while bottom.bytes_outstanding() != 0 {
        assert!(
            start.elapsed() < HANG,
            "the free never reached the accounting (watchdog dead?)"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        res.inner().panics.load(Ordering::Acquire),
        0,
        "it did panic"
    );
    // And it keeps working.
    let block = res.try_allocate(4096, s, T).unwrap();
    drop(res.deallocate(block).unwrap());
    let start = Instant::now();
    while bottom.bytes_outstanding() != 0 {
        assert!(start.elapsed() < HANG, "the watchdog stopped");
        std::thread::sleep(Duration::from_millis(1));
    }
}
