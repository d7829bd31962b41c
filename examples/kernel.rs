//! A real kernel through owned buffers: saxpy (`y = a·x + y`), compiled from
//! `examples/kernels/saxpy.cu` into the committed `saxpy.ptx` and loaded with
//! cudarc's `Ptx::from_src` (no NVRTC at run time). Stream 0 copies in and
//! out, stream 1 computes; the buffers order the two, and free themselves.
//!
//! On the simulated device the kernel is its declared reads and writes (for
//! the race detector) plus a host closure standing for its arithmetic, run
//! when the stream reaches it.
//!
//! ```text
//! cargo run --example kernel              # real GPU if present, else simulated
//! cargo run --example kernel -- --sim
//! cargo run --example kernel -- plant     # a read that escapes the ordering: caught
//! ```

use std::error::Error;
use std::sync::{Arc, Mutex};

use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use streamalloc::AsyncResource;
use streamalloc::gpu::sim::{MemAccess, SimGpu};
use streamalloc::{
    AllocTag, Backend, CudaBuffer, Device, RawStream, ResourceError, StreamOrderedResource,
};

const PTX: &str = include_str!("kernels/saxpy.ptx");
const N: usize = 1 << 20;
const A: f32 = 2.0;

fn host_inputs() -> (Vec<f32>, Vec<f32>) {
    ((0..N).map(|i| i as f32).collect(), vec![1.0; N])
}

fn check(y: &[f32]) {
    let wrong = (0..N).filter(|&i| y[i] != A * i as f32 + 1.0).count();
    assert_eq!(wrong, 0, "{wrong} wrong elements");
    println!("saxpy over {N} elements: correct");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn Error>> {
    let plant = std::env::args().any(|a| a == "plant");
    // CUDA device 0 when there is one, else a simulated device.
    let device = Device::open_or_sim(0, 2, SimGpu::builder().capacity(64 << 20));
    println!("device: {device}");
    let res = AsyncResource::on(&device)?;
    match device.simulator() {
        Some(sim) => {
            on_sim(&res, sim, plant).await?;
            let races = sim.races();
            println!("race detector: {} race(s)", races.len());
            assert_eq!(races.is_empty(), !plant, "{races:?}");
        }
        None => on_cuda(&res, plant).await?,
    }
    Ok(())
}

async fn on_cuda(
    res: &AsyncResource<StreamOrderedResource<Backend>>,
    plant: bool,
) -> Result<(), Box<dyn Error>> {
    let pool = res.stream_pool().clone();
    let (io, compute) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    let (io_s, compute_s) = (
        pool.cuda_stream(io)?.clone(),
        pool.cuda_stream(compute)?.clone(),
    );
    let saxpy = io_s
        .context()
        .load_module(Ptx::from_src(PTX))?
        .load_function("saxpy")?;
    let (x_host, y_host) = host_inputs();

    let mut x = CudaBuffer::new(res.allocate_buffer::<f32>(N, io, AllocTag("x")).await?)?;
    let mut y = CudaBuffer::new(res.allocate_buffer::<f32>(N, io, AllocTag("y")).await?)?;
    io_s.memcpy_htod(&x_host, &mut x)?; // writes on stream 0
    io_s.memcpy_htod(&y_host, &mut y)?;
    let n = N as u32;
    let cfg = LaunchConfig::for_num_elems(n);
    if plant {
        // The bug: x's raw address read on stream 1, which nothing has
        // ordered after x's allocation and copy on stream 0.
        let mut scratch = CudaBuffer::new(
            res.allocate_buffer::<f32>(N, compute, AllocTag("z"))
                .await?,
        )?;
        let escaped = x.block().ptr();
        let mut launch = compute_s.launch_builder(&saxpy);
        launch.arg(&A).arg(&escaped).arg(&mut scratch).arg(&n);
        // SAFETY: the argument types match saxpy's; the race is the point.
        unsafe { launch.launch(cfg) }?;
    }
    {
        // Bound to stream 1: it waits for the copies, and the frees wait for it.
        let (xv, mut yv) = (x.on(&compute_s)?, y.on_mut(&compute_s)?);
        let mut launch = compute_s.launch_builder(&saxpy);
        launch.arg(&A).arg(&xv).arg(&mut yv).arg(&n);
        // SAFETY: saxpy(float, const float*, float*, unsigned) takes these four
        // arguments; its N threads touch the N elements of x and y.
        unsafe { launch.launch(cfg) }?;
    }
    res.completion(compute)?.await?; // one future for the launch
    let y_back = io_s.clone_dtoh(&y)?; // stream 0 waits for the kernel's write
    res.completion(io)?.await?;
    check(&y_back);
    drop((x, y)); // freed on stream 0, after every use
    res.reap_pending().await?;
    assert_eq!(res.bytes_outstanding(), 0);
    Ok(())
}

/// A simulated launch: the accesses for the race detector, then the host
/// closure that stands for the kernel's arithmetic.
fn sim_kernel(
    gpu: &SimGpu,
    raw: RawStream,
    accesses: &[MemAccess],
    body: impl FnOnce() + Send + 'static,
) -> streamalloc::ResourceResult<()> {
    gpu.launch_kernel(raw, accesses)
        .map_err(ResourceError::from)?;
    gpu.launch_host_fn(raw, Box::new(body))
        .map_err(ResourceError::from)
}

async fn on_sim(
    res: &AsyncResource<StreamOrderedResource<Backend>>,
    gpu: &SimGpu,
    plant: bool,
) -> Result<(), Box<dyn Error>> {
    let pool = res.stream_pool().clone();
    let (io, compute) = (pool.id(0).unwrap(), pool.id(1).unwrap());
    let (raw_io, raw_compute) = (pool.raw(io)?, pool.raw(compute)?);
    // What the simulated device memory of x and y holds.
    let (x_dev, y_dev) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let (x_host, y_host) = host_inputs();

    let mut x = res.allocate_buffer::<f32>(N, io, AllocTag("x")).await?;
    let mut y = res.allocate_buffer::<f32>(N, io, AllocTag("y")).await?;
    for (buf, dev, host) in [(&mut x, &x_dev, x_host), (&mut y, &y_dev, y_host)] {
        let w = buf.write_on(io)?; // the copy in, on stream 0
        let dev = dev.clone();
        sim_kernel(gpu, raw_io, &[w.sim_access()], move || {
            *dev.lock().unwrap() = host
        })?;
    }
    let body = {
        let (x_dev, y_dev) = (x_dev.clone(), y_dev.clone());
        move || {
            let x = x_dev.lock().unwrap();
            for (y, x) in y_dev.lock().unwrap().iter_mut().zip(x.iter()) {
                *y += A * x;
            }
        }
    };
    let (xa, ya) = (MemAccess::read(x.block()), MemAccess::write(y.block()));
    if plant {
        // The bug: x's address on stream 1 with nothing ordering it after
        // the copy on stream 0.
        sim_kernel(gpu, raw_compute, &[xa], || {})?;
    }
    let ((), done) = res
        .launch(compute)
        .read(&x)
        .write(&mut y)
        .enqueue(|raw| sim_kernel(gpu, raw, &[xa, ya], body))?;
    done.await?;
    let y_back = Arc::new(Mutex::new(Vec::new()));
    {
        let r = y.read_on(io)?; // the copy out: stream 0 waits for the kernel
        let (src, dst) = (y_dev.clone(), y_back.clone());
        sim_kernel(gpu, raw_io, &[r.sim_access()], move || {
            *dst.lock().unwrap() = src.lock().unwrap().clone()
        })?;
    }
    res.completion(io)?.await?;
    check(&y_back.lock().unwrap());
    drop((x, y));
    res.reap_pending().await?;
    assert_eq!(res.bytes_outstanding(), 0);
    Ok(())
}
