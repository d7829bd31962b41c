//! A caching tier over a simulated device with streams, as the arena's
//! tests drive it: allocate through `cache`, queue kernels on its streams,
//! and check the race detector. Each test file adds its own counters.

use std::sync::Arc;

use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{CacheConfig, CachingResource};
use streamalloc::{SimResource, StreamId, StreamPool};

/// A cache over the stream-ordered resource of a simulated device.
pub struct ArenaCache {
    pub gpu: Arc<SimGpu>,
    pub cache: CachingResource<Arc<SimResource>>,
    pub pool: Arc<StreamPool>,
    pub streams: Vec<StreamId>,
}

impl ArenaCache {
    /// On a manual simulated device of 64 GiB, with `streams` streams.
    pub fn manual(streams: usize, config: CacheConfig) -> Self {
        Self::on(
            SimGpu::builder().manual().capacity(64 << 30).build(),
            streams,
            config,
        )
    }

    /// On `gpu`, with `streams` streams.
    pub fn on(gpu: Arc<SimGpu>, streams: usize, config: CacheConfig) -> Self {
        let f = super::sim_with(gpu, streams);
        ArenaCache {
            gpu: f.sim.clone().unwrap(),
            cache: CachingResource::with_config(f.resource.clone(), config),
            pool: f.pool.clone(),
            streams: f.streams.clone(),
        }
    }

    /// The id of stream `i`.
    pub fn s(&self, i: usize) -> StreamId {
        self.streams[i]
    }

    /// Queues a kernel making `access` on `stream` (races checked now).
    pub fn kernel(&self, stream: StreamId, access: MemAccess) {
        let raw = self.pool.raw(stream).unwrap();
        self.gpu.launch_kernel(raw, &[access]).unwrap();
    }

    /// Runs the device dry and asserts it saw no race.
    pub fn assert_race_free(&self) {
        self.gpu.run_until_idle();
        assert!(self.gpu.races().is_empty(), "{:#?}", self.gpu.races());
    }
}
