//! The pinned host pool on the simulated device.

#[path = "../support/mod.rs"]
mod support;

mod pool;
