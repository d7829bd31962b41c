//! An inference service, measured three ways: the same tokio program served
//! by streamalloc, by cudarc alone, and by NVIDIA's cuda-async.
//!
//! `clients` tasks each send requests one after another. A request draws its
//! batch and sequence length from a seeded RNG ([`RequestShape`]), gets its
//! device memory, copies its input in from pinned host memory, runs a small
//! model (four GEMMs through cuBLAS, two ReLUs, see [`cuda_model`]), copies
//! the result out to the client's pinned buffer, awaits completion and lets
//! its memory go. Only how memory is obtained and how completion is awaited
//! differ between the ways:
//!
//! ```text
//!  way           memory                                   completion
//!  streamalloc   AsyncResource over the caching tier:     one EventFuture per launch
//!                owned Buffers, freed on drop              (host-function notifications)
//!  cudarc        a CudaSlice per buffer (cuMemAllocAsync)  stream.synchronize() in spawn_blocking
//!  cuda-async    cuMemAllocAsync in a DeviceOp, freed by   the DeviceFuture (inline spin, then
//!                its DeviceBox after the work              its flag-write reactor thread)
//! ```
//!
//! Every way reports a [`LevelResult`]: requests/s, p50/p99 latency, the
//! peak memory its backend held against the peak of live requested bytes,
//! and how many threads sat blocked in a wait ([`Recorder`]).
//!
//! [`staged`] is the same service with real input and output copies: the
//! host writes each request's input into pinned memory and checks its
//! result, and each way stages the bytes its own way (streamalloc through
//! a `HostPool`, the peers through pinned buffers per client).
//!
//! On the simulated device the streamalloc way runs with simulated kernels
//! ([`SimKernels`]): the CI test checks that every request is answered, that
//! the race detector finds nothing and that no byte is left outstanding.

mod clients;
#[cfg(feature = "peer-cuda-async")]
pub mod cuda_async_way;
pub mod cuda_model;
pub mod cudarc_way;
pub mod fills;
mod kernels;
pub mod plot;
mod recorder;
mod shape;
pub mod staged;
pub mod streamalloc_way;
mod threads;
pub mod timeline;

pub use kernels::{ModelKernels, RequestIo, RequestKernels, SimKernels};
pub use recorder::{LevelResult, Recorder, csv_header};
pub use shape::{Dims, RequestShape, Shapes};
pub use threads::ThreadSampler;
