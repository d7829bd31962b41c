//! Bad input and failing driver calls: each gives its own `ResourceError`
//! variant, never panics, leaves every counter and map exactly as it was, and
//! loses no memory once everything is freed.

use crate::support;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    Access, AllocTag, BlockId, BlockState, Device, DeviceBlock, DeviceMemoryResource, DriverCall,
    ResourceError, SimResource, StreamId,
};
use support::Fixture;
use support::{Snapshot, assert_drained, settle, write};

const TAG: AllocTag = AllocTag("bad-input");

/// A fixture with one block written on stream 0 and read on stream 1 through
/// the hooks (so it has events to lose), and one fresh block.
struct Scene {
    f: Fixture<SimGpu>,
    used: DeviceBlock,
    fresh: DeviceBlock,
    freed: DeviceBlock,
    /// `EventCreate` calls that were made to fail (they created nothing).
    failed_creates: std::cell::Cell<u64>,
}

fn scene() -> Scene {
    let f = support::sim(3);
    let r = &f.resource;
    let (a, b) = (f.stream(0), f.stream(1));
    let used = r.allocate(4096, a, TAG).unwrap();
    write(&f, &used, a);
    r.finish_block_use(used.id(), a, Access::Write).unwrap();
    r.prepare_block_use(used.id(), b, Access::Read).unwrap();
    r.finish_block_use(used.id(), b, Access::Read).unwrap();
    let fresh = r.allocate(8192, a, TAG).unwrap();
    let freed = r.allocate(512, b, TAG).unwrap();
    r.deallocate(freed.clone()).unwrap();
    Scene {
        f,
        used,
        fresh,
        freed,
        failed_creates: Default::default(),
    }
}

impl Scene {
    fn snapshot(&self) -> Snapshot {
        Snapshot::of(&self.f.resource, &[&self.used, &self.fresh])
    }

    /// Runs `call`, expects `check` to accept its error, and the snapshot to
    /// be unchanged.
    fn refused<T: std::fmt::Debug>(
        &self,
        what: &str,
        call: impl FnOnce(&SimResource) -> Result<T, ResourceError>,
        check: impl FnOnce(&ResourceError) -> bool,
    ) {
        let before = self.snapshot();
        let out = call(&self.f.resource);
        match &out {
            Err(e) => assert!(check(e), "{what}: unexpected error {e:?}"),
            Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        }
        assert_eq!(self.snapshot(), before, "{what}: counters changed");
    }

    /// Frees what is live, reaps, and checks that nothing was lost or raced:
    /// no byte outstanding, and every event created is back in the pool.
    fn clean_up(self) {
        let r = &self.f.resource;
        r.deallocate(self.used).unwrap();
        r.deallocate(self.fresh).unwrap();
        settle(&self.f);
        assert_drained(&self.f);
        let gpu = self.f.sim.as_ref().unwrap();
        let created = gpu.call_count(DriverCall::EventCreate) - self.failed_creates.get();
        assert_eq!(r.pooled_events() as u64, created, "events leaked");
    }
}

fn driver(call: DriverCall) -> impl FnOnce(&ResourceError) -> bool {
    move |e| matches!(e, ResourceError::Driver { call: c, .. } if *c == call)
}

#[test]
fn unknown_block() {
    let s = scene();
    let r = &s.f.resource;
    let a = s.f.stream(0);
    let id = BlockId::new(r.resource_id(), 1_000_000);
    let ghost = DeviceBlock::new(id, 0x1000, 64, a, TAG);
    let unknown =
        |e: &ResourceError| matches!(e, ResourceError::UnknownBlock { block } if *block == id);
    s.refused("deallocate", |r| r.deallocate(ghost.clone()), unknown);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(id, a, Access::Read),
        unknown,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(id, a, Access::Write),
        unknown,
    );
    s.refused("record", |r| r.record_block_use(&ghost, a), unknown);
    let zero = BlockId::new(r.resource_id(), 0);
    s.refused(
        "serial 0",
        |r| r.prepare_block_use(zero, a, Access::Read),
        |e| matches!(e, ResourceError::UnknownBlock { .. }),
    );
    assert_eq!(r.block_state(id), None);
    // A forged descriptor: a live id with another address or size.
    let forged = DeviceBlock::new(s.fresh.id(), s.fresh.ptr() + 256, s.fresh.size(), a, TAG);
    s.refused(
        "forged address",
        |r| r.deallocate(forged),
        |e| matches!(e, ResourceError::UnknownBlock { .. }),
    );
    let forged = DeviceBlock::new(s.fresh.id(), s.fresh.ptr(), 1, a, TAG);
    s.refused(
        "forged size",
        |r| r.deallocate(forged),
        |e| matches!(e, ResourceError::UnknownBlock { .. }),
    );
    s.clean_up();
}

#[test]
fn stream_of_no_pool() {
    let s = scene();
    // A hand-made id names a stream no pool handed out: refused, whatever
    // its index, before the index is looked at.
    let bad = StreamId::new(0, 99);
    let unknown =
        |e: &ResourceError| matches!(e, ResourceError::ForeignStream { stream } if *stream == bad);
    let id = s.used.id();
    s.refused("allocate", |r| r.allocate(64, bad, TAG), unknown);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(id, bad, Access::Write),
        unknown,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(id, bad, Access::Read),
        unknown,
    );
    s.refused("record", |r| r.record_block_use(&s.used, bad), unknown);
    s.clean_up();
}

#[test]
fn stream_of_another_device() {
    let s = scene();
    let other = StreamId::new(7, 0);
    let wrong = |e: &ResourceError| {
        matches!(
            e,
            ResourceError::WrongDevice {
                expected: 0,
                found: 7
            }
        )
    };
    let id = s.used.id();
    s.refused("allocate", |r| r.allocate(64, other, TAG), wrong);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(id, other, Access::Read),
        wrong,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(id, other, Access::Write),
        wrong,
    );
    s.refused("record", |r| r.record_block_use(&s.used, other), wrong);
    // A descriptor that claims another device.
    let moved = DeviceBlock::new(id, s.used.ptr(), s.used.size(), other, TAG);
    s.refused("deallocate", |r| r.deallocate(moved), wrong);
    s.clean_up();
}

#[test]
fn block_of_another_resource() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    let other = SimResource::new(&Device::new(gpu, s.f.pool.clone()).unwrap());
    let theirs = other.allocate(1024, s.f.stream(0), TAG).unwrap();
    let id = theirs.id();
    let foreign =
        |e: &ResourceError| matches!(e, ResourceError::ForeignBlock { block } if *block == id);
    let a = s.f.stream(0);
    s.refused("deallocate", |r| r.deallocate(theirs.clone()), foreign);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(id, a, Access::Read),
        foreign,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(id, a, Access::Read),
        foreign,
    );
    s.refused("record", |r| r.record_block_use(&theirs, a), foreign);
    assert_eq!(s.f.resource.block_state(id), None);
    assert_eq!(other.live_bytes(), 1024);
    other.deallocate(theirs).unwrap();
    other.reap_pending().unwrap();
    assert_eq!(other.bytes_outstanding(), 0);
    s.clean_up();
}

#[test]
fn stale_block_id_and_double_free() {
    let s = scene();
    let id = s.freed.id();
    let a = s.f.stream(0);
    let stale =
        |e: &ResourceError| matches!(e, ResourceError::DoubleFree { block } if *block == id);
    assert_eq!(s.f.resource.block_state(id), Some(BlockState::Retired));
    s.refused("double free", |r| r.deallocate(s.freed.clone()), stale);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(id, a, Access::Read),
        stale,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(id, a, Access::Write),
        stale,
    );
    s.refused("record", |r| r.record_block_use(&s.freed, a), stale);
    s.clean_up();
}

#[test]
fn out_of_memory() {
    let s = scene();
    let a = s.f.stream(0);
    for requested in [1usize << 50, usize::MAX - 4095, usize::MAX] {
        s.refused(
            &format!("{requested} B"),
            |r| r.allocate(requested, a, TAG),
            |e| {
                matches!(
                    e,
                    ResourceError::OutOfMemory { requested: q, available, stream }
                        if *q == requested && *available < requested && *stream == a
                )
            },
        );
    }
    s.clean_up();
}

#[test]
fn failing_alloc() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    gpu.fail_nth(DriverCall::AllocAsync, 1);
    s.refused(
        "allocate",
        |r| r.allocate(64, s.f.stream(0), TAG),
        driver(DriverCall::AllocAsync),
    );
    let again = s.f.resource.allocate(64, s.f.stream(0), TAG).unwrap();
    s.f.resource.deallocate(again).unwrap();
    s.clean_up();
}

#[test]
fn failing_free() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    for block in [&s.used, &s.fresh] {
        gpu.fail_nth(DriverCall::FreeAsync, 1);
        s.refused(
            "deallocate",
            |r| r.deallocate(block.clone()),
            driver(DriverCall::FreeAsync),
        );
        assert_eq!(s.f.resource.block_state(block.id()), Some(BlockState::Live));
    }
    // The block is still fully usable: a hook after the failed free works.
    s.f.resource
        .prepare_block_use(s.used.id(), s.f.stream(2), Access::Read)
        .unwrap();
    s.f.resource
        .finish_block_use(s.used.id(), s.f.stream(2), Access::Read)
        .unwrap();
    s.clean_up();
}

#[test]
fn failing_wait_in_deallocate() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    // `used` has an event on stream 1; the free on stream 0 waits on it.
    gpu.fail_nth(DriverCall::StreamWaitEvent, 1);
    s.refused(
        "deallocate",
        |r| r.deallocate(s.used.clone()),
        driver(DriverCall::StreamWaitEvent),
    );
    assert_eq!(s.f.resource.pending_use_event_count(s.used.ptr()), Some(2));
    s.clean_up();
}

#[test]
fn failing_event_create() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    let (a, c) = (s.f.stream(0), s.f.stream(2));
    // A first use on another stream needs an event for the allocation point,
    // and the pool is empty at first.
    let pooled = s.f.resource.pooled_events();
    assert_eq!(pooled, 0, "the scene leaves no pooled event");
    gpu.fail_nth(DriverCall::EventCreate, 1);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(s.fresh.id(), c, Access::Read),
        driver(DriverCall::EventCreate),
    );
    gpu.fail_nth(DriverCall::EventCreate, 1);
    s.refused(
        "finish",
        |r| r.finish_block_use(s.fresh.id(), a, Access::Write),
        driver(DriverCall::EventCreate),
    );
    gpu.fail_nth(DriverCall::EventCreate, 1);
    s.refused(
        "record",
        |r| r.record_block_use(&s.fresh, c),
        driver(DriverCall::EventCreate),
    );
    s.failed_creates.set(3);
    s.clean_up();
}

#[test]
fn failing_event_record() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    let (a, c) = (s.f.stream(0), s.f.stream(2));
    gpu.fail_nth(DriverCall::EventRecord, 1);
    s.refused(
        "prepare (allocation point)",
        |r| r.prepare_block_use(s.fresh.id(), c, Access::Read),
        driver(DriverCall::EventRecord),
    );
    for (block, access) in [(&s.fresh, Access::Write), (&s.used, Access::Read)] {
        gpu.fail_nth(DriverCall::EventRecord, 1);
        s.refused(
            "finish",
            |r| r.finish_block_use(block.id(), a, access),
            driver(DriverCall::EventRecord),
        );
    }
    s.clean_up();
}

#[test]
fn failing_wait_in_prepare() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    let c = s.f.stream(2);
    // A write on C waits on the write on A and the read on B.
    for nth in [1, 2] {
        gpu.fail_nth(DriverCall::StreamWaitEvent, nth);
        s.refused(
            &format!("prepare, wait {nth} fails"),
            |r| r.prepare_block_use(s.used.id(), c, Access::Write),
            driver(DriverCall::StreamWaitEvent),
        );
    }
    // A first use on another stream: the wait on the allocation point fails.
    gpu.fail_nth(DriverCall::StreamWaitEvent, 1);
    s.refused(
        "prepare (allocation point)",
        |r| r.prepare_block_use(s.fresh.id(), c, Access::Read),
        driver(DriverCall::StreamWaitEvent),
    );
    s.clean_up();
}

#[test]
fn failing_synchronize_in_reap() {
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    assert_eq!(s.f.resource.pending_free_bytes(), 512);
    gpu.fail_nth(DriverCall::StreamSynchronize, 1);
    s.refused(
        "reap",
        |r| r.reap_pending(),
        driver(DriverCall::StreamSynchronize),
    );
    s.f.resource.reap_pending().unwrap();
    assert_eq!(s.f.resource.pending_free_bytes(), 0);
    s.clean_up();
}

#[test]
fn failing_capture_query_in_reap() {
    // Reaping asks each stream with frees whether it is being captured
    // (synchronizing a capturing stream would invalidate the capture).
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    gpu.fail_nth(DriverCall::StreamGetCaptureInfo, 1);
    s.refused(
        "reap",
        |r| r.reap_pending(),
        driver(DriverCall::StreamGetCaptureInfo),
    );
    s.f.resource.reap_pending().unwrap();
    assert_eq!(s.f.resource.pending_free_bytes(), 0);
    s.clean_up();
}

#[test]
fn every_call_the_resource_makes_is_covered() {
    // A full life (allocate, cross-stream use, free, reap) makes exactly the
    // calls the failing_* tests inject into; a new call kind shows up here.
    let gpu = SimGpu::builder().manual().build();
    let f = support::sim_with(gpu.clone(), 2);
    let r = &f.resource;
    let (a, b) = (f.stream(0), f.stream(1));
    let block = r.allocate(64, a, TAG).unwrap();
    r.prepare_block_use(block.id(), b, Access::Write).unwrap();
    r.finish_block_use(block.id(), b, Access::Write).unwrap();
    r.deallocate(block).unwrap();
    r.reap_pending().unwrap();
    let made: Vec<DriverCall> = DriverCall::ALL
        .into_iter()
        .filter(|&c| gpu.call_count(c) > 0)
        .collect();
    assert_eq!(
        made,
        [
            DriverCall::AllocAsync,
            DriverCall::FreeAsync,
            DriverCall::EventCreate,
            DriverCall::EventRecord,
            DriverCall::StreamWaitEvent,
            DriverCall::StreamSynchronize,
            DriverCall::StreamGetCaptureInfo,
        ]
    );
}

#[test]
fn device_fault() {
    // After a fault (an illegal address), every call fails with the driver's
    // error, nothing changes, and nothing panics; the memory is lost with
    // the device, as on CUDA.
    let s = scene();
    let gpu = s.f.sim.clone().unwrap();
    gpu.inject_device_fault();
    let (a, c) = (s.f.stream(0), s.f.stream(2));
    let faulted = |e: &ResourceError| matches!(e, ResourceError::Driver { code: 700, .. });
    s.refused("allocate", |r| r.allocate(64, a, TAG), faulted);
    s.refused("deallocate", |r| r.deallocate(s.fresh.clone()), faulted);
    s.refused(
        "prepare",
        |r| r.prepare_block_use(s.used.id(), c, Access::Write),
        faulted,
    );
    s.refused(
        "finish",
        |r| r.finish_block_use(s.used.id(), c, Access::Read),
        faulted,
    );
    s.refused("reap", |r| r.reap_pending(), faulted);
    assert_eq!(
        s.f.resource.block_state(s.fresh.id()),
        Some(BlockState::Live)
    );
}
