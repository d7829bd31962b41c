//! The resource layer: the stream-ordered resource on the simulated device, its
//! contract suite, bad input, faults, stress, observability, graphs and the
//! launch recorder.

#[path = "../support/mod.rs"]
mod support;

mod bad_input;
mod bad_input_stacks;
mod device;
mod fault_sweep;
mod graph;
mod launch_recorder;
mod multi_device;
mod observe;
mod panics;
mod request_costs;
mod resource;
mod smoke;
mod stress;
mod trust;
