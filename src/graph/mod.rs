//! CUDA graphs: capture a step on one of the pool's streams once, replay it
//! many times, await each replay with the crate's futures.
//!
//! Inference servers capture their steady-state step (a few kernels, copies
//! and temporary buffers) into a CUDA graph and replay it for every token:
//! one launch instead of dozens. This module is the safe path through that
//! with a stream-ordered resource:
//!
//! ```text
//!  res.begin_capture(stream, mode) ─▶ GraphCapture   work queued on `stream` is recorded:
//!                                      │              allocate, use and free temporaries,
//!                                      │              launch kernels, copy
//!                            .end() ───▶ CapturedGraph  instantiated, owned
//!                                      │
//!          unsafe graph.launch(s) ──────▶ EventFuture   one replay; completes when the GPU
//!                                      │                has run it (a point recorded after
//!                                      │                the launch, outside any capture)
//!                              drop ───▶ the graph is destroyed, and the resource
//!                                        stack releases the memory of its capture
//! ```
//!
//! [`AsyncResource::capture_graph`](crate::AsyncResource::capture_graph) wraps the capture around a closure.
//!
//! # What a capture changes
//!
//! While a stream is capturing, the futures layer refuses to make a
//! completion future on it
//! ([`ResourceError::StreamCapturing`](crate::ResourceError::StreamCapturing)): the
//! point's event would be part of the graph, and querying it would
//! invalidate the user's capture. Frees queued during the capture are part of
//! the graph; no notification is queued into it. Await a replay's launch
//! instead.
//!
//! Memory allocated inside the capture (graph memory) belongs to the graph:
//! every replay allocates and frees it at the same addresses, and it goes
//! back when the graph is dropped. Allocate and free a step's temporaries
//! inside the capture; allocate what outlives a step (inputs, outputs,
//! weights) before it, and keep it alive as long as the graph may run
//! (that is what [`CapturedGraph::launch`]'s safety contract asks).
//!
//! # A block the capture allocated and did not free
//!
//! A block allocated on the capturing stream (by the capturing code or by
//! any other thread) and still held when the capture ends is made again by
//! every replay, at the same address, and holds that replay's output until
//! the next launch; before the first replay it has no memory behind it.
//! The crate frees each replay's instance exactly once, whatever thread
//! drops the block and whenever:
//!
//! - while the graph lives, dropping the block frees nothing on the device:
//!   it becomes the graph's, and the graph frees the instance of its last
//!   replay before its next launch, or behind that replay when it is
//!   dropped;
//! - a launch is refused while such a block is still held and holds the
//!   last replay's output: drop it first (CUDA refuses that launch too);
//! - once the graph is gone, dropping the block frees the instance the
//!   last replay left (behind that replay, whatever its stream), or
//!   nothing when the graph never ran;
//! - a use of the block through the crate (a buffer's helpers, a launch)
//!   on another stream than the last replay's waits for that stream: the
//!   replay wrote the block, whether or not its future was awaited (for
//!   the plain resource's graph memory nodes; a block a cache handed out
//!   in the capture is not ordered so yet);
//! - dropped while another capture would take its free (its stream, or
//!   the last replay's, capturing), the block is freed once that capture
//!   ends, not leaked (the pool keeps the free; `device::deferred_frees`).
//!
//! The mirror case, a block allocated before the capture and dropped
//! while its stream captures (by another thread, say), is adopted by the
//! graph: its free is not captured (the graph would free it at every
//! replay), the replays may use it up to that point, and the graph frees it
//! once when it is dropped, behind its last replay.
//!
//! The pool's ledger (`device::graph_memory`) keeps this for every resource
//! and graph on the pool; it sees the launches made through
//! [`CapturedGraph::launch`], not the raw seam's.
//!
//! # Examples
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use streamalloc::gpu::CaptureMode;
//! use streamalloc::gpu::sim::{MemAccess, SimGpu};
//! use streamalloc::{AllocTag, AsyncResource, Device, ResourceError};
//!
//! let gpu = SimGpu::new();
//! let device = Device::simulated(&gpu, 1);
//! let res = AsyncResource::on(&device)?;
//! let s = device.stream(0)?;
//! let output = res.try_allocate_buffer::<f32>(1024, s, AllocTag("out"))?;
//!
//! let ((), graph) = res.capture_graph(s, CaptureMode::Relaxed, |capture| {
//!     let raw = capture.raw_stream();
//!     let mut tmp = res.try_allocate_buffer::<f32>(1024, s, AllocTag("tmp"))?;
//!     tmp.fill_bytes_on(s, 0)?;
//!     gpu.launch_kernel(raw, &[MemAccess::read(tmp.block()), MemAccess::write(output.block())])
//!         .map_err(ResourceError::from)?;
//!     Ok::<_, ResourceError>(()) // `tmp` is freed here, inside the capture
//! })?;
//! for _ in 0..3 {
//!     // SAFETY: `output`, the one buffer the graph uses that it did not
//!     // allocate, lives until after the graph.
//!     unsafe { graph.launch(s) }?.await?;
//! }
//! drop(graph);
//! drop(output);
//! assert!(gpu.races().is_empty());
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]

mod capture;
mod captured;

pub use capture::GraphCapture;
pub use captured::CapturedGraph;
