//! Cost of each adaptor on the allocate + deallocate hot path, on the
//! simulated device (relative numbers: the simulator dominates the absolute
//! ones). `tracing/no-subscriber` checks that the tracing layer costs
//! nothing measurable when nobody listens.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AllocTag, Device, DeviceMemoryResource, ResourceBuilder, SimResource, StreamId};
use streamalloc::{
    Budget, BudgetResource, DebugGuardResource, GuardConfig, RetryOnOomResource, Stats,
    StatsResource, TracingResource,
};

fn sim() -> (SimResource, StreamId) {
    let device = Device::simulated(&SimGpu::new(), 1);
    (SimResource::new(&device), device.stream(0).unwrap())
}

fn pair<R: DeviceMemoryResource>(c: &mut Criterion, name: &str, r: R, s: StreamId) {
    let mut n = 0u64;
    c.bench_function(name, |b| {
        b.iter(|| {
            let block = r.allocate(black_box(256), s, AllocTag("bench")).unwrap();
            r.deallocate(block).unwrap();
            n += 1;
            if n.is_multiple_of(1024) {
                r.reap_pending().unwrap();
            }
        })
    });
    r.reap_pending().unwrap();
}

fn adaptors(c: &mut Criterion) {
    let (r, s) = sim();
    pair(c, "bare", r, s);
    let (r, s) = sim();
    pair(c, "stats", StatsResource::new(r, &Stats::new()), s);
    let (r, s) = sim();
    pair(
        c,
        "budget",
        BudgetResource::new(r, &Budget::new(usize::MAX)),
        s,
    );
    let (r, s) = sim();
    pair(c, "retry_on_oom", RetryOnOomResource::new(r), s);
    let (r, s) = sim();
    pair(c, "tracing/no-subscriber", TracingResource::new(r), s);
    let (r, s) = sim();
    pair(
        c,
        "debug_guard",
        DebugGuardResource::new(r, GuardConfig::new()),
        s,
    );
    let (r, s) = sim();
    let stack = ResourceBuilder::new()
        .tracing()
        .retry_on_oom()
        .budget(&Budget::new(usize::MAX))
        .stats()
        .build(r);
    pair(c, "tracing+retry+budget+stats", stack, s);
}

criterion_group!(benches, adaptors);
criterion_main!(benches);
