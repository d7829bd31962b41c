//! Cost of each adaptor on the allocate + deallocate hot path, on the
//! simulated device and on the null backend (driver calls that do nothing,
//! so that the adaptor's share of the pair shows). Relative numbers: compare
//! each row with `bare` of the same backend. `tracing/no-subscriber` checks
//! that the tracing layer costs nothing measurable when nobody listens.
//!
//! ```text
//! cargo bench --bench adaptors
//! ```

mod support;

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{
    AllocTag, Budget, BudgetResource, DebugGuardResource, Device, DeviceMemoryResource,
    GuardConfig, ResourceBuilder, RetryOnOomResource, Stats, StatsResource, StreamId,
    StreamOrderedResource, TracingResource,
};

/// A fresh stream-ordered resource on the simulated device.
fn sim() -> (StreamOrderedResource<SimGpu>, StreamId) {
    let device = Device::simulated(&SimGpu::new(), 1);
    (
        StreamOrderedResource::new(&device),
        device.stream(0).unwrap(),
    )
}

/// A fresh stream-ordered resource on the null backend.
fn null() -> (StreamOrderedResource<support::NullGpu>, StreamId) {
    let handles = SimGpu::builder().manual().build();
    let pool = handles.stream_pool(1);
    let gpu = Arc::new(support::NullGpu::on_handles_of(&handles));
    let device = Device::new(gpu, pool).expect("the null backend runs on the pool's context");
    (
        StreamOrderedResource::new(&device),
        device.stream(0).unwrap(),
    )
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

/// Every adaptor alone, then a stack of four, over resources `fresh` makes.
fn adaptors_on<G: Gpu>(
    c: &mut Criterion,
    backend: &str,
    fresh: impl Fn() -> (StreamOrderedResource<G>, StreamId),
) {
    let name = |row: &str| format!("{backend}/{row}");
    let (r, s) = fresh();
    pair(c, &name("bare"), r, s);
    let (r, s) = fresh();
    pair(c, &name("stats"), StatsResource::new(r, &Stats::new()), s);
    let (r, s) = fresh();
    let budget = Budget::new(usize::MAX);
    pair(c, &name("budget"), BudgetResource::new(r, &budget), s);
    let (r, s) = fresh();
    pair(c, &name("retry_on_oom"), RetryOnOomResource::new(r), s);
    let (r, s) = fresh();
    pair(
        c,
        &name("tracing/no-subscriber"),
        TracingResource::new(r),
        s,
    );
    let (r, s) = fresh();
    let guard = DebugGuardResource::new(r, GuardConfig::new());
    pair(c, &name("debug_guard"), guard, s);
    let (r, s) = fresh();
    let stack = ResourceBuilder::new()
        .tracing()
        .retry_on_oom()
        .budget(&Budget::new(usize::MAX))
        .stats()
        .build(r);
    pair(c, &name("tracing+retry+budget+stats"), stack, s);
}

fn adaptors(c: &mut Criterion) {
    adaptors_on(c, "sim", sim);
    adaptors_on(c, "null", null);
}

criterion_group!(benches, adaptors);
criterion_main!(benches);
