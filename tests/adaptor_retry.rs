//! RetryOnOomResource: reap and retry once when memory is short.

mod common;
mod support;

use streamalloc::DriverCall;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceMemoryResource, ResourceError, StreamId};
use streamalloc::{Budget, BudgetResource, RetryOnOomResource};
use support::NoTracking;

const T: AllocTag = AllocTag::UNTAGGED;
const MIB: usize = 1 << 20;

fn small_device() -> common::Fixture<SimGpu> {
    common::sim_with(SimGpu::builder().manual().capacity(MIB).build(), 2)
}

#[test]
fn bad_input_changes_nothing() {
    support::check_bad_input(RetryOnOomResource::new, |r| r.retries());
}

#[test]
fn forwards_what_it_does_not_change() {
    support::check_forwarding(RetryOnOomResource::new, |_| {});
    let f = common::sim(1);
    assert!(!RetryOnOomResource::new(NoTracking(f.resource.clone())).supports_block_use_tracking());
}

#[test]
fn out_of_memory_reaps_and_retries_once() {
    // Without the adaptor, memory whose free is still queued on another
    // stream cannot be had.
    let f = small_device();
    let (a, b) = (f.stream(0), f.stream(1));
    let block = f.resource.allocate(768 << 10, a, T).unwrap();
    f.resource.deallocate(block).unwrap();
    assert!(matches!(
        f.resource.allocate(768 << 10, b, T),
        Err(ResourceError::OutOfMemory { .. })
    ));

    // With it, the reap runs the free and the retry succeeds. (A new
    // device: its pool's own stream ids.)
    let f = small_device();
    let (a, b) = (f.stream(0), f.stream(1));
    let gpu = f.sim.clone().unwrap();
    let r = RetryOnOomResource::new(f.resource.clone());
    let block = r.allocate(768 << 10, a, T).unwrap();
    r.deallocate(block).unwrap();
    let allocs = gpu.call_count(DriverCall::AllocAsync);
    let again = r.allocate(768 << 10, b, T).unwrap();
    assert_eq!(r.retries(), 1);
    assert_eq!(gpu.call_count(DriverCall::AllocAsync), allocs + 2);
    assert_eq!(f.resource.pending_free_bytes(), 0, "the reap drained");
    r.deallocate(again).unwrap();
}

#[test]
fn persistent_out_of_memory_is_reported_after_one_retry() {
    let f = small_device();
    let gpu = f.sim.clone().unwrap();
    let r = RetryOnOomResource::new(f.resource.clone());
    let allocs = gpu.call_count(DriverCall::AllocAsync);
    assert!(matches!(
        r.allocate(2 * MIB, f.stream(0), T),
        Err(ResourceError::OutOfMemory {
            requested,
            ..
        }) if requested == 2 * MIB
    ));
    assert_eq!(r.retries(), 1);
    assert_eq!(gpu.call_count(DriverCall::AllocAsync), allocs + 2);
    assert_eq!(r.bytes_outstanding(), 0);
}

#[test]
fn other_errors_are_not_retried() {
    let f = small_device();
    let gpu = f.sim.clone().unwrap();
    let r = RetryOnOomResource::new(f.resource.clone());
    let allocs = gpu.call_count(DriverCall::AllocAsync);
    gpu.fail_nth(DriverCall::AllocAsync, 1);
    assert!(matches!(
        r.allocate(64, f.stream(0), T),
        Err(ResourceError::Driver { .. })
    ));
    assert!(matches!(
        r.allocate(64, StreamId::new(0, 42), T),
        Err(ResourceError::ForeignStream { .. })
    ));
    assert_eq!(r.retries(), 0);
    assert_eq!(gpu.call_count(DriverCall::AllocAsync), allocs + 1);
}

#[test]
fn a_budget_below_is_reaped_before_the_retry() {
    let f = common::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(1000);
    let r = RetryOnOomResource::new(BudgetResource::new(f.resource.clone(), &budget));
    let block = r.allocate(800, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(budget.in_use(), 800);
    let again = r.allocate(800, s, T).unwrap();
    assert_eq!(r.retries(), 1);
    assert_eq!(budget.in_use(), 800);
    r.deallocate(again).unwrap();
}

#[test]
fn a_failed_reap_reports_the_first_error() {
    let f = small_device();
    let gpu = f.sim.clone().unwrap();
    let r = RetryOnOomResource::new(f.resource.clone());
    let block = r.allocate(768 << 10, f.stream(0), T).unwrap();
    r.deallocate(block).unwrap();
    gpu.fail_nth(DriverCall::StreamSynchronize, 1);
    assert!(matches!(
        r.allocate(768 << 10, f.stream(1), T),
        Err(ResourceError::OutOfMemory { .. })
    ));
    assert_eq!(r.retries(), 0);
    assert_eq!(f.resource.pending_free_bytes(), 768 << 10);
}
