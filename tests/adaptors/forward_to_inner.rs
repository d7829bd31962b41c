//! `forward_to_inner!` as a crate outside streamalloc uses it: decorators
//! written here, with only the crate's public paths, that change
//! `allocate` and forward everything else, by `all_but_allocate` or by the
//! trait's groups. Every forwarded call must reach the resource below
//! (a recorder counts them), and the real effects must show: the budget's
//! relief list, the frees reaped, the uses tracked across streams.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use streamalloc::gpu::CaptureStatus;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, Budget, BudgetRelief, BudgetResource, CaptureId,
    CompletedUses, Device, DeviceAccess, DeviceBlock, DeviceMemoryResource, MemorySnapshot,
    ResourceResult, SimResource, SleepPlan, StreamId,
};

/// A user's decorator: counts allocations, forwards the rest in one word.
struct Counting<R> {
    inner: R,
    allocations: AtomicU64,
}

// SAFETY: every block and stream comes from `inner` unchanged, and every
// other call is `inner`'s own.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Counting<R> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        let block = self.inner.allocate(bytes, stream, tag)?;
        self.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(block)
    }
    streamalloc::forward_to_inner!(inner; all_but_allocate);
}

/// The same, forwarding by the trait's groups (a tuple struct: field `0`).
struct Grouped<R>(R);

// SAFETY: as `Counting`.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Grouped<R> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        self.0.allocate(bytes, stream, tag)
    }
    streamalloc::forward_to_inner!(0; deallocate, device_ordinal, bytes_outstanding, frees,
        use_tracking, capture, costs, sleep, observing);
}

/// Below the decorator under test: writes down each method called on it,
/// then calls the same method of the resource it wraps (written out by
/// hand, so that the check does not rest on the macro it checks).
struct Recorder<R> {
    inner: R,
    calls: Mutex<Vec<&'static str>>,
}

impl<R> Recorder<R> {
    fn new(inner: R) -> Self {
        Recorder {
            inner,
            calls: Mutex::new(Vec::new()),
        }
    }
    fn saw(&self, method: &'static str) {
        self.calls.lock().unwrap().push(method);
    }
    fn take(&self) -> Vec<&'static str> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

// SAFETY: every method is the same method of `inner`, after a note.
unsafe impl<R: DeviceMemoryResource> DeviceMemoryResource for Recorder<R> {
    fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        self.saw("allocate");
        self.inner.allocate(bytes, stream, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.saw("deallocate");
        self.inner.deallocate(block)
    }
    fn deallocate_completed(
        &self,
        block: DeviceBlock,
        completed: CompletedUses,
    ) -> ResourceResult<()> {
        self.saw("deallocate_completed");
        self.inner.deallocate_completed(block, completed)
    }
    fn device_ordinal(&self) -> u32 {
        self.saw("device_ordinal");
        self.inner.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.saw("bytes_outstanding");
        self.inner.bytes_outstanding()
    }
    fn device_access(&self) -> Option<DeviceAccess> {
        self.saw("device_access");
        self.inner.device_access()
    }
    fn reap_pending(&self) -> ResourceResult<()> {
        self.saw("reap_pending");
        self.inner.reap_pending()
    }
    fn pending_free_seq(&self, stream: StreamId) -> u64 {
        self.saw("pending_free_seq");
        self.inner.pending_free_seq(stream)
    }
    fn reap_through(&self, stream: StreamId, seq: u64) -> usize {
        self.saw("reap_through");
        self.inner.reap_through(stream, seq)
    }
    fn release_idle(&self) -> ResourceResult<usize> {
        self.saw("release_idle");
        self.inner.release_idle()
    }
    fn frees_across_streams(&self) -> bool {
        self.saw("frees_across_streams");
        self.inner.frees_across_streams()
    }
    fn frees_only_queue(&self) -> bool {
        self.saw("frees_only_queue");
        self.inner.frees_only_queue()
    }
    fn supports_block_use_tracking(&self) -> bool {
        self.saw("supports_block_use_tracking");
        self.inner.supports_block_use_tracking()
    }
    fn record_block_use(&self, block: &DeviceBlock, use_stream: StreamId) -> ResourceResult<()> {
        self.saw("record_block_use");
        self.inner.record_block_use(block, use_stream)
    }
    fn prepare_block_use(
        &self,
        block: BlockId,
        stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.saw("prepare_block_use");
        self.inner.prepare_block_use(block, stream, access)
    }
    fn finish_block_use(
        &self,
        block: BlockId,
        stream: StreamId,
        access: Access,
    ) -> ResourceResult<()> {
        self.saw("finish_block_use");
        self.inner.finish_block_use(block, stream, access)
    }
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.saw("block_state");
        self.inner.block_state(block)
    }
    fn capture_status(&self, stream: StreamId) -> ResourceResult<CaptureStatus> {
        self.saw("capture_status");
        self.inner.capture_status(stream)
    }
    fn release_capture(&self, capture: CaptureId, after: StreamId) -> ResourceResult<()> {
        self.saw("release_capture");
        self.inner.release_capture(capture, after)
    }
    fn allocation_cost(&self, bytes: usize, stream: StreamId) -> usize {
        self.saw("allocation_cost");
        self.inner.allocation_cost(bytes, stream)
    }
    fn allocation_cost_is_exact(&self) -> bool {
        self.saw("allocation_cost_is_exact");
        self.inner.allocation_cost_is_exact()
    }
    fn allocation_limit(&self) -> Option<usize> {
        self.saw("allocation_limit");
        self.inner.allocation_limit()
    }
    fn budget_reliefs(&self, out: &mut Vec<BudgetRelief>) {
        self.saw("budget_reliefs");
        self.inner.budget_reliefs(out)
    }
    fn begin_sleep(&self, plan: &SleepPlan) -> ResourceResult<Vec<StreamId>> {
        self.saw("begin_sleep");
        self.inner.begin_sleep(plan)
    }
    fn settle_sleep(&self) -> ResourceResult<bool> {
        self.saw("settle_sleep");
        self.inner.settle_sleep()
    }
    fn wake(&self) -> ResourceResult<Vec<StreamId>> {
        self.saw("wake");
        self.inner.wake()
    }
    fn snapshot_into(&self, snapshot: &mut MemorySnapshot) {
        self.saw("snapshot_into");
        self.inner.snapshot_into(snapshot)
    }
    fn visit_layers(&self, visit: &mut dyn FnMut(&dyn Any)) {
        self.saw("visit_layers");
        self.inner.visit_layers(visit)
    }
}

const MIB: usize = 1 << 20;

/// The stack under test: a budget over the stream-ordered resource, and
/// the recorder above the budget.
type Below = Recorder<BudgetResource<SimResource>>;

/// A manual simulated device with two streams, a budget of `limit` over its
/// stream-ordered resource, and the recorder above the budget.
fn stack(limit: usize) -> (Arc<SimGpu>, Device<SimGpu>, Budget, Arc<Below>) {
    let gpu = SimGpu::builder().manual().capacity(1 << 30).build();
    let device = Device::simulated(&gpu, 2);
    let budget = Budget::new(limit);
    let inner = BudgetResource::new(SimResource::new(&device), &budget);
    (gpu, device, budget, Arc::new(Recorder::new(inner)))
}

/// Calls every method but `allocate`, `device_access` and
/// `deallocate_completed` (whose proof only the crate makes) on `outer`
/// once, and checks that each reached `recorder` exactly once.
fn every_call_reaches<D: DeviceMemoryResource, R: DeviceMemoryResource>(
    outer: &D,
    recorder: &Recorder<R>,
    device: &Device<SimGpu>,
) {
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());
    let block = outer.allocate(MIB, s0, AllocTag("forwarded")).unwrap();
    recorder.take();

    outer.device_ordinal();
    outer.bytes_outstanding();
    outer.supports_block_use_tracking();
    outer.record_block_use(&block, s1).unwrap();
    outer
        .prepare_block_use(block.id(), s1, Access::Read)
        .unwrap();
    outer
        .finish_block_use(block.id(), s1, Access::Read)
        .unwrap();
    outer.block_state(block.id());
    outer.capture_status(s0).unwrap();
    outer.release_capture(CaptureId::new(1), s0).unwrap();
    outer.allocation_cost(MIB, s0);
    outer.allocation_cost_is_exact();
    outer.allocation_limit();
    outer.budget_reliefs(&mut Vec::new());
    outer.deallocate(block).unwrap();
    outer.pending_free_seq(s0);
    outer.reap_through(s0, 0);
    outer.reap_pending().unwrap();
    outer.release_idle().unwrap();
    outer.frees_across_streams();
    assert!(
        outer.frees_only_queue(),
        "the budget over the stream-ordered resource"
    );
    let _ = outer.begin_sleep(&SleepPlan::new());
    outer.settle_sleep().unwrap();
    let _ = outer.wake();
    outer.snapshot_into(&mut MemorySnapshot::new(0));
    outer.visit_layers(&mut |_| {});

    let mut seen = recorder.take();
    seen.sort_unstable();
    let mut expected = vec![
        "allocation_cost",
        "allocation_cost_is_exact",
        "allocation_limit",
        "begin_sleep",
        "block_state",
        "budget_reliefs",
        "bytes_outstanding",
        "capture_status",
        "deallocate",
        "device_ordinal",
        "finish_block_use",
        "frees_across_streams",
        "frees_only_queue",
        "pending_free_seq",
        "prepare_block_use",
        "reap_pending",
        "reap_through",
        "record_block_use",
        "release_capture",
        "release_idle",
        "settle_sleep",
        "snapshot_into",
        "supports_block_use_tracking",
        "visit_layers",
        "wake",
    ];
    expected.sort_unstable();
    assert_eq!(
        seen, expected,
        "every forwarded call reaches the inner resource once"
    );

    // `device_access` is not forwarded: a decorator keeps `None`, so that a
    // tier above allocates through it.
    assert!(outer.device_access().is_none());
    assert!(recorder.take().is_empty());
}

#[test]
fn all_but_allocate_forwards_every_call_to_the_inner_resource() {
    let (_gpu, device, _budget, recorder) = stack(64 * MIB);
    let outer = Counting {
        inner: recorder.clone(),
        allocations: AtomicU64::new(0),
    };
    every_call_reaches(&outer, &recorder, &device);
    assert_eq!(
        outer.allocations.load(Ordering::Relaxed),
        1,
        "allocate is the decorator's own"
    );
}

#[test]
fn the_trait_groups_forward_every_call_to_the_inner_resource() {
    let (_gpu, device, _budget, recorder) = stack(64 * MIB);
    every_call_reaches(&Grouped(recorder.clone()), &recorder, &device);
}

/// Not only calls: what the layers below do shows through the decorator.
#[test]
fn reliefs_frees_and_uses_reach_the_budget_and_the_resource_below() {
    let (gpu, device, budget, recorder) = stack(8 * MIB);
    let outer = Counting {
        inner: recorder.clone(),
        allocations: AtomicU64::new(0),
    };
    let (s0, s1) = (device.stream(0).unwrap(), device.stream(1).unwrap());

    // Costs: the budget's relief list and limit, as the budget reports them.
    let (mut mine, mut below) = (Vec::new(), Vec::new());
    outer.budget_reliefs(&mut mine);
    recorder.inner.budget_reliefs(&mut below);
    assert_eq!(mine.len(), 1, "the budget below reports its relief list");
    assert_eq!(mine, below);
    assert_eq!(outer.allocation_limit(), Some(8 * MIB));

    // Use tracking: a read on another stream is tracked below, and a use of
    // a block nobody handed out is refused there.
    assert!(outer.supports_block_use_tracking());
    let block = outer.allocate(4 * MIB, s0, AllocTag("used")).unwrap();
    assert_eq!(budget.in_use(), 4 * MIB);
    outer
        .prepare_block_use(block.id(), s1, Access::Read)
        .unwrap();
    outer
        .finish_block_use(block.id(), s1, Access::Read)
        .unwrap();
    assert_eq!(outer.block_state(block.id()), Some(BlockState::Live));
    let foreign = BlockId::new(streamalloc::ResourceId::fresh(), 1);
    assert!(outer.prepare_block_use(foreign, s1, Access::Read).is_err());

    // Frees: queued below, reaped through the decorator, the budget
    // released once the free has run.
    outer.deallocate(block).unwrap();
    assert!(outer.pending_free_seq(s0) > 0, "the free is queued below");
    assert_eq!(
        outer.bytes_outstanding(),
        4 * MIB,
        "counted until its free runs"
    );
    gpu.run_until_idle();
    outer.reap_pending().unwrap();
    assert_eq!(outer.bytes_outstanding(), 0);
    assert_eq!(budget.in_use(), 0);
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());

    // Observing: the budget's handle is found through the decorator.
    let mut budgets = 0;
    outer.visit_layers(&mut |layer| {
        budgets += usize::from(layer.downcast_ref::<Budget>().is_some())
    });
    assert_eq!(budgets, 1);
}
