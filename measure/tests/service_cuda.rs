//! The inference service on a real GPU, the streamalloc and cudarc ways
//! (cuda-async is behind a feature: `service_bench` runs it): every request
//! answered with the right output, nothing outstanding. cuBLAS must be
//! loadable (`/usr/local/cuda/lib64` on `LD_LIBRARY_PATH`; `gpu-run.sh`
//! sets it).

use std::sync::Arc;

use streamalloc::AsyncResource;
use streamalloc::{CachingResource, Device, StreamOrderedResource};
use streamalloc_measure::service::cuda_model::CudaModel;
use streamalloc_measure::service::{Dims, cudarc_way, streamalloc_way};

const CLIENTS: usize = 16;
const PER_CLIENT: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a CUDA GPU"]
async fn both_ways_answer_every_request_right_on_cuda() {
    let device = Device::cuda(0, 4).expect("CUDA device 0");
    let ctx = device
        .gpu()
        .cuda()
        .expect("a CUDA backend")
        .context()
        .clone();
    let model = Arc::new(
        CudaModel::new(&ctx, Dims::BENCH, CLIENTS).expect("the model (is libcublas loadable?)"),
    );
    let expected = model.expected_output();
    assert!(expected.is_finite() && expected > 0.0);

    let inner = Arc::new(StreamOrderedResource::new(&device));
    let res =
        // SAFETY: the stack's bottom resource was made on this device.
        unsafe { AsyncResource::with_device(CachingResource::new(inner), &device) }.expect("async resource");
    let row = streamalloc_way::run_level(&res, &model, Dims::BENCH, CLIENTS, PER_CLIENT, 3)
        .await
        .expect("streamalloc level");
    assert_eq!(row.requests, CLIENTS * PER_CLIENT);
    assert!(row.peak_held >= row.peak_requested && row.peak_requested > 0);
    for client in 0..CLIENTS {
        assert!(
            model.output_matches(client, 16),
            "streamalloc, client {client}: wrong output"
        );
    }
    let left = streamalloc_way::release_all(&res).await.expect("release");
    assert_eq!(left, 0, "0 B outstanding at the end");

    let streams: Vec<_> = (0..4).map(|_| ctx.new_stream().expect("stream")).collect();
    let row = cudarc_way::run_level(&ctx, &streams, &model, CLIENTS, PER_CLIENT, 4)
        .await
        .expect("cudarc level");
    assert_eq!(row.requests, CLIENTS * PER_CLIENT);
    assert!(
        row.peak_blocked >= 1,
        "the cudarc way blocks a thread per wait"
    );
    for client in 0..CLIENTS {
        assert!(
            model.output_matches(client, 16),
            "cudarc, client {client}: wrong output"
        );
    }
}
