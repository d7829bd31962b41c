//! Measurement and tools for streamalloc: the latency and allocation tables,
//! the driver cost probes, and the peers they are measured against. Nothing
//! here is part of the library; see `BENCHMARKS.md` for what each binary
//! measures and the command that reproduces each figure.

#![allow(missing_docs)]

pub mod calls;
pub mod decorator_cost;
pub mod memory_plot;
pub mod service;
pub mod support;
pub mod trace;
