//! The simulated device itself: stream capture, virtual memory, and the
//! regressions found in it.

#[path = "../support/mod.rs"]
mod support;

mod capture;
mod regressions;
mod timing;
mod virtual_memory;
