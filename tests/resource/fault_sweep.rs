//! Fault sweep: a cross-stream workload is run once per (driver call kind,
//! n) with the n-th call of that kind failing, for every call the workload
//! makes. Every step that fails must fail with that call's `Driver` error
//! and change nothing (a reap may keep what it drained before the failure,
//! as `reap_pending` documents); retried, it succeeds. At the end nothing is lost, no
//! event is leaked, and the race detector is silent: a failed call and its
//! retry order the work as well as a clean call does.

use crate::support;

use std::sync::Arc;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    Access, AllocTag, DeviceBlock, DeviceMemoryResource, DriverCall, ResourceError, ResourceResult,
    SimResource,
};
use support::Fixture;
use support::{Snapshot, assert_drained, settle};

const CALLS: [DriverCall; 6] = [
    DriverCall::AllocAsync,
    DriverCall::FreeAsync,
    DriverCall::EventCreate,
    DriverCall::EventRecord,
    DriverCall::StreamWaitEvent,
    DriverCall::StreamSynchronize,
];

/// Runs the workload's steps, retrying a step once when it fails.
struct Runner {
    f: Fixture<SimGpu>,
    injected: DriverCall,
    failures: u64,
    failed_creates: u64,
}

impl Runner {
    fn r(&self) -> &Arc<SimResource> {
        &self.f.resource
    }

    /// Runs `step`; if it fails, it must be the injected call, with every
    /// counter unchanged, and the retry must succeed.
    fn step<T>(
        &mut self,
        watched: &[&DeviceBlock],
        what: &str,
        mut step: impl FnMut(&SimResource) -> ResourceResult<T>,
    ) -> T {
        let before = Snapshot::of(self.r(), watched);
        match step(self.r()) {
            Ok(v) => v,
            Err(ResourceError::Driver { call, .. }) if call == self.injected => {
                self.failures += 1;
                if call == DriverCall::EventCreate {
                    self.failed_creates += 1;
                }
                let after = Snapshot::of(self.r(), watched);
                if what == "reap" {
                    // Documented exception: what a failed reap drained (the
                    // streams synchronized before the failure) stays drained.
                    assert_eq!(after.live_bytes, before.live_bytes);
                    assert_eq!(after.live_blocks, before.live_blocks);
                    assert!(after.pending_free_bytes <= before.pending_free_bytes);
                    assert_eq!(after.pending_free_bytes, after.pending_per_stream_total);
                    assert_eq!(
                        after.bytes_outstanding,
                        after.live_bytes + after.pending_free_bytes
                    );
                } else {
                    assert_eq!(
                        after, before,
                        "{what}: a failed {call:?} changed the counters"
                    );
                }
                step(self.r()).unwrap_or_else(|e| panic!("{what}: retry failed: {e:?}"))
            }
            Err(e) => panic!("{what}: unexpected {e:?} (injected {:?})", self.injected),
        }
    }

    fn kernel(&self, block: &DeviceBlock, stream: usize, access: Access) {
        let raw = self.f.pool.raw(self.f.stream(stream)).unwrap();
        let touch = match access {
            Access::Read => MemAccess::read(block),
            Access::Write => MemAccess::write(block),
        };
        self.f
            .sim
            .as_ref()
            .unwrap()
            .launch_kernel(raw, &[touch])
            .unwrap();
    }

    /// A hooked use: prepare, the kernel, finish.
    fn use_block(&mut self, block: &DeviceBlock, stream: usize, access: Access) {
        let (id, s) = (block.id(), self.f.stream(stream));
        self.step(&[block], "prepare", |r| r.prepare_block_use(id, s, access));
        self.kernel(block, stream, access);
        self.step(&[block], "finish", |r| r.finish_block_use(id, s, access));
    }

    fn alloc(&mut self, size: usize, stream: usize) -> DeviceBlock {
        let s = self.f.stream(stream);
        self.step(&[], "allocate", |r| r.allocate(size, s, AllocTag("sweep")))
    }

    fn free(&mut self, block: DeviceBlock) {
        self.step(&[&block], "deallocate", |r| r.deallocate(block.clone()));
    }
}

/// The workload: a block written on 0, read on 1 and 2 (one through
/// `record_block_use`), freed on 0 while a second block moves from 1 to 2
/// and back to 0; reaps in between and at the end.
fn workload(run: &mut Runner) {
    let x = run.alloc(1 << 16, 0);
    run.kernel(&x, 0, Access::Write);
    let (id, s0) = (x.id(), run.f.stream(0));
    run.step(&[&x], "finish", |r| {
        r.finish_block_use(id, s0, Access::Write)
    });
    run.use_block(&x, 1, Access::Read);
    let s2 = run.f.stream(2);
    run.step(&[&x], "prepare", |r| {
        r.prepare_block_use(id, s2, Access::Read)
    });
    run.kernel(&x, 2, Access::Read);
    run.step(&[&x], "record", |r| r.record_block_use(&x, s2));
    let y = run.alloc(1 << 12, 1);
    run.use_block(&y, 2, Access::Write);
    run.free(x);
    run.step(&[&y], "reap", |r| r.reap_pending());
    run.use_block(&y, 0, Access::Read);
    run.use_block(&y, 1, Access::Write);
    let z = run.alloc(1 << 16, 0);
    run.use_block(&z, 0, Access::Write);
    run.use_block(&z, 2, Access::Read);
    run.free(y);
    run.free(z);
    run.step(&[], "reap", |r| r.reap_pending());
}

fn run_once(injected: DriverCall, nth: Option<u64>) -> (Runner, Vec<(DriverCall, u64)>) {
    let f = support::sim(3);
    let gpu = f.sim.clone().unwrap();
    if let Some(n) = nth {
        gpu.fail_nth(injected, n);
    }
    let mut run = Runner {
        f,
        injected,
        failures: 0,
        failed_creates: 0,
    };
    workload(&mut run);
    // The calls the workload made (settling below makes more).
    let counts = CALLS.iter().map(|&c| (c, gpu.call_count(c))).collect();
    settle(&run.f);
    assert_drained(&run.f);
    let created = gpu.call_count(DriverCall::EventCreate) - run.failed_creates;
    assert_eq!(run.r().pooled_events() as u64, created, "events leaked");
    (run, counts)
}

#[test]
fn every_failing_call_of_the_workload_is_recovered() {
    let (_, clean) = run_once(DriverCall::AllocAsync, None);
    let mut swept = 0;
    for (call, count) in clean {
        assert!(count > 0, "the workload makes no {call:?} call");
        for nth in 1..=count {
            let (run, _) = run_once(call, Some(nth));
            assert_eq!(
                run.failures, 1,
                "{call:?} #{nth}: the injected failure was not seen exactly once"
            );
            swept += 1;
        }
    }
    assert!(swept >= CALLS.len());
    eprintln!("fault sweep: {swept} runs");
}
