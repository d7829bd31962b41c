//! The caching tier on the simulated device: the size classes, the
//! virtual-memory arena, the graph pools, sleep and wake, a cache over a
//! full budget, and a budget above the cache.

#[path = "../support/mod.rs"]
mod support;

mod arena;
mod budget_above;
mod budget_full;
mod budget_lends;
mod cross_stream;
mod graph_pools;
mod size_class;
mod sleep;
