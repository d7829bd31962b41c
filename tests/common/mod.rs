//! Shared set-up for the integration tests: one test body, every backend.

#![allow(dead_code)]

use std::sync::Arc;

use streamalloc::gpu::Gpu;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{AsyncCudaResource, SimResource, StreamId, StreamOrderedResource, StreamPool};

/// A resource, its pool's stream ids, and (on the simulated device) the
/// device, so that tests can read races.
pub struct Fixture<G: Gpu> {
    pub resource: Arc<StreamOrderedResource<G>>,
    pub pool: Arc<StreamPool>,
    pub streams: Vec<StreamId>,
    pub sim: Option<Arc<SimGpu>>,
}

impl<G: Gpu> Fixture<G> {
    pub fn stream(&self, i: usize) -> StreamId {
        self.streams[i]
    }
}

/// A manual (deterministic) simulated device with `streams` streams.
pub fn sim(streams: usize) -> Fixture<SimGpu> {
    sim_with(
        SimGpu::builder().manual().capacity(64 << 30).build(),
        streams,
    )
}

pub fn sim_with(gpu: Arc<SimGpu>, streams: usize) -> Fixture<SimGpu> {
    let pool = gpu.stream_pool(streams);
    let resource = Arc::new(SimResource::new(gpu.clone(), pool.clone()));
    Fixture {
        streams: pool.ids().collect(),
        resource,
        pool,
        sim: Some(gpu),
    }
}

/// Device 0 through cudarc, with `streams` new streams.
pub fn cuda(streams: usize) -> Fixture<streamalloc::gpu::cuda::CudaGpu> {
    let ctx = streamalloc::gpu::cuda::CudaGpu::open(0).expect("a CUDA device");
    let pool = StreamPool::cuda(&ctx, streams).expect("streams");
    let resource = Arc::new(AsyncCudaResource::new(ctx, 0, pool.clone()));
    Fixture {
        streams: pool.ids().collect(),
        resource,
        pool,
        sim: None,
    }
}
