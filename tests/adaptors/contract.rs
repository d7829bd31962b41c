//! The shared contract ([`support::suite`]) over every resource and
//! decorator, each on its own: allocate and free with nothing kept after,
//! 0 bytes, a block used across streams, bad input refused with nothing
//! changed.

use std::sync::Arc;

use streamalloc::{
    Budget, BudgetResource, CacheConfig, CachingResource, DebugGuardResource, GuardConfig,
    RetryOnOomResource, SimResource, Stats, StatsResource, TracingResource,
};

use crate::support::suite::contract;

/// Nothing to do after a free: it reaches the resource below at once.
fn nothing<R>(_: &R) {}

#[test]
fn the_bare_resource() {
    contract(|inner: Arc<SimResource>| inner, nothing);
}

#[test]
fn the_cache_with_size_classes() {
    contract(
        |inner| CachingResource::with_config(inner, CacheConfig::default().virtual_memory(false)),
        nothing,
    );
}

#[test]
fn the_cache_with_its_arena() {
    contract(CachingResource::new, nothing);
}

#[test]
fn a_budget() {
    let budget = Budget::new(64 << 20);
    contract(|inner| BudgetResource::new(inner, &budget), nothing);
}

#[test]
fn stats() {
    let stats = Stats::new();
    contract(|inner| StatsResource::new(inner, &stats), nothing);
}

#[test]
fn tracing() {
    contract(TracingResource::new, nothing);
}

#[test]
fn retry_on_oom() {
    contract(RetryOnOomResource::new, nothing);
}

#[test]
fn a_debug_guard() {
    contract(
        |inner| DebugGuardResource::new(inner, GuardConfig::new()),
        |guard| {
            guard.flush().unwrap();
        },
    );
}
