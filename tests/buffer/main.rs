//! Owned buffers on the simulated device.

#[path = "../support/mod.rs"]
mod support;

mod owned;
