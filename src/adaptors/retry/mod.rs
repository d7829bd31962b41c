//! RetryOnOomResource: when memory is short, reap what the GPU has finished freeing
//! and try once more.
//!
//! # State
//!
//! Only a counter of retries made, for diagnostics.
//!
//! # What it does
//!
//! An allocation that fails with
//! [`OutOfMemory`](crate::ResourceError::OutOfMemory) or
//! [`BudgetExceeded`](crate::ResourceError::BudgetExceeded) may succeed once
//! the frees already queued have executed and been drained. The decorator
//! calls [`reap_pending`](crate::DeviceMemoryResource::reap_pending) on the
//! inner stack (which synchronizes the streams with queued frees, and through
//! a budget layer below gives their bytes back), then retries exactly once
//! and reports the second result. Any other error is returned at once.
//!
//! Whether a budget refusal is retried depends on the order of the stack:
//! only a budget *below* this layer is reaped before the retry (see the
//! [builder's `# Order`](crate::ResourceBuilder#order)).

// The one `unsafe` is the resource's `unsafe impl DeviceMemoryResource`,
// which vouches for blocks and streams that are the inner resource's.
#![deny(unsafe_code)]

mod layer;
mod resource;

pub use layer::RetryOnOomLayer;
pub use resource::RetryOnOomResource;
