//! The launch recorder: declare what one launch reads and writes, check it
//! before queuing anything, then order the launch against every other use.
//!
//! # The protocol
//!
//! ```text
//!  LaunchRecorder::new(&resource, stream).read(&a).write(&b)
//!     preflight  every block live? every cross-stream use trackable?   (nothing queued yet)
//!     prepare    prepare_block_use per block: waits on other streams' uses
//!     enqueue    the user's closure queues the kernel / copy on the raw stream
//!     finish     finish_block_use per block: records where the launch ends
//! ```
//!
//! [`LaunchRecorder::launch`] runs all four. The steps are public too, so
//! that the futures layer can queue its completion notification after
//! `finish` and hand back a future.
//!
//! A launch written only through the recorder needs no other
//! synchronization: the resource inserts the waits, and a later free of any
//! declared block waits for the launch.

#![forbid(unsafe_code)]

mod recorder;

pub use recorder::{LaunchBlockUse, LaunchRecorder};
