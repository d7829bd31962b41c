//! Owned buffers on a real GPU through cudarc: copies, a PTX kernel, reads
//! on two streams, registered user streams. Run on the GPU machine with
//! `--include-ignored` (and under compute-sanitizer: see scripts/gpu-run.sh).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use streamalloc::AsyncResource;
use streamalloc::gpu::cuda::CudaGpu;
use streamalloc::{AllocTag, AsyncCudaResource, CudaBuffer, Device, ResourceError, StreamPool};
use streamalloc::{drop_error_count, take_drop_error};

const PTX: &str = include_str!("../examples/kernels/saxpy.ptx");
const N: usize = 1 << 16;
const TAG: AllocTag = AllocTag("cuda-buffer");

fn open(
    streams: usize,
) -> (
    Arc<CudaContext>,
    Arc<StreamPool>,
    AsyncResource<AsyncCudaResource>,
) {
    let device = Device::open_cuda(0, streams).expect("a CUDA device");
    let ctx = device.gpu().context().clone();
    let res = AsyncResource::on(&device).expect("async");
    (ctx, device.streams().clone(), res)
}

fn stream(pool: &StreamPool, i: usize) -> Arc<CudaStream> {
    pool.cuda_stream(pool.id(i).unwrap()).unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn htod_kernel_dtoh_on_two_streams_through_buffers() {
    let (ctx, pool, res) = open(2);
    let (io, compute) = (stream(&pool, 0), stream(&pool, 1));
    let saxpy = ctx
        .load_module(Ptx::from_src(PTX))
        .unwrap()
        .load_function("saxpy")
        .unwrap();
    let s0 = pool.id(0).unwrap();
    let x_host: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let mut x = CudaBuffer::new(res.allocate_buffer::<f32>(N, s0, TAG).await.unwrap()).unwrap();
    let mut y = CudaBuffer::new(res.allocate_buffer::<f32>(N, s0, TAG).await.unwrap()).unwrap();
    io.memcpy_htod(&x_host, &mut x).unwrap();
    io.memcpy_htod(&vec![1.0f32; N], &mut y).unwrap();
    let (a, n) = (3.0f32, N as u32);
    {
        let (xv, mut yv) = (x.on(&compute).unwrap(), y.on_mut(&compute).unwrap());
        let mut launch = compute.launch_builder(&saxpy);
        launch.arg(&a).arg(&xv).arg(&mut yv).arg(&n);
        // SAFETY: saxpy(float, const float*, float*, unsigned), N threads.
        unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }.unwrap();
    }
    // No host wait between the kernel on stream 1 and the copy on stream 0.
    let back = io.clone_dtoh(&y).unwrap();
    io.synchronize().unwrap();
    for (i, v) in back.iter().enumerate() {
        assert_eq!(*v, a * i as f32 + 1.0, "element {i}");
    }
    // A view: the second half only.
    let half = io.clone_dtoh(&y.slice(N / 2..).unwrap()).unwrap();
    io.synchronize().unwrap();
    assert_eq!(half.len(), N / 2);
    assert_eq!(half[0], a * (N / 2) as f32 + 1.0);
    drop((x, y));
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    ctx.check_err().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn written_on_one_stream_read_on_two_others_then_dropped() {
    let (ctx, pool, res) = open(3);
    let s0 = pool.id(0).unwrap();
    let host: Vec<u32> = (0..N as u32).collect();
    let mut x = CudaBuffer::new(res.allocate_buffer::<u32>(N, s0, TAG).await.unwrap()).unwrap();
    stream(&pool, 0).memcpy_htod(&host, &mut x).unwrap();
    for i in 1..3 {
        let s = stream(&pool, i);
        let back = s.clone_dtoh(&x).unwrap();
        s.synchronize().unwrap();
        assert_eq!(back, host, "read on stream {i}");
    }
    drop(x); // freed on stream 0 after both reads
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    ctx.check_err().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn one_future_per_launch_and_the_fill_helper() {
    let (ctx, pool, res) = open(2);
    let (s0, s1) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    let mut x = res.allocate_buffer::<u8>(N, s0, TAG).await.unwrap();
    x.fill_bytes_on(s0, 7).unwrap();
    let mut y = res.allocate_buffer::<u8>(N, s1, TAG).await.unwrap();
    let gpu = res.gpu().clone();
    let (xp, yp) = (x.block().ptr(), y.block().ptr());
    let ((), done) = res
        .launch(s1)
        .read(&x)
        .write(&mut y)
        .enqueue(|raw| {
            // SAFETY: `raw` is a stream of the resource's pool; both buffers
            // are live (owned here) and ordered on it by the launch.
            unsafe { gpu.copy_async(yp, xp, N, raw) }.map_err(|e| e.for_request(0, s1))
        })
        .unwrap();
    done.await.unwrap();
    let y = CudaBuffer::new(y).unwrap();
    let back = stream(&pool, 1).clone_dtoh(&y).unwrap();
    stream(&pool, 1).synchronize().unwrap();
    assert!(back.iter().all(|&b| b == 7));
    drop((x, y));
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
    ctx.check_err().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA GPU"]
async fn registered_user_streams_order_and_unregistered_ones_fail() {
    let ctx = CudaGpu::open(0).unwrap();
    let mine = vec![ctx.new_stream().unwrap(), ctx.new_stream().unwrap()];
    let pool = StreamPool::from_cuda_streams(mine.clone()).unwrap();
    assert_eq!(pool.find_cuda(&mine[1]), pool.id(1));
    let gpu = Arc::new(CudaGpu::try_new(ctx.clone()).unwrap());
    let res = AsyncResource::on(&Device::new(gpu, pool.clone()).unwrap()).unwrap();
    let host: Vec<f32> = (0..N).map(|i| i as f32 * 0.5).collect();
    let mut x = CudaBuffer::new(
        res.allocate_buffer::<f32>(N, pool.id(0).unwrap(), TAG)
            .await
            .unwrap(),
    )
    .unwrap();
    mine[0].memcpy_htod(&host, &mut x).unwrap();
    let back = mine[1].clone_dtoh(&x).unwrap();
    mine[1].synchronize().unwrap();
    assert_eq!(back, host);

    // A stream the pool does not hold: the copy fails instead of racing.
    let stranger = ctx.new_stream().unwrap();
    let errors = drop_error_count();
    let _ = take_drop_error();
    let r = stranger.clone_dtoh(&x);
    assert!(r.is_err() || ctx.check_err().is_err(), "refused");
    let _ = ctx.check_err();
    assert_eq!(drop_error_count(), errors + 1);
    assert!(matches!(
        take_drop_error(),
        Some(ResourceError::UnregisteredStream { device: 0 })
    ));
    assert!(x.on(&stranger).is_err());
    drop(x);
    res.reap_pending().await.unwrap();
    assert_eq!(res.bytes_outstanding(), 0);
}
