//! LaunchRecorder: preflight before any work, then prepare → enqueue →
//! finish; a pipeline written with it alone is race-free.

mod common;
mod support;

use std::error::Error;

use streamalloc::DriverCall;
use streamalloc::LaunchRecorder;
use streamalloc::gpu::sim::{MemAccess, RaceReport, SimGpu};
use streamalloc::{
    Access, AllocTag, DeviceMemoryResource, RawStream, ResourceBuilder, ResourceError, StreamId,
};
use streamalloc::{Budget, DebugGuardResource, GuardConfig};
use support::NoTracking;

type BoxError = Box<dyn Error + Send + Sync>;
const T: AllocTag = AllocTag("pipeline");

fn kernel(gpu: &SimGpu, raw: RawStream, accesses: &[MemAccess]) -> Result<(), BoxError> {
    gpu.launch_kernel(raw, accesses)?;
    Ok(())
}

/// Which declaration the pipeline leaves out.
#[derive(Clone, Copy, PartialEq)]
enum Omit {
    Nothing,
    StageBReadOfInput,
}

/// Three stages on three streams, twice, then frees and reuse; every launch
/// declared through the recorder except `omit`. Returns the races found.
fn pipeline<R: DeviceMemoryResource>(
    r: &R,
    f: &common::Fixture<SimGpu>,
    omit: Omit,
) -> Vec<RaceReport> {
    let gpu = f.sim.clone().unwrap();
    let (a, b, c) = (f.stream(0), f.stream(1), f.stream(2));
    let input = r.allocate(1 << 16, a, T).unwrap();
    let mid = r.allocate(1 << 16, b, T).unwrap();
    let out = r.allocate(1 << 16, c, T).unwrap();
    for _ in 0..2 {
        // Stage A on a: copy in.
        LaunchRecorder::new(r, a)
            .write(&input)
            .launch(&f.device, |raw| {
                kernel(&gpu, raw, &[MemAccess::write(&input)])
            })
            .unwrap();
        // Stage B on b: input -> mid.
        let mut stage_b = LaunchRecorder::new(r, b).write(&mid);
        if omit != Omit::StageBReadOfInput {
            stage_b = stage_b.read(&input);
        }
        stage_b
            .launch(&f.device, |raw| {
                kernel(
                    &gpu,
                    raw,
                    &[MemAccess::read(&input), MemAccess::write(&mid)],
                )
            })
            .unwrap();
        // Stage C on c: mid -> out.
        LaunchRecorder::new(r, c)
            .read(&mid)
            .write(&out)
            .launch(&f.device, |raw| {
                kernel(&gpu, raw, &[MemAccess::read(&mid), MemAccess::write(&out)])
            })
            .unwrap();
        // Copy out, back on a.
        LaunchRecorder::new(r, a)
            .read(&out)
            .launch(&f.device, |raw| kernel(&gpu, raw, &[MemAccess::read(&out)]))
            .unwrap();
    }
    r.deallocate(input).unwrap();
    r.deallocate(mid).unwrap();
    r.deallocate(out).unwrap();
    // Reuse on every stream: the freed memory must not be written while a
    // declared use of the old block may still run.
    for s in [a, b, c] {
        let next = r.allocate(1 << 16, s, T).unwrap();
        LaunchRecorder::new(r, s)
            .write(&next)
            .launch(&f.device, |raw| {
                kernel(&gpu, raw, &[MemAccess::write(&next)])
            })
            .unwrap();
        r.deallocate(next).unwrap();
    }
    gpu.run_until_idle();
    gpu.races()
}

#[test]
fn a_pipeline_written_with_the_recorder_has_no_race() {
    let f = common::sim(3);
    let races = pipeline(&f.resource, &f, Omit::Nothing);
    assert!(races.is_empty(), "{races:?}");
    f.resource.reap_pending().unwrap();
    assert_eq!(f.resource.bytes_outstanding(), 0);
}

#[test]
fn the_same_pipeline_with_one_declaration_left_out_is_reported() {
    let f = common::sim(3);
    let races = pipeline(&f.resource, &f, Omit::StageBReadOfInput);
    assert!(!races.is_empty());
}

#[test]
fn the_recorder_works_through_an_adaptor_stack() {
    let f = common::sim(3);
    let budget = Budget::new(1 << 30);
    let r = ResourceBuilder::new()
        .tracing()
        .budget(&budget)
        .stats()
        .debug_guard(GuardConfig::new().max_blocks(2))
        .build(f.resource.clone());
    let races = pipeline(&r, &f, Omit::Nothing);
    assert!(races.is_empty(), "{races:?}");
}

/// Driver calls that queue work: none may happen in a refused launch.
fn queued_calls(gpu: &SimGpu) -> [u64; 3] {
    [
        gpu.call_count(DriverCall::Launch),
        gpu.call_count(DriverCall::StreamWaitEvent),
        gpu.call_count(DriverCall::EventRecord),
    ]
}

#[test]
fn cross_stream_use_without_tracking_fails_before_any_work() {
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let r = NoTracking(f.resource.clone());
    let (a, b) = (f.stream(0), f.stream(1));
    let block = r.allocate(4096, a, T).unwrap();
    let before = queued_calls(&gpu);
    let mut called = false;
    let err = LaunchRecorder::new(&r, b)
        .read(&block)
        .launch(&f.device, |_| -> Result<(), ResourceError> {
            called = true;
            Ok(())
        })
        .unwrap_err();
    assert_eq!(
        err,
        ResourceError::TrackingUnsupported {
            block: block.id(),
            stream: b
        }
    );
    assert!(!called);
    assert_eq!(queued_calls(&gpu), before);

    // On its own stream the same block needs no tracking.
    LaunchRecorder::new(&r, a)
        .write(&block)
        .launch(&f.device, |raw| {
            kernel(&gpu, raw, &[MemAccess::write(&block)])
        })
        .unwrap();
    assert_eq!(gpu.call_count(DriverCall::Launch), before[0] + 1);
}

#[test]
fn retired_quarantined_unknown_and_foreign_blocks_fail_before_any_work() {
    let f = common::sim(2);
    let other = common::sim(1);
    let gpu = f.sim.clone().unwrap();
    let guard = DebugGuardResource::new(f.resource.clone(), GuardConfig::new());
    let s = f.stream(1);
    let retired = guard.allocate(64, f.stream(0), T).unwrap();
    guard.deallocate(retired.clone()).unwrap();
    guard.flush().unwrap();
    let quarantined = guard.allocate(64, f.stream(0), T).unwrap();
    guard.deallocate(quarantined.clone()).unwrap();
    let foreign = other.resource.allocate(64, other.stream(0), T).unwrap();
    let live = guard.allocate(64, f.stream(0), T).unwrap();

    let before = queued_calls(&gpu);
    let cases = [
        (
            &retired,
            ResourceError::DoubleFree {
                block: retired.id(),
            },
        ),
        (
            &quarantined,
            ResourceError::DoubleFree {
                block: quarantined.id(),
            },
        ),
        (
            &foreign,
            ResourceError::UnknownBlock {
                block: foreign.id(),
            },
        ),
    ];
    for (bad, expected) in cases {
        // The bad block is declared after a good one: nothing of the good
        // one may have been queued either.
        let recorder = LaunchRecorder::new(&guard, s).write(&live).read(bad);
        assert_eq!(recorder.preflight(), Err(expected.clone()));
        let result = recorder.launch(&f.device, |_| -> Result<(), ResourceError> {
            panic!("enqueue must not run")
        });
        assert_eq!(result, Err(expected));
    }
    // A stream the pool did not hand out.
    let result = LaunchRecorder::new(&guard, StreamId::new(0, 7))
        .write(&live)
        .launch(&f.device, |_| -> Result<(), ResourceError> {
            panic!("enqueue must not run")
        });
    assert!(matches!(result, Err(ResourceError::ForeignStream { .. })));
    // A stream of another device.
    let result = LaunchRecorder::new(&guard, StreamId::new(3, 0))
        .write(&live)
        .launch(&f.device, |_| -> Result<(), ResourceError> {
            panic!("enqueue must not run")
        });
    assert!(matches!(
        result,
        Err(ResourceError::WrongDevice {
            expected: 0,
            found: 3
        })
    ));
    // A block of another device.
    let d1 = common::sim_with(SimGpu::builder().manual().ordinal(1).build(), 1);
    let elsewhere = d1.resource.allocate(64, d1.stream(0), T).unwrap();
    let result = LaunchRecorder::new(&guard, s)
        .write(&live)
        .read(&elsewhere)
        .launch(&f.device, |_| -> Result<(), ResourceError> {
            panic!("enqueue must not run")
        });
    assert_eq!(
        result,
        Err(ResourceError::WrongDevice {
            expected: 0,
            found: 1
        })
    );
    assert_eq!(queued_calls(&gpu), before);
    assert_eq!(f.resource.pending_use_event_count(live.ptr()), Some(0));
}

#[test]
fn a_failed_enqueue_still_records_the_uses() {
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let (a, b) = (f.stream(0), f.stream(1));
    let block = f.resource.allocate(64, a, T).unwrap();
    let err = LaunchRecorder::new(&f.resource, b)
        .read(&block)
        .launch(&f.device, |raw| -> Result<(), BoxError> {
            gpu.launch_kernel(raw, &[MemAccess::read(&block)])?;
            Err("the second kernel failed".into())
        })
        .unwrap_err();
    assert_eq!(err.to_string(), "the second kernel failed");
    // Allocation-order event plus b's read: the free will wait for it.
    assert_eq!(f.resource.pending_use_event_count(block.ptr()), Some(2));
    f.resource.deallocate(block).unwrap();
    let next = f.resource.allocate(64, a, T).unwrap();
    gpu.launch_kernel(f.pool.raw(a).unwrap(), &[MemAccess::write(&next)])
        .unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}

#[test]
fn the_steps_can_be_run_one_by_one() {
    // What the async variant does: it queues its completion point after
    // `finish`.
    let f = common::sim(2);
    let gpu = f.sim.clone().unwrap();
    let (a, b) = (f.stream(0), f.stream(1));
    let block = f.resource.allocate(64, a, T).unwrap();
    let recorder = LaunchRecorder::new(&*f.resource, b)
        .read(&block)
        .write(&block);
    assert_eq!(recorder.uses().len(), 1, "declared twice, used once");
    assert_eq!(recorder.uses()[0].access, Access::Write);
    assert_eq!(recorder.stream(), b);
    recorder.preflight().unwrap();
    let waits = gpu.call_count(DriverCall::StreamWaitEvent);
    recorder.prepare().unwrap();
    assert!(gpu.call_count(DriverCall::StreamWaitEvent) > waits);
    gpu.launch_kernel(f.pool.raw(b).unwrap(), &[MemAccess::write(&block)])
        .unwrap();
    recorder.finish().unwrap();
    assert_eq!(f.resource.pending_use_event_count(block.ptr()), Some(1));
    f.resource.deallocate(block).unwrap();
    gpu.run_until_idle();
    assert!(gpu.races().is_empty(), "{:?}", gpu.races());
}
