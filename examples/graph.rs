//! A decode-like step captured once into a CUDA graph and replayed 1,000
//! times from a tokio task.
//!
//! The step: two temporaries allocated inside the capture, a fill, a saxpy
//! (`scratch = a·hidden + scratch`), a copy, a second saxpy into the
//! persistent `logits`, and the two frees. Inside a capture these are graph
//! nodes: every replay allocates and frees the temporaries at the same
//! addresses, so the memory held stays flat however many replays run.
//! Each replay is awaited with the crate's futures (a point recorded after
//! the launch, outside the capture).
//!
//! Runs on CUDA device 0 when `libcuda` is present (the kernel is
//! `examples/kernels/saxpy.ptx`), on the simulated device otherwise (the
//! kernels are their declared reads and writes, checked by the race
//! detector):
//!
//! ```text
//! cargo run --example graph
//! cargo run --example graph -- 200   # replays (default 1000)
//! ```

use std::error::Error;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use streamalloc::gpu::{CaptureMode, CaptureStatus, Gpu};
use streamalloc::{AllocTag, AsyncResource, Backend, Buffer, Device, ResourceError, StreamId};

const PTX: &str = include_str!("kernels/saxpy.ptx");
/// Elements of each buffer.
const N: usize = 1 << 18;
const A: f32 = 0.5;

type BoxError = Box<dyn Error + Send + Sync>;

/// One saxpy launch (`y = a·x + y`) on the capturing stream: the real
/// kernel on CUDA, its reads and writes on the simulated device.
struct Saxpy {
    device: Device,
    cuda: Option<CudaFunction>,
}

impl Saxpy {
    fn load(device: &Device) -> Result<Self, BoxError> {
        let cuda = match device.gpu().cuda() {
            Some(gpu) => Some(
                gpu.context()
                    .load_module(Ptx::from_src(PTX))?
                    .load_function("saxpy")?,
            ),
            None => None,
        };
        Ok(Saxpy {
            device: device.clone(),
            cuda,
        })
    }

    fn launch(&self, s: StreamId, x: &Buffer<f32>, y: &mut Buffer<f32>) -> Result<(), BoxError> {
        let (r, w) = (x.read_on(s)?, y.write_on(s)?);
        match (&self.cuda, self.device.simulator()) {
            (Some(f), _) => {
                let stream = self.device.streams().cuda_stream(s)?;
                let (xp, yp, n) = (r.ptr(), w.ptr(), N as u32);
                let mut launch = stream.launch_builder(f);
                launch.arg(&A).arg(&xp).arg(&yp).arg(&n);
                // SAFETY: saxpy(float, const float*, float*, unsigned) takes
                // these four arguments (device addresses passed by value);
                // its N threads touch the N elements of x and y, both live
                // and ordered on `s` by the guards.
                unsafe { launch.launch(LaunchConfig::for_num_elems(n)) }?;
            }
            (None, Some(sim)) => {
                let raw = self.device.raw(s)?;
                sim.launch_kernel(raw, &[r.sim_access(), w.sim_access()])?;
            }
            (None, None) => return Err("no kernel for this backend".into()),
        }
        Ok(())
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), BoxError> {
    let replays: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(1000);
    // CUDA device 0 when there is one, else the simulated device.
    let device = Device::open(0, 2);
    println!("device: {device}");
    let res = AsyncResource::on(&device)?;
    let s = device.stream(0)?;
    let saxpy = Saxpy::load(&device)?;

    // What outlives a step is allocated before the capture.
    let mut hidden = res.allocate_buffer::<f32>(N, s, AllocTag("hidden")).await?;
    let mut logits = res.allocate_buffer::<f32>(N, s, AllocTag("logits")).await?;
    hidden.fill_bytes_on(s, 0)?;
    logits.fill_bytes_on(s, 0)?;
    res.completion(s)?.await?;

    // The step, captured once.
    let ((), graph) = res.capture_graph(s, CaptureMode::Relaxed, |capture| {
        let tag = AllocTag("step temporaries");
        let mut scratch = res.try_allocate_buffer::<f32>(N, s, tag)?;
        let mut attn = res.try_allocate_buffer::<f32>(N, s, tag)?;
        scratch.fill_bytes_on(s, 0)?;
        saxpy.launch(s, &hidden, &mut scratch)?;
        attn.copy_from_on(s, &scratch)?;
        saxpy.launch(s, &attn, &mut logits)?;
        // Awaiting inside the capture is refused, and leaves it valid.
        match res.completion(s) {
            Err(ResourceError::StreamCapturing { .. }) => {}
            other => return Err(format!("expected a refusal, got {other:?}").into()),
        }
        assert!(matches!(capture.status()?, CaptureStatus::Active(_)));
        Ok::<_, BoxError>(())
        // `scratch` and `attn` are freed here, inside the capture.
    })?;
    println!("captured {} on {s}: never invalidated", graph.capture());

    let held = |gpu: &Backend| gpu.memory_held().map(|h| h.current);
    let held_before = held(device.gpu())?;
    // Replayed from a tokio task, each replay awaited.
    let replayer = tokio::spawn(async move {
        for _ in 0..replays {
            // SAFETY: `hidden` and `logits`, the buffers the graph uses that
            // it did not allocate, are moved into this task and dropped only
            // after the last replay completed.
            unsafe { graph.launch(s) }?.await?;
        }
        Ok::<_, ResourceError>((graph, hidden, logits))
    });
    let (graph, hidden, logits) = replayer.await??;
    let held_after = held(device.gpu())?;
    println!(
        "{} replays; memory held before {} B, after {} B",
        graph.launches(),
        held_before,
        held_after
    );
    if held_after != held_before {
        return Err("memory held grew across replays".into());
    }
    drop(graph);
    drop((hidden, logits));
    res.reap_pending().await?;
    println!("bytes outstanding at the end: {}", res.bytes_outstanding());
    assert_eq!(res.bytes_outstanding(), 0);
    if let Some(sim) = device.simulator() {
        let races = sim.races();
        println!("race detector: {} race(s)", races.len());
        if !races.is_empty() {
            return Err(format!("{races:?}").into());
        }
    }
    Ok(())
}
