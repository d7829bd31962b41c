//! The futures layer on the simulated device: waiting allocations, events,
//! reservations, the reaper, capture, faults, drops and shutdown.

#[path = "../support/mod.rs"]
mod support;

mod alloc;
mod backpressure;
mod cancel_everywhere;
mod capture;
mod drop;
mod event;
mod fault;
mod lazy;
mod nonblocking;
mod reaper;
mod reserve;
mod shutdown;
mod stress;
mod traits;
mod wake_scope;
