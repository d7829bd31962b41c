//! The resource's own suite: the cases a peer allocator's tests run (RMM's
//! `mr` tests), each one generic body run on the simulated device in CI and
//! on a CUDA device through an `#[ignore]`d wrapper.

use crate::support;

use std::sync::mpsc;
use std::thread;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::{RaceKind, SimOp};
use streamalloc::{
    Access, AllocTag, BlockState, DeviceBlock, DeviceMemoryResource, ResourceError, StreamId,
};
use support::Fixture;
use support::{Snapshot, assert_drained, assert_quiescent_invariants, read_into, settle, write};

const TAG: AllocTag = AllocTag("test");

/// One test body, two backends: `$name::sim` in CI, `$name::cuda` on a GPU.
macro_rules! on_every_backend {
    ($($name:ident: $streams:expr;)*) => {$(
        mod $name {
            #[test]
            fn sim() {
                super::$name(&crate::support::sim($streams));
            }

            #[test]
            #[ignore = "needs a CUDA GPU"]
            fn cuda() {
                super::$name(&crate::support::cuda($streams));
            }
        }
    )*};
}

on_every_backend! {
    zero_bytes: 1;
    small_to_one_gib: 1;
    absurd_request_is_out_of_memory: 1;
    random_sizes: 1;
    mixed_random_allocate_and_free: 2;
    small_allocations_never_share_an_address: 1;
    free_on_another_thread_behind_an_event: 2;
    four_threads_at_once: 4;
    written_on_a_read_on_b_and_c_freed_on_a: 3;
    written_on_b_after_reads_on_a_and_c: 3;
}

fn overlaps(a: &DeviceBlock, b: &DeviceBlock) -> bool {
    let (a0, a1) = (a.ptr(), a.ptr() + a.size() as u64);
    let (b0, b1) = (b.ptr(), b.ptr() + b.size() as u64);
    a0 < b1 && b0 < a1
}

fn zero_bytes<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let block = r.allocate(0, f.stream(0), TAG).unwrap();
    assert_eq!(block.ptr(), 0);
    assert_eq!(block.size(), 0);
    assert_eq!(r.live_bytes(), 0);
    assert_eq!(r.bytes_outstanding(), 0);
    assert_eq!(r.block_state(block.id()), Some(BlockState::Live));
    let id = block.id();
    r.deallocate(block).unwrap();
    assert_eq!(r.block_state(id), Some(BlockState::Retired));
    settle(f);
    assert_drained(f);
}

fn small_to_one_gib<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let s = f.stream(0);
    let sizes = [4usize, 1 << 10, 1 << 20, 1 << 30];
    let mut blocks = Vec::new();
    let mut total = 0;
    for size in sizes {
        let block = r.allocate(size, s, TAG).unwrap();
        assert_ne!(block.ptr(), 0, "{size} B");
        assert_eq!(block.size(), size);
        assert_eq!(block.stream(), s);
        assert_eq!(block.tag(), TAG);
        total += size;
        assert_eq!(r.live_bytes(), total);
        blocks.push(block);
    }
    for (i, a) in blocks.iter().enumerate() {
        for b in &blocks[i + 1..] {
            assert!(!overlaps(a, b), "{a:?} overlaps {b:?}");
        }
    }
    for block in blocks {
        r.deallocate(block).unwrap();
    }
    assert_eq!(r.live_bytes(), 0);
    assert_eq!(r.pending_free_bytes(), total);
    assert_quiescent_invariants(r);
    settle(f);
    assert_drained(f);
}

fn absurd_request_is_out_of_memory<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let s = f.stream(0);
    let held = r.allocate(1 << 20, s, TAG).unwrap();
    let before = Snapshot::of(r, &[&held]);
    let pib = 1usize << 50;
    match r.allocate(pib, s, TAG) {
        Err(ResourceError::OutOfMemory {
            requested,
            available,
            stream,
        }) => {
            assert_eq!(requested, pib);
            assert!(available < pib, "available {available}");
            assert_eq!(stream, s);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    assert_eq!(Snapshot::of(r, &[&held]), before);
    // The stream stays usable.
    let next = r.allocate(4096, s, TAG).unwrap();
    write(f, &next, s);
    r.deallocate(next).unwrap();
    r.deallocate(held).unwrap();
    settle(f);
    assert_drained(f);
}

fn random_sizes<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let s = f.stream(0);
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut blocks = Vec::new();
    let mut total = 0;
    for _ in 0..100 {
        let size = rng.usize(1..=5 << 20);
        let block = r.allocate(size, s, TAG).unwrap();
        assert_eq!(block.size(), size);
        total += size;
        blocks.push(block);
    }
    assert_eq!(r.live_bytes(), total);
    assert_eq!(r.live_blocks(), 100);
    let mut sorted: Vec<&DeviceBlock> = blocks.iter().collect();
    sorted.sort_by_key(|b| b.ptr());
    for pair in sorted.windows(2) {
        assert!(!overlaps(pair[0], pair[1]), "{pair:?}");
    }
    rng.shuffle(&mut blocks);
    for block in blocks {
        r.deallocate(block).unwrap();
        assert_quiescent_invariants(r);
    }
    settle(f);
    assert_drained(f);
}

fn mixed_random_allocate_and_free<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let mut rng = fastrand::Rng::with_seed(0xa110c);
    let mut live: Vec<DeviceBlock> = Vec::new();
    let mut live_bytes = 0;
    for _ in 0..200 {
        if live.is_empty() || rng.u8(..) < 150 {
            let stream = f.stream(rng.usize(..f.streams.len()));
            let size = rng.usize(0..=5 << 20);
            let block = r.allocate(size, stream, TAG).unwrap();
            for other in &live {
                assert!(block.size() == 0 || !overlaps(&block, other));
            }
            live_bytes += size;
            live.push(block);
        } else {
            let block = live.swap_remove(rng.usize(..live.len()));
            live_bytes -= block.size();
            r.deallocate(block).unwrap();
        }
        assert_eq!(r.live_bytes(), live_bytes);
        assert_eq!(r.live_blocks(), live.len());
        assert_quiescent_invariants(r);
    }
    for block in live.drain(..) {
        r.deallocate(block).unwrap();
    }
    settle(f);
    assert_drained(f);
}

fn small_allocations_never_share_an_address<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let s = f.stream(0);
    let a = r.allocate(1, s, TAG).unwrap();
    let b = r.allocate(1, s, TAG).unwrap();
    assert_ne!(a.ptr(), b.ptr());
    assert!(!overlaps(&a, &b));
    assert_ne!(a.id(), b.id());
    r.deallocate(a).unwrap();
    r.deallocate(b).unwrap();
    settle(f);
    assert_drained(f);
}

fn free_on_another_thread_behind_an_event<G: Gpu>(f: &Fixture<G>) {
    let (a, b) = (f.stream(0), f.stream(1));
    let (tx, rx) = mpsc::channel::<DeviceBlock>();
    thread::scope(|scope| {
        scope.spawn(move || {
            let block = f.resource.allocate(1 << 16, a, TAG).unwrap();
            write(f, &block, a);
            f.resource
                .finish_block_use(block.id(), a, Access::Write)
                .unwrap();
            tx.send(block).unwrap();
        });
        scope.spawn(move || {
            let block = rx.recv().unwrap();
            let sink = f.resource.allocate(1 << 16, b, TAG).unwrap();
            f.resource
                .prepare_block_use(block.id(), b, Access::Read)
                .unwrap();
            read_into(f, &block, &sink, b);
            f.resource
                .finish_block_use(block.id(), b, Access::Read)
                .unwrap();
            assert_eq!(f.resource.pending_use_event_count(block.ptr()), Some(2));
            f.resource.deallocate(block).unwrap();
            f.resource.deallocate(sink).unwrap();
        });
    });
    settle(f);
    assert_drained(f);
}

fn four_threads_at_once<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    thread::scope(|scope| {
        for t in 0..4 {
            scope.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(t as u64);
                let s = f.stream(t);
                let mut mine = Vec::new();
                for _ in 0..100 {
                    if mine.len() < 8 && rng.bool() {
                        let block = r.allocate(rng.usize(1..=1 << 20), s, TAG).unwrap();
                        write(f, &block, s);
                        mine.push(block);
                    } else if let Some(block) = mine.pop() {
                        r.deallocate(block).unwrap();
                    }
                }
                for block in mine {
                    r.deallocate(block).unwrap();
                }
            });
        }
    });
    settle(f);
    assert_drained(f);
}

/// A block written on A, read on B and C, freed on A; the memory is then
/// reused on A and written.
fn written_on_a_read_on_b_and_c_freed_on_a<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(1 << 16, a, TAG).unwrap();
    write(f, &block, a);
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    let mut sinks = Vec::new();
    for s in [b, c] {
        let sink = r.allocate(1 << 16, s, TAG).unwrap();
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        read_into(f, &block, &sink, s);
        r.finish_block_use(block.id(), s, Access::Read).unwrap();
        sinks.push(sink);
    }
    assert_eq!(r.pending_use_event_count(block.ptr()), Some(3));
    r.deallocate(block).unwrap();
    let next = r.allocate(1 << 16, a, TAG).unwrap();
    write(f, &next, a);
    r.deallocate(next).unwrap();
    for sink in sinks {
        r.deallocate(sink).unwrap();
    }
    assert_quiescent_invariants(r);
    settle(f);
    assert_drained(f);
}

/// A block read on A and C, then written on B, read again on A, freed on A.
fn written_on_b_after_reads_on_a_and_c<G: Gpu>(f: &Fixture<G>) {
    let r = &f.resource;
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(1 << 16, a, TAG).unwrap();
    let sink_a = r.allocate(1 << 16, a, TAG).unwrap();
    let sink_c = r.allocate(1 << 16, c, TAG).unwrap();
    write(f, &block, a);
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    for (s, sink) in [(a, &sink_a), (c, &sink_c)] {
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        read_into(f, &block, sink, s);
        r.finish_block_use(block.id(), s, Access::Read).unwrap();
    }
    r.prepare_block_use(block.id(), b, Access::Write).unwrap();
    write(f, &block, b);
    r.finish_block_use(block.id(), b, Access::Write).unwrap();
    r.prepare_block_use(block.id(), a, Access::Read).unwrap();
    read_into(f, &block, &sink_a, a);
    r.finish_block_use(block.id(), a, Access::Read).unwrap();
    r.deallocate(block).unwrap();
    r.deallocate(sink_a).unwrap();
    r.deallocate(sink_c).unwrap();
    settle(f);
    assert_drained(f);
}

// ---- Cross-stream uses without the hooks: the simulated device reports them.

/// The simulated stream index a `RaceReport` names for `s`: the handle's
/// low 32 bits (above them: the host and the simulated-handle tag).
fn sim_index(f: &Fixture<impl Gpu>, s: StreamId) -> usize {
    (f.pool.raw(s).unwrap().get() & 0xFFFF_FFFF) as usize
}

#[test]
fn read_on_b_without_prepare_is_reported() {
    let f = support::sim(3);
    let r = &f.resource;
    let sim = f.sim.clone().unwrap();
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(1 << 16, a, TAG).unwrap();
    write(&f, &block, a);
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    let sink_b = r.allocate(1 << 16, b, TAG).unwrap();
    let sink_c = r.allocate(1 << 16, c, TAG).unwrap();
    // B reads with no prepare (its finish is recorded, so the free is fine).
    read_into(&f, &block, &sink_b, b);
    r.finish_block_use(block.id(), b, Access::Read).unwrap();
    r.prepare_block_use(block.id(), c, Access::Read).unwrap();
    read_into(&f, &block, &sink_c, c);
    r.finish_block_use(block.id(), c, Access::Read).unwrap();
    r.deallocate(block.clone()).unwrap();
    let races = sim.races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    assert_eq!(races[0].addr, block.ptr());
    assert_eq!(
        races[0].earlier,
        Some((SimOp::Kernel(Access::Write), sim_index(&f, a)))
    );
    assert_eq!(
        races[0].later,
        (SimOp::Kernel(Access::Read), sim_index(&f, b))
    );
}

#[test]
fn read_on_c_without_finish_races_with_the_free() {
    let f = support::sim(3);
    let r = &f.resource;
    let sim = f.sim.clone().unwrap();
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(1 << 16, a, TAG).unwrap();
    write(&f, &block, a);
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    for s in [b, c] {
        let sink = r.allocate(1 << 16, s, TAG).unwrap();
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        read_into(&f, &block, &sink, s);
        if s == b {
            r.finish_block_use(block.id(), s, Access::Read).unwrap();
        }
    }
    assert_eq!(r.pending_use_event_count(block.ptr()), Some(2));
    let ptr = block.ptr();
    r.deallocate(block).unwrap();
    let races = sim.races();
    assert_eq!(races.len(), 1, "{races:#?}");
    assert_eq!(races[0].kind, RaceKind::Unordered);
    assert_eq!(races[0].addr, ptr);
    assert_eq!(
        races[0].earlier,
        Some((SimOp::Kernel(Access::Read), sim_index(&f, c)))
    );
    assert_eq!(races[0].later, (SimOp::Free, sim_index(&f, a)));
}

#[test]
fn write_on_b_without_prepare_races_with_reads_on_a_and_c() {
    let f = support::sim(3);
    let r = &f.resource;
    let sim = f.sim.clone().unwrap();
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let block = r.allocate(1 << 16, a, TAG).unwrap();
    let sink_a = r.allocate(1 << 16, a, TAG).unwrap();
    let sink_c = r.allocate(1 << 16, c, TAG).unwrap();
    write(&f, &block, a);
    r.finish_block_use(block.id(), a, Access::Write).unwrap();
    for (s, sink) in [(a, &sink_a), (c, &sink_c)] {
        r.prepare_block_use(block.id(), s, Access::Read).unwrap();
        read_into(&f, &block, sink, s);
        r.finish_block_use(block.id(), s, Access::Read).unwrap();
    }
    // B orders itself after the write on A (a read's prepare) but not after
    // the reads: a write needs the write prepare.
    r.prepare_block_use(block.id(), b, Access::Read).unwrap();
    write(&f, &block, b);
    r.finish_block_use(block.id(), b, Access::Write).unwrap();
    let mut races = sim.races();
    races.sort_by_key(|r| r.earlier.map(|e| e.1));
    assert_eq!(races.len(), 2, "{races:#?}");
    for (race, reader) in races.iter().zip([a, c]) {
        assert_eq!(race.kind, RaceKind::Unordered);
        assert_eq!(race.addr, block.ptr());
        assert_eq!(
            race.earlier,
            Some((SimOp::Kernel(Access::Read), sim_index(&f, reader)))
        );
        assert_eq!(race.later, (SimOp::Kernel(Access::Write), sim_index(&f, b)));
    }
}

#[test]
fn resource_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<streamalloc::SimResource>();
    send_sync::<streamalloc::AsyncCudaResource>();
    send_sync::<streamalloc::StreamPool>();
    send_sync::<streamalloc::gpu::sim::SimGpu>();
    send_sync::<DeviceBlock>();
    send_sync::<ResourceError>();
    let f = support::sim(1);
    assert!(f.resource.supports_block_use_tracking());
}

#[test]
fn dropping_the_resource_destroys_every_event() {
    use streamalloc::DriverCall;
    let f = support::sim(3);
    let gpu = f.sim.clone().unwrap();
    written_on_b_after_reads_on_a_and_c(&f);
    // One block left live with events attached: dropped with the resource.
    let r = &f.resource;
    let kept = r.allocate(256, f.stream(0), TAG).unwrap();
    r.prepare_block_use(kept.id(), f.stream(1), Access::Write)
        .unwrap();
    r.finish_block_use(kept.id(), f.stream(1), Access::Write)
        .unwrap();
    let created = gpu.call_count(DriverCall::EventCreate);
    assert!(created >= 4, "{created} events");
    assert_eq!(gpu.call_count(DriverCall::EventDestroy), 0);
    drop(f);
    assert_eq!(gpu.call_count(DriverCall::EventDestroy), created);
}
