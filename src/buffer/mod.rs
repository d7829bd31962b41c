//! Owned buffers: typed device memory that frees itself, and that cudarc's
//! copies, launches and cuBLAS calls take directly.
//!
//! A [`DeviceBlock`](crate::DeviceBlock) is a descriptor: dropping it frees
//! nothing. A [`Buffer<T>`] owns its block and a handle on its resource, as
//! cudarc's `CudaSlice` or tokio's `OwnedSemaphorePermit` do: when it drops
//! (a task cancelled at an await, a panic, a `?`), it queues its
//! stream-ordered free after every use recorded on it, and the bytes come
//! back through the resource's accounting (for an
//! [`AsyncResource`](crate::AsyncResource), through completion
//! notifications, with no synchronize).
//!
//! # Uses, and how they are ordered
//!
//! ```text
//!  Buffer<T> ─ owns ─ DeviceBlock + Arc<resource>          Drop: record, then free
//!     │ slice / slice_mut        → BufferView / BufferViewMut (bounds-checked)
//!     │ read_on / write_on       → UseGuard / UseGuardMut   (prepare; drop = finish)
//!     │ fill_bytes_on / copy_from_on                         (the safe helpers)
//!     │ AsyncResource::launch    → BufferLaunch             (one future per launch)
//!     └ CudaBuffer<T> (CUDA)     → cudarc's DevicePtr / DevicePtrMut / PushKernelArg
//! ```
//!
//! Every path ends in the resource's per-block bookkeeping: one read event
//! per (block, stream) and one last write. A use on stream `s` first makes
//! `s` wait for the last write on another stream (and, for a write, every
//! read on another stream); once queued, the use is recorded, so that later
//! conflicting uses and the free wait for it. The simulated device's race
//! detector checks all of it in tests.
//!
//! cudarc's guard cannot call back into this crate, so uses made through
//! cudarc are noted in a small ledger and recorded at the next access that
//! could conflict with them, which Rust's borrows place after cudarc queued
//! its work: a write came through `&mut`, so any later access follows it;
//! a read came through `&`, so only a later write (`&mut`) or the buffer's
//! end follows it surely, and those are what record it. Reads need no order
//! among themselves.
//!
//! # Errors with no caller
//! A `Drop` cannot return an error: those go to [`drop_error_count`] and
//! [`take_drop_error`], and to a `tracing` error event. Nothing panics.
//!
//! # Streams you already have
//! A pool built from your own cudarc streams
//! ([`StreamPool::from_cuda_streams`](crate::StreamPool::from_cuda_streams))
//! registers them: resources and buffers then order work on them, and
//! cudarc calls given one of them find it.

#![deny(unsafe_code)]

mod alloc;
#[cfg(feature = "cuda")]
mod cuda;
mod drop_errors;
mod element;
mod guard;
mod home;
mod launch;
mod ledger;
mod owned;
mod refused;
mod reserved;
mod view;

pub use alloc::BufferFuture;
#[cfg(feature = "cuda")]
pub use cuda::{CudaBuffer, CudaView, CudaViewMut};
pub use drop_errors::{drop_error_count, take_drop_error};
pub use element::DeviceElement;
pub use guard::{UseGuard, UseGuardMut};
pub use launch::BufferLaunch;
pub use owned::Buffer;
pub use refused::RefusedConversion;
pub use view::{BufferView, BufferViewMut};
