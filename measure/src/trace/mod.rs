//! Allocation traces of real programs, replayed through any resource stack.
//!
//! A trace (`measure/traces/README.md`
//! describes the two recorded from PyTorch running GPT-2) is a gzip CSV of
//! `op,id,size,stream` lines: every allocation and free a program asked
//! for, in order. Replaying one through a
//! [`DeviceMemoryResource`](streamalloc::DeviceMemoryResource) stack measures
//! an allocator on real work instead of loops:
//!
//! - [`format`](mod@format): reading and checking a trace ([`Trace::read`]; a bad line is
//!   an error that names its line number), cutting and writing one;
//! - [`requested`]: the bytes the program had live, and their peak;
//! - [`replay`](mod@replay): the timed replay (nanoseconds per operation with
//!   the bookkeeping control subtracted, as `torch_cpp_replay.py` does) and
//!   the device memory the stack held, read from the backend
//!   ([`Gpu::memory_held`](streamalloc::gpu::Gpu::memory_held));
//! - [`stack`]: the stacks by name (`resource`, `cache`, `cache-budget`) on
//!   CUDA or on the simulated device;
//! - [`calls`](crate::calls) (the crate's, shared with the service
//!   benchmark): the driver calls a replay makes, by kind, and what they
//!   would cost on the H200;
//! - [`synthetic`]: traces of other shapes built from a seed (scaled, ramp,
//!   sawtooth, layered passes, many streams, a spike after a plateau), to
//!   check a policy on traces it was not tuned on;
//! - [`plot`]: a PNG of requested against held bytes over the trace.
//!
//! The binary `trace_replay` puts them together.

pub mod format;
pub mod plot;
pub mod replay;
pub mod requested;
pub mod stack;
pub mod synthetic;

pub use crate::calls::{CallCounts, CountingGpu};
pub use format::{OpKind, Trace, TraceError, TraceOp};
pub use replay::{Replay, ReplayError, Target, replay};
pub use requested::Requested;
pub use stack::{DeviceKind, ReplayConfig, StackKind, replay_stack};
