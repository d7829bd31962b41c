//! The simulated device itself: stream capture, virtual memory, and the
//! regressions found in it.

#[path = "../support/mod.rs"]
mod support;

mod capture;
mod kernels;
mod regressions;
mod virtual_memory;
