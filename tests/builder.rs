//! ResourceBuilder: stacking order is the order calls pass through.

mod common;
mod support;

use std::sync::Arc;

use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, DeviceMemoryResource, ResourceBuilder, ResourceError, SimResource};
use streamalloc::{
    Budget, BudgetLayer, BudgetResource, DebugGuardResource, GuardConfig, Identity, Layer,
    RetryOnOomResource, Stack, Stats, StatsLayer, StatsResource, TracingResource,
};

const T: AllocTag = AllocTag("t");

#[test]
fn the_first_layer_added_is_the_outermost() {
    let f = common::sim(1);
    let budget = Budget::new(1 << 20);
    let r: TracingResource<RetryOnOomResource<BudgetResource<StatsResource<Arc<SimResource>>>>> =
        ResourceBuilder::new()
            .tracing()
            .retry_on_oom()
            .budget(&budget)
            .stats()
            .build(f.resource.clone());
    let block = r.allocate(100, f.stream(0), T).unwrap();
    assert_eq!(budget.in_use(), 100);
    assert_eq!(
        r.inner()
            .inner()
            .inner()
            .stats()
            .snapshot()
            .overall
            .current_bytes,
        100
    );
    r.deallocate(block).unwrap();

    let plain: Arc<SimResource> = ResourceBuilder::new().build(f.resource.clone());
    assert!(Arc::ptr_eq(&plain, &f.resource));
}

#[test]
fn retry_outside_the_budget_turns_queued_frees_into_room() {
    let f = common::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(1000);
    let r = ResourceBuilder::new()
        .retry_on_oom()
        .budget(&budget)
        .build(f.resource.clone());
    let block = r.allocate(800, s, T).unwrap();
    r.deallocate(block).unwrap();
    let again = r.allocate(800, s, T).expect("reaped through the budget");
    assert_eq!(r.retries(), 1);
    r.deallocate(again).unwrap();
}

#[test]
fn budget_outside_the_retry_refuses_for_good() {
    let f = common::sim(1);
    let s = f.stream(0);
    let budget = Budget::new(1000);
    let r = ResourceBuilder::new()
        .budget(&budget)
        .retry_on_oom()
        .build(f.resource.clone());
    let block = r.allocate(800, s, T).unwrap();
    r.deallocate(block).unwrap();
    assert!(matches!(
        r.allocate(800, s, T),
        Err(ResourceError::BudgetExceeded { in_use: 800, .. })
    ));
    assert_eq!(r.inner().retries(), 0);
    assert_eq!(budget.in_use(), 800);
}

#[test]
fn stats_outside_a_guard_count_what_the_user_holds_inside_what_the_device_holds() {
    let f = common::sim(1);
    let outside = Stats::new();
    let inside = Stats::new();
    let r = ResourceBuilder::new()
        .stats_with(&outside)
        .debug_guard(GuardConfig::new())
        .stats_with(&inside)
        .build(f.resource.clone());
    let block = r.allocate(256, f.stream(0), T).unwrap();
    r.deallocate(block).unwrap();
    assert_eq!(outside.snapshot().overall.current_bytes, 0);
    assert_eq!(inside.snapshot().overall.current_bytes, 256);
    r.inner().flush().unwrap();
    assert_eq!(inside.snapshot().overall.current_bytes, 0);
}

#[test]
fn one_layer_wraps_one_resource_per_device() {
    let budget = Budget::new(1000);
    let layer = ResourceBuilder::new().budget(&budget).stats().into_layer();
    let d0 = common::sim_with(SimGpu::builder().manual().ordinal(0).build(), 1);
    let d1 = common::sim_with(SimGpu::builder().manual().ordinal(1).build(), 1);
    let r0 = layer.layer(d0.resource.clone());
    let r1 = layer.layer(d1.resource.clone());
    let _kept = r0.allocate(700, d0.stream(0), T).unwrap();
    assert!(matches!(
        r1.allocate(700, d1.stream(0), T),
        Err(ResourceError::BudgetExceeded { .. })
    ));
    assert_eq!(r1.device_ordinal(), 1);
}

#[test]
fn stack_and_identity_compose_by_hand() {
    let f = common::sim(1);
    let budget = Budget::new(1000);
    let stack = Stack::new(
        StatsLayer::new(),
        Stack::new(Identity::new(), BudgetLayer::new(&budget)),
    );
    let r: BudgetResource<StatsResource<Arc<SimResource>>> = stack.layer(f.resource.clone());
    let _kept = r.allocate(10, f.stream(0), T).unwrap();
    assert_eq!(budget.in_use(), 10);
    assert_eq!(stack.inner().stats().snapshot().overall.total_blocks, 1);
}

#[test]
fn a_full_stack_forwards_everything() {
    let budget = Budget::new(1 << 30);
    support::check_forwarding(
        |inner| {
            ResourceBuilder::new()
                .tracing()
                .retry_on_oom()
                .budget(&budget)
                .stats()
                .debug_guard(GuardConfig::new())
                .build(inner)
        },
        |r| {
            let guard: &DebugGuardResource<_> = r.inner().inner().inner().inner();
            guard.flush().unwrap();
        },
    );
    assert_eq!(budget.in_use(), 0);
}
