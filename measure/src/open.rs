//! Shared set-up of the examples: a real GPU when one is present, the
//! simulated device otherwise (or with `--sim`).

#![allow(dead_code)]

use std::sync::Arc;

use streamalloc::futures::AsyncResource;
use streamalloc::gpu::cuda::{CudaGpu, cuda_present};
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AsyncCudaResource, ResourceResult, SimResource, StreamPool};

/// The device an example runs on.
pub enum Setup {
    /// The simulated device (its race detector can be read).
    Sim(AsyncResource<SimResource>, Arc<SimGpu>),
    /// CUDA device 0.
    Cuda(AsyncResource<AsyncCudaResource>),
}

/// Opens CUDA device 0 with `streams` streams when possible (and `--sim` was
/// not passed), else a threaded simulated device of `sim_capacity` bytes.
pub fn setup(streams: usize, sim_capacity: usize) -> ResourceResult<Setup> {
    let force_sim = std::env::args().any(|a| a == "--sim");
    if !force_sim && cuda_present() {
        match open_cuda(streams) {
            Ok(res) => return Ok(Setup::Cuda(res)),
            Err(e) => println!("CUDA present but unusable ({e}); using the simulated device"),
        }
    }
    let gpu = SimGpu::builder()
        .capacity(sim_capacity)
        .op_latency(std::time::Duration::from_micros(50))
        .build();
    let pool = gpu.stream_pool(streams);
    let inner = Arc::new(SimResource::new(gpu.clone(), pool));
    Ok(Setup::Sim(AsyncResource::new(inner)?, gpu))
}

fn open_cuda(streams: usize) -> ResourceResult<AsyncResource<AsyncCudaResource>> {
    let ctx = CudaGpu::open(0)?;
    let pool = StreamPool::cuda(&ctx, streams)?;
    let inner = Arc::new(AsyncCudaResource::new(ctx, 0, pool));
    AsyncResource::new(inner)
}
