//! DebugGuardResource: quarantine, caps, poison, and refusal of bad frees.

use crate::support;

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, DeviceMemoryResource, ResourceError,
    ResourceId, ResourceResult, SimResource, StreamId,
};
use streamalloc::{DebugGuardResource, GuardConfig, MemsetPoisonFill, PoisonFill};
use support::NoTracking;

const T: AllocTag = AllocTag("test");

#[test]
fn bad_input_changes_nothing() {
    support::check_bad_input(
        |inner| DebugGuardResource::new(inner, GuardConfig::new()),
        |g| (g.quarantined(), g.quarantined_bytes()),
    );
}

#[test]
fn forwards_what_it_does_not_change() {
    support::check_forwarding(
        |inner| DebugGuardResource::new(inner, GuardConfig::new()),
        |guard| {
            guard.flush().unwrap();
        },
    );
    let f = support::sim(1);
    let g = DebugGuardResource::new(NoTracking(f.resource.clone()), GuardConfig::new());
    assert!(!g.supports_block_use_tracking());
}

#[test]
fn freed_blocks_are_quarantined_fifo_under_the_block_cap() {
    let f = support::sim(1);
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().max_blocks(2));
    let blocks: Vec<_> = (0..3)
        .map(|i| g.allocate(100 * (i + 1), f.stream(0), T).unwrap())
        .collect();
    g.deallocate(blocks[0].clone()).unwrap();
    assert_eq!(g.block_state(blocks[0].id()), Some(BlockState::Quarantined));
    assert_eq!(f.resource.live_bytes(), 600, "not freed in the inner yet");
    assert_eq!(f.resource.pending_free_bytes(), 0);
    g.deallocate(blocks[1].clone()).unwrap();
    g.deallocate(blocks[2].clone()).unwrap();
    // The oldest went out to make room.
    assert_eq!(g.block_state(blocks[0].id()), Some(BlockState::Retired));
    assert_eq!(g.quarantined(), vec![blocks[1].clone(), blocks[2].clone()]);
    assert_eq!(g.quarantined_bytes(), 500);
    assert_eq!(f.resource.pending_free_bytes(), 100);
    assert_eq!(
        g.bytes_outstanding(),
        600,
        "quarantined bytes are outstanding"
    );

    assert_eq!(g.flush().unwrap(), 500);
    assert!(g.quarantined().is_empty());
    assert_eq!(g.block_state(blocks[2].id()), Some(BlockState::Retired));
    assert_eq!(f.resource.pending_free_bytes(), 600);
}

#[test]
fn the_byte_cap_evicts_and_oversized_blocks_go_straight_through() {
    let f = support::sim(1);
    let g = DebugGuardResource::new(
        f.resource.clone(),
        GuardConfig::new().max_blocks(100).max_bytes(1000),
    );
    let a = g.allocate(600, f.stream(0), T).unwrap();
    let b = g.allocate(600, f.stream(0), T).unwrap();
    let big = g.allocate(2000, f.stream(0), T).unwrap();
    g.deallocate(a.clone()).unwrap();
    g.deallocate(b.clone()).unwrap();
    assert_eq!(g.block_state(a.id()), Some(BlockState::Retired));
    assert_eq!(g.block_state(b.id()), Some(BlockState::Quarantined));
    g.deallocate(big.clone()).unwrap();
    assert_eq!(g.block_state(big.id()), Some(BlockState::Retired));
    assert_eq!(g.quarantined_bytes(), 600);
}

#[test]
fn bad_frees_are_refused_and_change_nothing() {
    let f = support::sim(1);
    let other = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().max_blocks(1));
    let block = g.allocate(256, f.stream(0), T).unwrap();
    let keep = g.allocate(128, f.stream(0), T).unwrap();
    g.deallocate(block.clone()).unwrap();

    let snapshot = |g: &DebugGuardResource<_>| {
        (
            g.quarantined(),
            g.quarantined_bytes(),
            f.resource.live_bytes(),
            f.resource.pending_free_bytes(),
            gpu.call_count(DriverCall::FreeAsync),
        )
    };
    let before = snapshot(&g);

    // A second free while quarantined.
    assert_eq!(
        g.deallocate(block.clone()),
        Err(ResourceError::DoubleFree { block: block.id() })
    );
    // A forged descriptor of a live block (wrong size).
    let forged = DeviceBlock::new(keep.id(), keep.ptr(), 999, keep.stream(), T);
    assert_eq!(
        g.deallocate(forged),
        Err(ResourceError::UnknownBlock { block: keep.id() })
    );
    // An id of this resource never handed out.
    let never = BlockId::new(keep.id().resource(), 10_000);
    let never_block = DeviceBlock::new(never, 0x1000, 8, keep.stream(), T);
    assert_eq!(
        g.deallocate(never_block),
        Err(ResourceError::UnknownBlock { block: never })
    );
    // A block of another resource, and one of no resource at all.
    let foreign = other.resource.allocate(64, other.stream(0), T).unwrap();
    assert_eq!(
        g.deallocate(foreign.clone()),
        Err(ResourceError::ForeignBlock {
            block: foreign.id()
        })
    );
    let stranger = BlockId::new(ResourceId::fresh(), 1);
    assert!(matches!(
        g.deallocate(DeviceBlock::new(stranger, 1, 1, keep.stream(), T)),
        Err(ResourceError::ForeignBlock { .. })
    ));
    assert_eq!(snapshot(&g), before);

    // After the real free, the stale id is still a double free.
    g.flush().unwrap();
    let after_flush = snapshot(&g);
    assert_eq!(
        g.deallocate(block.clone()),
        Err(ResourceError::DoubleFree { block: block.id() })
    );
    assert_eq!(snapshot(&g), after_flush);
    g.deallocate(keep).unwrap();
}

#[test]
fn hooks_on_a_quarantined_block_are_use_after_free() {
    let f = support::sim(2);
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new());
    let block = g.allocate(256, f.stream(0), T).unwrap();
    g.deallocate(block.clone()).unwrap();
    let events = f.resource.pending_use_event_count(block.ptr());
    assert_eq!(events, Some(0), "still live in the inner");
    for r in [
        g.prepare_block_use(block.id(), f.stream(1), Access::Read),
        g.finish_block_use(block.id(), f.stream(1), Access::Read),
        g.record_block_use(&block, f.stream(1)),
    ] {
        assert_eq!(r, Err(ResourceError::DoubleFree { block: block.id() }));
    }
    assert_eq!(f.resource.pending_use_event_count(block.ptr()), events);
}

#[test]
fn poison_is_filled_after_every_use_without_a_race() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    let (a, b) = (f.stream(0), f.stream(1));
    // SAFETY: the guard is the poison's only user and fills only blocks live in that resource.
    let poison = unsafe { MemsetPoisonFill::for_resource(&f.resource, 0xA5) };
    assert_eq!(poison.value(), 0xA5);
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().poison(poison));
    let block = g.allocate(4096, a, T).unwrap();
    // A reader on another stream, declared through the hooks.
    g.prepare_block_use(block.id(), b, Access::Read).unwrap();
    gpu.launch_kernel(f.pool.raw(b).unwrap(), &[MemAccess::read(&block)])
        .unwrap();
    g.finish_block_use(block.id(), b, Access::Read).unwrap();

    let memsets = gpu.call_count(DriverCall::MemsetAsync);
    g.deallocate(block.clone()).unwrap();
    assert_eq!(gpu.call_count(DriverCall::MemsetAsync), memsets + 1);
    g.flush().unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn a_failed_poison_leaves_the_block_live() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    // SAFETY: the guard is the poison's only user and fills only blocks live in that resource.
    let poison = unsafe { MemsetPoisonFill::for_resource(&f.resource, 0) };
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().poison(poison));
    let block = g.allocate(64, f.stream(0), T).unwrap();
    gpu.fail_nth(DriverCall::MemsetAsync, 1);
    assert!(matches!(
        g.deallocate(block.clone()),
        Err(ResourceError::Driver {
            call: DriverCall::MemsetAsync,
            ..
        })
    ));
    assert_eq!(g.block_state(block.id()), Some(BlockState::Live));
    assert!(g.quarantined().is_empty());
    g.deallocate(block.clone()).unwrap();
    assert_eq!(g.block_state(block.id()), Some(BlockState::Quarantined));
}

#[test]
fn a_failed_eviction_keeps_the_quarantine_as_it_was() {
    let f = support::sim(1);
    let gpu = f.sim.clone().unwrap();
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().max_blocks(1));
    let a = g.allocate(64, f.stream(0), T).unwrap();
    let b = g.allocate(64, f.stream(0), T).unwrap();
    g.deallocate(a.clone()).unwrap();
    gpu.fail_nth(DriverCall::FreeAsync, 1);
    assert!(g.deallocate(b.clone()).is_err());
    assert_eq!(g.quarantined(), vec![a.clone()]);
    assert_eq!(g.block_state(b.id()), Some(BlockState::Live));
    g.deallocate(b.clone()).unwrap();
    assert_eq!(g.quarantined(), vec![b]);
    assert_eq!(g.block_state(a.id()), Some(BlockState::Retired));
}

#[test]
fn dropping_the_guard_frees_the_quarantine() {
    let f = support::sim(1);
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new());
    let block = g.allocate(512, f.stream(0), T).unwrap();
    g.deallocate(block).unwrap();
    assert_eq!(f.resource.live_bytes(), 512);
    drop(g);
    assert_eq!(f.resource.live_bytes(), 0);
    assert_eq!(f.resource.pending_free_bytes(), 512);
}

/// Runs `f` on its own thread and waits at most 10 s for its answer, so a
/// deadlock fails the test instead of hanging the suite.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(out) => out,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: no answer within 10 s (deadlock?)"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// A poison that runs a closure: user code that may call back into the
/// guard.
struct FnPoison<F>(F);

impl<F: Fn(&DeviceBlock) -> ResourceResult<()> + Send + Sync + 'static> PoisonFill for FnPoison<F> {
    fn fill(&self, block: &DeviceBlock) -> ResourceResult<()> {
        (self.0)(block)
    }
}

type SimGuard = DebugGuardResource<Arc<SimResource>>;

/// A place for the guard that its own poison (or inner resource) can reach
/// once the guard is built; weak, so the guard is still dropped (and
/// flushed) at the end of the test.
type GuardCell<G> = Arc<OnceLock<Weak<G>>>;

fn reach<G>(cell: &GuardCell<G>) -> Arc<G> {
    cell.get().and_then(Weak::upgrade).expect("the guard")
}

#[test]
fn a_poison_may_call_back_into_the_guard() {
    let f = support::sim(2);
    let (a, b) = (f.stream(0), f.stream(1));
    let cell: GuardCell<SimGuard> = Arc::default();
    let other: Arc<OnceLock<DeviceBlock>> = Arc::default();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let poison = {
        let (cell, other, seen) = (cell.clone(), other.clone(), seen.clone());
        FnPoison(move |block: &DeviceBlock| {
            let g = reach(&cell);
            let other = other.get().expect("the other block");
            seen.lock().unwrap().push((
                g.block_state(block.id()),
                g.block_state(other.id()),
                g.prepare_block_use(block.id(), b, Access::Read),
                g.prepare_block_use(other.id(), b, Access::Read)
                    .and_then(|()| g.finish_block_use(other.id(), b, Access::Read)),
                g.record_block_use(other, b),
                g.quarantined_bytes(),
            ));
            Ok(())
        })
    };
    let g = Arc::new(DebugGuardResource::new(
        f.resource.clone(),
        GuardConfig::new().poison(poison),
    ));
    cell.set(Arc::downgrade(&g)).unwrap();
    let block = g.allocate(256, a, T).unwrap();
    other.set(g.allocate(128, a, T).unwrap()).unwrap();

    let freed = {
        let (g, block) = (g.clone(), block.clone());
        within("deallocate with a re-entrant poison", move || {
            g.deallocate(block)
        })
    };
    assert_eq!(freed, Ok(()));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(
            // Being freed into the quarantine: reported where it goes, and
            // a hook on it is refused as racing its free.
            Some(BlockState::Quarantined),
            Some(BlockState::Live),
            Err(ResourceError::FreeInFlight { block: block.id() }),
            Ok(()),
            Ok(()),
            0,
        )]
    );
    assert_eq!(g.block_state(block.id()), Some(BlockState::Quarantined));
    assert_eq!(g.quarantined_bytes(), 256);
}

#[test]
fn hooks_and_a_racing_free_do_not_wait_for_a_fill() {
    let f = support::sim(2);
    let (a, b) = (f.stream(0), f.stream(1));
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let poison = FnPoison(move |block: &DeviceBlock| {
        entered_tx.send(block.id()).unwrap();
        go_rx.lock().unwrap().recv().unwrap();
        Ok(())
    });
    let g = Arc::new(DebugGuardResource::new(
        f.resource.clone(),
        GuardConfig::new().poison(poison),
    ));
    let blk_a = g.allocate(256, a, T).unwrap();
    let blk_b = g.allocate(128, a, T).unwrap();

    let freer = {
        let (g, blk_a) = (g.clone(), blk_a.clone());
        thread::spawn(move || g.deallocate(blk_a))
    };
    // The fill of A is running (and blocked) on the freer's thread.
    let filling = entered.recv_timeout(Duration::from_secs(10));
    assert_eq!(filling, Ok(blk_a.id()));

    let probed = {
        let (g, blk_a, blk_b) = (g.clone(), blk_a.clone(), blk_b.clone());
        within("hooks while a fill runs", move || {
            (
                g.block_state(blk_b.id()),
                g.prepare_block_use(blk_b.id(), b, Access::Read),
                g.finish_block_use(blk_b.id(), b, Access::Read),
                g.record_block_use(&blk_b, b),
                g.block_state(blk_a.id()),
                g.finish_block_use(blk_a.id(), b, Access::Read),
                g.deallocate(blk_a.clone()),
                g.quarantined(),
            )
        })
    };
    go.send(()).unwrap();
    assert_eq!(
        probed,
        (
            Some(BlockState::Live),
            Ok(()),
            Ok(()),
            Ok(()),
            Some(BlockState::Quarantined),
            Err(ResourceError::FreeInFlight { block: blk_a.id() }),
            Err(ResourceError::FreeInFlight { block: blk_a.id() }),
            vec![],
        )
    );
    assert_eq!(freer.join().unwrap(), Ok(()));
    assert_eq!(g.quarantined(), vec![blk_a.clone()]);
    // The racing free changed nothing: now it is a plain double free.
    assert_eq!(
        g.deallocate(blk_a.clone()),
        Err(ResourceError::DoubleFree { block: blk_a.id() })
    );
}

#[test]
fn a_failed_poison_fill_changes_nothing() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    let (a, b) = (f.stream(0), f.stream(1));
    // SAFETY: the guard is the poison's only user and fills only blocks live in that resource.
    let poison = unsafe { MemsetPoisonFill::for_resource(&f.resource, 0x5A) };
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().poison(poison));
    let held = g.allocate(100, a, T).unwrap();
    let block = g.allocate(300, a, T).unwrap();
    g.deallocate(held.clone()).unwrap();
    // A recorded read on another stream, so the block has uses to keep.
    g.prepare_block_use(block.id(), b, Access::Read).unwrap();
    gpu.launch_kernel(f.pool.raw(b).unwrap(), &[MemAccess::read(&block)])
        .unwrap();
    g.finish_block_use(block.id(), b, Access::Read).unwrap();

    let snapshot = |g: &SimGuard| {
        (
            g.quarantined(),
            g.quarantined_bytes(),
            g.block_state(block.id()),
            g.block_state(held.id()),
            g.bytes_outstanding(),
            f.resource.live_bytes(),
            f.resource.pending_free_bytes(),
            f.resource.pending_use_event_count(block.ptr()),
            gpu.call_count(DriverCall::FreeAsync),
        )
    };
    let before = snapshot(&g);
    gpu.fail_nth(DriverCall::MemsetAsync, 1);
    assert!(matches!(
        g.deallocate(block.clone()),
        Err(ResourceError::Driver {
            call: DriverCall::MemsetAsync,
            ..
        })
    ));
    assert_eq!(snapshot(&g), before);
    assert_eq!(before.2, Some(BlockState::Live));

    // The mark came off: hooks work and the block frees.
    g.prepare_block_use(block.id(), b, Access::Read).unwrap();
    g.finish_block_use(block.id(), b, Access::Read).unwrap();
    g.deallocate(block.clone()).unwrap();
    assert_eq!(g.quarantined(), vec![held, block.clone()]);
    assert_eq!(g.quarantined_bytes(), 400);
    assert_eq!(g.block_state(block.id()), Some(BlockState::Quarantined));
    g.flush().unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

/// What [`Spy`] saw of its guard while the guard freed a block in it.
type Sighting = (
    Vec<DeviceBlock>,
    usize,
    Option<BlockState>,
    ResourceResult<()>,
);

/// Forwards to a simulated resource; in `deallocate` (an eviction, for a
/// guard above it), first looks at the guard above through its public API.
/// A `Spy` is the guard's inner resource, so it reaches the guard weakly.
struct Spy {
    inner: Arc<SimResource>,
    guard: GuardCell<DebugGuardResource<Spy>>,
    seen: Mutex<Vec<Sighting>>,
}

// SAFETY: blocks and streams are the inner resource's, unchanged; every
// call reaches it.
unsafe impl DeviceMemoryResource for Spy {
    streamalloc::forward_to_inner!(inner; reap_pending, pending_free_seq, reap_through, record_block_use, allocation_cost, allocation_cost_is_exact, release_idle, frees_across_streams, allocation_limit, budget_reliefs, capture_status, release_capture);
    fn allocate(&self, bytes: usize, s: StreamId, tag: AllocTag) -> ResourceResult<DeviceBlock> {
        self.inner.allocate(bytes, s, tag)
    }
    fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        // Not while the guard is being dropped (its final flush).
        if let Some(g) = self.guard.get().and_then(Weak::upgrade) {
            let sighting = (
                g.quarantined(),
                g.quarantined_bytes(),
                g.block_state(block.id()),
                g.prepare_block_use(block.id(), block.stream(), Access::Read),
            );
            self.seen.lock().unwrap().push(sighting);
        }
        self.inner.deallocate(block)
    }
    fn device_ordinal(&self) -> u32 {
        self.inner.device_ordinal()
    }
    fn bytes_outstanding(&self) -> usize {
        self.inner.bytes_outstanding()
    }
    fn supports_block_use_tracking(&self) -> bool {
        self.inner.supports_block_use_tracking()
    }
    fn prepare_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.prepare_block_use(b, s, a)
    }
    fn finish_block_use(&self, b: BlockId, s: StreamId, a: Access) -> ResourceResult<()> {
        self.inner.finish_block_use(b, s, a)
    }
    fn block_state(&self, block: BlockId) -> Option<BlockState> {
        self.inner.block_state(block)
    }
}

#[test]
fn an_eviction_keeps_its_victim_quarantined_until_freed_and_a_failed_one_changes_nothing() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    let spy = Spy {
        inner: f.resource.clone(),
        guard: Arc::default(),
        seen: Mutex::default(),
    };
    let g = Arc::new(DebugGuardResource::new(
        spy,
        GuardConfig::new().max_blocks(1),
    ));
    g.inner().guard.set(Arc::downgrade(&g)).unwrap();
    let old = g.allocate(64, f.stream(0), T).unwrap();
    let new = g.allocate(96, f.stream(0), T).unwrap();
    g.deallocate(old.clone()).unwrap();

    let snapshot = |g: &DebugGuardResource<Spy>| {
        (
            g.quarantined(),
            g.quarantined_bytes(),
            g.block_state(old.id()),
            g.block_state(new.id()),
            g.bytes_outstanding(),
            f.resource.live_bytes(),
            f.resource.pending_free_bytes(),
        )
    };
    let before = snapshot(&g);
    let free_new = |g: &Arc<DebugGuardResource<Spy>>| {
        let (g, new) = (g.clone(), new.clone());
        within("deallocate with an eviction", move || g.deallocate(new))
    };
    // While the inner free of the victim runs, the victim is still in the
    // quarantine (peeked, not popped): its hooks are use after free.
    let during = (
        vec![old.clone()],
        64,
        Some(BlockState::Quarantined),
        Err(ResourceError::DoubleFree { block: old.id() }),
    );

    gpu.fail_nth(DriverCall::FreeAsync, 1);
    assert!(matches!(
        free_new(&g),
        Err(ResourceError::Driver {
            call: DriverCall::FreeAsync,
            ..
        })
    ));
    assert_eq!(snapshot(&g), before);
    assert_eq!(
        std::mem::take(&mut *g.inner().seen.lock().unwrap()),
        vec![during.clone()]
    );
    assert_eq!(g.block_state(new.id()), Some(BlockState::Live));
    g.prepare_block_use(new.id(), f.stream(1), Access::Read)
        .unwrap();
    g.finish_block_use(new.id(), f.stream(1), Access::Read)
        .unwrap();

    assert_eq!(free_new(&g), Ok(()));
    assert_eq!(*g.inner().seen.lock().unwrap(), vec![during]);
    assert_eq!(g.quarantined(), vec![new.clone()]);
    assert_eq!(g.quarantined_bytes(), 96);
    assert_eq!(g.block_state(old.id()), Some(BlockState::Retired));
    assert_eq!(f.resource.pending_free_bytes(), 64);
}

/// A descriptor of a live block with its id, address and size but another
/// stream: refused before the poison fill, which would otherwise be queued
/// on that stream, unordered with the block's own stream, where the memory
/// is reused once the free is queued.
#[test]
fn a_descriptor_with_the_wrong_stream_is_refused_before_the_poison() {
    let f = support::sim(2);
    let gpu = f.sim.clone().unwrap();
    // SAFETY: the guard is the poison's only user and fills only blocks live in that resource.
    let poison = unsafe { MemsetPoisonFill::for_resource(&f.resource, 0xA5) };
    let g = DebugGuardResource::new(f.resource.clone(), GuardConfig::new().poison(poison));
    let block = g.allocate(256, f.stream(0), T).unwrap();
    let forged = DeviceBlock::new(block.id(), block.ptr(), block.size(), f.stream(1), T);
    let memsets = gpu.call_count(DriverCall::MemsetAsync);
    assert_eq!(
        g.deallocate(forged),
        Err(ResourceError::UnknownBlock { block: block.id() })
    );
    assert_eq!(gpu.call_count(DriverCall::MemsetAsync), memsets);
    assert!(g.quarantined().is_empty());
    assert_eq!(g.block_state(block.id()), Some(BlockState::Live));
    g.deallocate(block).unwrap();
    g.flush().unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
