//! The staged service of `service_bench --staged` on the simulated device:
//! the streamalloc way through a `HostPool` (the peers need CUDA). Every
//! request answered, no race (the host's reads and writes of the pinned
//! buffers included), the pool reused, nothing left in use or outstanding.

use std::sync::Arc;

use streamalloc::gpu::GpuResult;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    AsyncResource, CachingResource, Device, HostPool, HostPoolConfig, RawStream, SimResource,
    StreamPool,
};
use streamalloc_measure::service::staged::streamalloc_way::{StagedLevel, run_level};
use streamalloc_measure::service::streamalloc_way::release_all;
use streamalloc_measure::service::{Dims, ModelKernels, RequestIo, SimKernels};

const STREAMS: usize = 8;

type Service = AsyncResource<CachingResource<Arc<SimResource>>>;

/// The streamalloc way's stack and a host pool on a threaded simulated
/// device.
fn service(seed: u64) -> (Service, HostPool, Arc<SimGpu>) {
    let gpu = SimGpu::builder()
        .seed(seed)
        .op_latency(std::time::Duration::from_micros(2))
        .build();
    let device = Device::simulated(&gpu, STREAMS);
    let inner = Arc::new(SimResource::new(&device));
    // SAFETY: the stack's bottom resource was made on this device.
    let res = unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }
        .expect("async resource");
    (res, HostPool::new(&device, HostPoolConfig::new()), gpu)
}

fn level(clients: usize, requests_per_client: usize) -> StagedLevel {
    StagedLevel {
        dims: Dims::BENCH,
        clients,
        requests_per_client,
        seed: 11,
        verify: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_staged_request_is_answered_without_race_through_a_reused_pool() {
    let (res, pool, gpu) = service(1);
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    let mut served = 0;
    for (clients, per_client) in [(1, 24), (16, 6), (64, 3)] {
        let row = run_level(&res, &pool, &kernels, level(clients, per_client))
            .await
            .unwrap_or_else(|e| panic!("{clients} clients: {e}"));
        assert_eq!(
            row.row.requests,
            clients * per_client,
            "every request answered"
        );
        assert!(row.row.p50 <= row.row.p99);
        assert_eq!(row.row.peak_blocked, 0, "no thread blocks in a wait");
        assert!(row.pinned_peak > 0);
        // The warm-up pass plus the measured one, two host buffers each.
        served += 2 * (clients * per_client.min(2) + clients * per_client);
    }
    let stats = pool.stats();
    assert_eq!(
        stats.pins + stats.reuses,
        served as u64,
        "one host allocation per copy direction and request"
    );
    assert!(
        stats.reuses > 3 * stats.pins,
        "the pool hands blocks out again: {} pins, {} reuses",
        stats.pins,
        stats.reuses
    );
    assert_eq!(
        (stats.in_use_bytes, stats.pending_bytes),
        (0, 0),
        "every host buffer back, idle"
    );
    let races = gpu.races();
    assert!(races.is_empty(), "races: {races:?}");
    assert_eq!(release_all(&res).await.expect("release"), 0);
}

/// The model queued on another stream than the copies, unordered: the
/// race detector must report the copy in racing the model's read, which
/// shows the test above would see a missing order in the staged way.
struct ModelOnAnotherStream {
    gpu: Arc<SimGpu>,
    pool: Arc<StreamPool>,
}

impl ModelKernels for ModelOnAnotherStream {
    fn enqueue_model(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        let other = (0..self.pool.len())
            .filter_map(|i| self.pool.raw(self.pool.id(i)?).ok())
            .find(|&raw| raw != stream)
            .expect("a second stream");
        SimKernels::new(self.gpu.clone()).enqueue_model(stream, io)?;
        self.gpu.launch_kernel(other, &[MemAccess::read(io.x)])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unordered_read_of_the_staged_input_is_reported() {
    let (res, pool, gpu) = service(2);
    let kernels = Arc::new(ModelOnAnotherStream {
        gpu: gpu.clone(),
        pool: res.stream_pool().clone(),
    });
    let row = run_level(&res, &pool, &kernels, level(4, 2))
        .await
        .expect("the level runs");
    assert_eq!(row.row.requests, 8);
    assert!(!gpu.races().is_empty(), "the planted race must be reported");
}
