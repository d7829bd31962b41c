//! streamalloc as PyTorch's CUDA allocator.
//!
//! A shared library (`target/release/libtorch_alloc.so`) exporting the two
//! functions PyTorch's pluggable allocator calls, and a few more a script
//! calls through `ctypes`:
//!
//! ```python
//! import torch
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "target/release/libtorch_alloc.so", "streamalloc_torch_alloc", "streamalloc_torch_free")
//! torch.cuda.memory.change_current_allocator(alloc)   # before the first CUDA tensor
//! ```
//!
//! Every tensor PyTorch makes on the GPU is then a block of streamalloc's
//! cache ([`CachingResource`](streamalloc::CachingResource) over the
//! [`StreamOrderedResource`](streamalloc::StreamOrderedResource)), on
//! PyTorch's own context and streams.
//!
//! # What PyTorch calls
//!
//! `CUDAPluggableAllocator` (PyTorch 2.x,
//! `torch/csrc/cuda/CUDAPluggableAllocator.cpp`) calls
//! `alloc(size, device, stream)` with the current stream of the current
//! device, keeps `(size, device, stream)` per pointer itself, and calls
//! `free(ptr, size, device, stream)` with the stream the block was
//! *allocated* on when the tensor's storage dies. Its other hooks are
//! C++ setters that Python cannot reach (`set_init_fn`, `set_reset_fn` for
//! `torch.cuda.empty_cache()`, `set_memory_fraction_fn`,
//! `set_record_stream_fn`, and the graph-pool trio
//! `set_begin_allocate_to_pool` / `set_end_allocate_to_pool_fn` /
//! `set_release_pool`); without them PyTorch's calls do nothing, and its
//! statistics calls (`torch.cuda.max_memory_reserved`, ...) raise. So this
//! library exports each hook with the signature PyTorch's setter takes
//! ([`streamalloc_torch_init`], [`streamalloc_torch_empty_cache`],
//! [`streamalloc_torch_set_memory_fraction`],
//! [`streamalloc_torch_record_stream`]), or one a lambda adapts
//! ([`streamalloc_torch_capture_begin`], [`streamalloc_torch_capture_end`]:
//! the begin and end of each capture), for a C++ extension that installs
//! them (`scripts/torch_hooks.py` compiles one with PyTorch's
//! `load_inline`), and for `ctypes`; and its own statistics
//! ([`streamalloc_torch_reserved_bytes`], ...).
//!
//! # Streams
//!
//! PyTorch makes its streams itself, lazily: the legacy default stream (the
//! null handle), 32 pool streams per priority created at the first
//! `torch.cuda.Stream()`, and any `ExternalStream`. The allocator learns
//! each one from the first `alloc` that names it and registers it in the
//! device's [open-ended pool](streamalloc::StreamPool::open_ended), through
//! the crate's `unsafe` registration; the argument that PyTorch's handles
//! keep the contract is in [`streams`]. The per-thread default stream
//! (`cudaStreamPerThread`) is another stream on every thread and is
//! refused.
//!
//! # Stream ordering, and `record_stream`
//!
//! A free is queued on the stream the block was allocated on. The cache
//! hands the range to that stream's next allocation at once (its later work
//! runs after the free), and to another stream only once the host saw the
//! GPU done with the free (a fence past it queried complete); until then
//! the other stream takes other memory, as PyTorch's own allocator, which
//! never moves memory between streams, grows the stream's pool. No
//! PyTorch stream is made to wait on another for memory (but as the last
//! resort before out of memory); `STREAMALLOC_TORCH_CROSS_STREAM=wait`
//! lends behind a wait on the GPU instead (see [`config`]).
//!
//! A tensor *used* on a second stream is PyTorch's `record_stream` case:
//! the free must also wait for that stream. With the hook installed
//! ([`streamalloc_torch_record_stream`]), the allocator remembers the
//! stream and, at the free, makes the free wait for everything queued on it
//! so far (as PyTorch's allocator records its event at the free). Without
//! the hook, which is the case for a plain `CUDAPluggableAllocator` from
//! Python, PyTorch drops `record_stream` before it reaches any pluggable
//! allocator: then, as with PyTorch's own allocator and no
//! `record_stream`, the program must order the side stream back into the
//! allocating stream (`main.wait_stream(side)`) before the tensor dies.
//! Reuse on *another* stream stays safe either way; what the missing hook
//! costs is the guarantee for same-stream reuse after an unordered side use.
//!
//! # Failure
//!
//! Nothing unwinds across the C boundary: each function catches panics,
//! and a failed `alloc` returns null, keeps the reason for
//! [`streamalloc_torch_last_error`] and logs it (`tracing`, at warn
//! level). Before failing, an allocation gives idle memory back and tries
//! again. PyTorch 2.x does not check the pointer its pluggable allocator
//! returns, so a null return surfaces later as an error of the kernel that
//! touches it: the comparison script checks [`streamalloc_torch_failures`]
//! after every run.
//!
//! # Not supported
//!
//! CUDA graphs (`torch.cuda.graph`, `torch.compile(mode="reduce-overhead")`):
//! PyTorch tells a pluggable allocator nothing about a capture from
//! Python. The cache asks the driver whether a stream is capturing at
//! every allocation and free, or, once `scripts/torch_hooks.py` installed
//! PyTorch's capture hooks ([`streamalloc_torch_announce_captures`]), only
//! while `torch.cuda.graph` says a capture is underway (see [`captures`];
//! `STREAMALLOC_TORCH_CAPTURE=off` skips the question in a program that
//! never captures), so memory a capture takes stays its graph's for the
//! rest of the process: never reused under a replay, never given back. But a growth of the arena during a capture
//! in PyTorch's default (global) mode makes driver calls the capture may
//! refuse, which PyTorch's own allocator allows by relaxing the mode
//! around them: captures are untested and unsupported. IPC handles, `torch.cuda.memory_snapshot()` and PyTorch's own
//! statistics calls are PyTorch's and refuse a pluggable allocator.
//!
//! # Configuration
//!
//! `STREAMALLOC_DEVICE=sim` runs the allocator on the simulated device
//! (its addresses are not device memory: for tests of the C interface
//! only; [`simulate`] does the same from Rust). The cache's configuration,
//! and the variables that change it, are in [`config`];
//! `STREAMALLOC_TORCH_CAPTURE` in [`captures`].

#![deny(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod allocator;
mod blocks;
pub mod captures;
pub mod config;
mod context;
mod device_table;
mod ffi;
pub mod streams;

pub use allocator::TorchAllocStats;
pub use device_table::simulate;
pub use ffi::*;
