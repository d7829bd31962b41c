//! The inference service of `service_bench` on the simulated device, the
//! streamalloc way with simulated kernels (the cudarc and cuda-async ways
//! need CUDA: `service_bench` runs them on a GPU). Correctness only: every
//! request answered, no race, nothing outstanding at the end.

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::gpu::{Gpu, GpuResult};
use streamalloc::{
    AllocTag, CachingResource, Device, DeviceBlock, DeviceMemoryResource, RawStream, SimResource,
    StreamId, StreamPool,
};
use streamalloc_measure::service::streamalloc_way::{self, run_level};
use streamalloc_measure::service::{
    Dims, RequestIo, RequestKernels, RequestShape, Shapes, SimKernels,
};

const STREAMS: usize = 8;

type Service = AsyncResource<CachingResource<Arc<SimResource>>>;

/// The streamalloc way's stack on a threaded simulated device: the caching
/// tier over the stream-ordered resource, futures on top.
fn service(seed: u64) -> (Service, Arc<SimGpu>) {
    let gpu = SimGpu::builder()
        .seed(seed)
        .op_latency(std::time::Duration::from_micros(2))
        .build();
    let device = Device::simulated(&gpu, STREAMS);
    let inner = Arc::new(SimResource::new(&device));
    let res =
        // SAFETY: the stack's bottom resource was made on this device.
        unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }.expect("async resource");
    (res, gpu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_request_is_answered_without_race_and_nothing_stays_outstanding() {
    let (res, gpu) = service(1);
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    for (clients, per_client) in [(1, 40), (16, 8), (64, 4), (256, 2)] {
        let row = run_level(&res, &kernels, Dims::BENCH, clients, per_client, 42)
            .await
            .unwrap_or_else(|e| panic!("{clients} clients: {e}"));
        assert_eq!(
            row.requests,
            clients * per_client,
            "{clients} clients: every request answered"
        );
        assert_eq!(row.clients, clients);
        assert!(row.peak_requested > 0);
        assert!(
            row.peak_held >= row.peak_requested,
            "{clients} clients: the device held {} B at most, less than the {} B live",
            row.peak_held,
            row.peak_requested
        );
        eprintln!(
            "RATIO {clients} held={} req={} ratio={:.3}",
            row.peak_held,
            row.peak_requested,
            row.peak_held as f64 / row.peak_requested as f64
        );
        assert!(row.p50 <= row.p99);
        assert_eq!(row.peak_blocked, 0, "no thread blocks in a wait");
    }
    let races = gpu.races();
    assert!(races.is_empty(), "races: {races:?}");
    // Frees still pending reach the cache first, then it gives all back.
    let left = streamalloc_way::release_all(&res).await.expect("release");
    assert_eq!(left, 0, "0 B outstanding at the end");
    assert_eq!(res.bytes_outstanding(), 0);
    assert_eq!(res.inner().cached_bytes(), 0);
}

/// Kernels that also read the input on another stream, unordered: the race
/// detector must see it, which shows the test above would see a missing
/// wait in the service's ordering.
struct ReadsOnAnotherStream {
    gpu: Arc<SimGpu>,
    pool: Arc<StreamPool>,
    inner: SimKernels,
}

impl RequestKernels for ReadsOnAnotherStream {
    fn enqueue(&self, stream: RawStream, io: RequestIo<'_>) -> GpuResult<()> {
        self.inner.enqueue(stream, io)?;
        let other = (0..self.pool.len())
            .filter_map(|i| self.pool.raw(self.pool.id(i)?).ok())
            .find(|&raw| raw != stream)
            .expect("a second stream");
        self.gpu.launch_kernel(other, &[MemAccess::read(io.x)])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unordered_use_in_the_service_is_reported() {
    let (res, gpu) = service(2);
    let kernels = Arc::new(ReadsOnAnotherStream {
        gpu: gpu.clone(),
        pool: res.stream_pool().clone(),
        inner: SimKernels::new(gpu.clone()),
    });
    let row = run_level(&res, &kernels, Dims::BENCH, 4, 2, 7)
        .await
        .expect("the level runs");
    assert_eq!(row.requests, 8);
    assert!(!gpu.races().is_empty(), "the planted race must be reported");
}

/// The three `f32` buffers of a request of `shape`, allocated on `stream`.
fn request_buffers(
    cache: &CachingResource<Arc<SimResource>>,
    shape: RequestShape,
    stream: StreamId,
) -> Vec<DeviceBlock> {
    shape
        .elems(&Dims::BENCH)
        .iter()
        .map(|&n| {
            cache
                .allocate(n * 4, stream, AllocTag::UNTAGGED)
                .expect("allocate")
        })
        .collect()
}

/// One client's requests, in order on one stream with no threads (so the
/// held bytes are the same at every run): each request's three buffers
/// allocated, then freed. The sizes are drawn, so they rarely repeat, and
/// the cache must not place blocks around ones it keeps for a repeat that
/// does not come: it holds the pages its largest request needs, with the
/// slack over it, and no more. Kept blocks whatever the sizes held a page
/// or two more (16 MiB for 10.5 MiB live within the first 40 requests).
#[test]
fn one_client_of_drawn_sizes_holds_the_pages_its_largest_request_needs() {
    const PAGE: usize = 2 << 20;
    // `CacheConfig`'s default slack over the live high-water mark.
    const SLACK_PERCENT: usize = 7;
    for seed in [2026, 42, 7] {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, 1);
        let cache = CachingResource::new(Arc::new(SimResource::new(&device)));
        let stream = device.stream(0).expect("stream");
        let mut shapes = Shapes::new(seed, 0, Dims::BENCH);
        let mut peak = 0;
        for _ in 0..4096 {
            let shape = shapes.next_shape();
            peak = peak.max(shape.bytes(&Dims::BENCH));
            let blocks = request_buffers(&cache, shape, stream);
            for block in blocks {
                cache.deallocate(block).expect("free");
            }
            gpu.run_until_idle();
        }
        let floor = (peak + peak / 100 * SLACK_PERCENT).next_multiple_of(PAGE);
        let held = gpu.memory_held().expect("held").high;
        assert!(
            held <= floor,
            "seed {seed}: held {} MiB, the largest request {peak} B needs {} MiB",
            held >> 20,
            floor >> 20
        );
    }
}

/// 64 clients on 8 streams whose requests free their buffers without
/// awaiting their kernels, on a simulated device that runs fewer
/// operations than they queue: each stream runs far ahead of the GPU,
/// with more frees in flight than the cache has fences per stream. The
/// memory another stream freed must still serve (behind a wait on the
/// GPU), so what the cache holds stays near what is live (36× before a
/// full set of fences recorded its newest again).
#[test]
fn streams_far_ahead_of_the_gpu_still_share_what_they_free() {
    const CLIENTS: usize = 64;
    for seed in [2026, 42] {
        let gpu = SimGpu::builder().manual().build();
        let device = Device::simulated(&gpu, STREAMS);
        let cache = CachingResource::new(Arc::new(SimResource::new(&device)));
        let streams: Vec<_> = (0..STREAMS)
            .map(|i| device.stream(i).expect("stream"))
            .collect();
        let mut shapes: Vec<_> = (0..CLIENTS)
            .map(|c| Shapes::new(seed, c, Dims::BENCH))
            .collect();
        let mut live: Vec<Option<(Vec<DeviceBlock>, usize)>> = (0..CLIENTS).map(|_| None).collect();
        let mut rng = fastrand::Rng::with_seed(seed);
        let (mut now, mut peak) = (0, 0);
        for _ in 0..CLIENTS * 60 {
            let client = rng.usize(0..CLIENTS);
            let stream = streams[client % STREAMS];
            match live[client].take() {
                None => {
                    let shape = shapes[client].next_shape();
                    let blocks = request_buffers(&cache, shape, stream);
                    let writes: Vec<_> = blocks.iter().map(MemAccess::write).collect();
                    gpu.launch_kernel(device.raw(stream).expect("raw"), &writes)
                        .expect("kernel");
                    now += shape.bytes(&Dims::BENCH);
                    peak = peak.max(now);
                    live[client] = Some((blocks, shape.bytes(&Dims::BENCH)));
                }
                Some((blocks, bytes)) => {
                    for block in blocks {
                        cache.deallocate(block).expect("free");
                    }
                    now -= bytes;
                }
            }
            // Fewer operations run than the clients queue.
            for _ in 0..rng.usize(0..3) {
                gpu.step();
            }
        }
        let held = gpu.memory_held().expect("held").high;
        let ratio = held as f64 / peak as f64;
        assert!(ratio <= 1.25, "seed {seed}: held {ratio:.3}x the live peak");
        gpu.run_until_idle();
        assert!(gpu.races().is_empty(), "races: {:?}", gpu.races());
    }
}

/// `service_bench --budget-quarter`: under a budget of a quarter of the
/// peak demand, each request taking its three buffers as one unit, and
/// the same service awaiting them one by one behind a tokio `Semaphore`
/// that mirrors the budget, answer every request, with no race and
/// nothing outstanding after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quarter_budget_serves_every_request_reserved_and_behind_a_semaphore() {
    use streamalloc::{Budget, CacheConfig, ResourceBuilder};
    use streamalloc_measure::service::streamalloc_way::{Level, Memory};

    let gpu = SimGpu::builder()
        .seed(7)
        .op_latency(std::time::Duration::from_micros(2))
        .build();
    let device = Device::simulated(&gpu, STREAMS);
    let kernels = Arc::new(SimKernels::new(gpu.clone()));
    for clients in [16, 64] {
        let limit = streamalloc_way::quarter_budget(&Dims::BENCH, clients);
        assert!(limit < clients * streamalloc_way::max_request_bytes(&Dims::BENCH));
        for memory in [
            Memory::Reserved,
            Memory::Semaphore {
                permits: streamalloc_way::semaphore_permits(limit),
            },
        ] {
            let budget = Budget::new(limit);
            let layers = ResourceBuilder::new()
                .cache(CacheConfig::default())
                .budget(&budget);
            let res = AsyncResource::build(&device, &layers).unwrap().into_any();
            let level = Level {
                dims: Dims::BENCH,
                clients,
                requests_per_client: 3,
                seed: 42,
                memory,
            };
            let row = streamalloc_way::run_level_observed(&res, &kernels, level, &mut |_| {})
                .await
                .unwrap_or_else(|e| panic!("{memory:?} at {clients} clients: {e}"));
            assert_eq!(
                row.requests,
                clients * 3,
                "{memory:?}: every request answered"
            );
            assert_eq!(row.way, memory.way_name());
            assert!(budget.peak() <= limit, "{memory:?}: the budget was passed");
            let left = streamalloc_way::release_all(&res).await.unwrap();
            assert_eq!(left, 0, "{memory:?}: 0 B outstanding at the end");
            assert_eq!(budget.in_use(), 0);
        }
    }
    assert!(gpu.races().is_empty(), "races: {:?}", gpu.races());
}
