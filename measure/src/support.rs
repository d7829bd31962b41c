//! The peers that the allocation tables compare (`bin/bench_table.rs`),
//! and the null backend of the trace replays and `cold_points`.
//!
//! The harness itself ([`Bench`], [`NullGpu`], the simulated and null
//! set-ups) is the library's bench support, `benches/support/mod.rs`,
//! included here so that there is one copy; this file adds what needs a
//! GPU: the CUDA backend and cudarc's own pair, the peer beside it.

use std::sync::Arc;

use streamalloc::StreamPool;
use streamalloc::gpu::cuda::CudaGpu;

#[path = "../../benches/support/mod.rs"]
mod shared;
pub use shared::*;

/// CUDA device 0, if the driver loads and the device opens.
pub fn cuda() -> Option<Bench<CudaGpu>> {
    if !streamalloc::gpu::cuda::cuda_present() {
        return None;
    }
    let ctx = CudaGpu::open(0).ok()?;
    let gpu = Arc::new(CudaGpu::try_new(ctx.clone()).ok()?);
    let pool = StreamPool::cuda(&ctx, THREADS[THREADS.len() - 1]).ok()?;
    Some(Bench::new("cuda", gpu, pool))
}

/// cudarc's own `CudaSlice` pair: `stream.alloc::<u8>(n)` and drop.
#[inline]
pub fn cudarc_pair(stream: &Arc<cudarc::driver::CudaStream>, bytes: usize) {
    let slice = streamalloc::gpu::cuda::cudarc_alloc(stream, bytes).unwrap();
    drop(slice);
}
