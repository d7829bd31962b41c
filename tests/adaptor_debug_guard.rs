//! DebugGuard: quarantine, caps, poison, and refusal of bad frees.

mod common;
mod support;

use streamalloc::adaptors::{DebugGuard, GpuPoison, GuardConfig};
use streamalloc::error::DriverCall;
use streamalloc::gpu::sim::MemAccess;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, DeviceBlock, DeviceMemoryResource, ResourceError,
    ResourceId,
};
use support::NoTracking;

const T: AllocTag = AllocTag("test");

#[test]
fn bad_input_changes_nothing() {
    support::check_bad_input(
        |inner| DebugGuard::new(inner, GuardConfig::new()),
        |g| (g.quarantined(), g.quarantined_bytes()),
    );
}

#[test]
fn forwards_what_it_does_not_change() {
    support::check_forwarding(
        |inner| DebugGuard::new(inner, GuardConfig::new()),
        |guard| {
            guard.flush().unwrap();
        },
    );
    let f = common::sim(1);
    let g = DebugGuard::new(NoTracking(f.resource.clone()), GuardConfig::new());
    assert!(!g.supports_block_use_tracking());
}

#[test]
fn freed_blocks_are_quarantined_fifo_under_the_block_cap() {
    let f = common::sim(1);
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new().max_blocks(2));
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
    let f = common::sim(1);
    let g = DebugGuard::new(
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
    let f = common::sim(1);
    let other = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new().max_blocks(1));
    let block = g.allocate(256, f.stream(0), T).unwrap();
    let keep = g.allocate(128, f.stream(0), T).unwrap();
    g.deallocate(block.clone()).unwrap();

    let snapshot = |g: &DebugGuard<_>| {
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
    let f = common::sim(2);
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new());
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
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let (a, b) = (f.stream(0), f.stream(1));
    let poison = GpuPoison::for_resource(&f.resource, 0xA5);
    assert_eq!(poison.value(), 0xA5);
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new().poison(poison));
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
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let poison = GpuPoison::for_resource(&f.resource, 0);
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new().poison(poison));
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
    let f = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new().max_blocks(1));
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
    let f = common::sim(1);
    let g = DebugGuard::new(f.resource.clone(), GuardConfig::new());
    let block = g.allocate(512, f.stream(0), T).unwrap();
    g.deallocate(block).unwrap();
    assert_eq!(f.resource.live_bytes(), 512);
    drop(g);
    assert_eq!(f.resource.live_bytes(), 0);
    assert_eq!(f.resource.pending_free_bytes(), 512);
}
