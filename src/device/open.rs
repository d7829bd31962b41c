//! Opening a device: CUDA when it can, the simulator otherwise.

use std::sync::Arc;

#[cfg(feature = "cuda")]
use super::StreamPool;
use super::{Backend, Device};
#[cfg(feature = "cuda")]
use crate::error::ResourceResult;
#[cfg(feature = "cuda")]
use crate::gpu::cuda::{CudaGpu, cuda_present};
use crate::gpu::sim::{SimGpu, SimGpuBuilder};

/// The environment variable that, set to `sim`, makes [`Device::open`] pick
/// the simulator even where CUDA works.
pub const DEVICE_ENV: &str = "STREAMALLOC_DEVICE";

impl Device<Backend> {
    /// CUDA device `ordinal` with `streams` new streams when `libcuda` loads
    /// and the device opens with a stream-ordered memory pool; otherwise a
    /// simulated device `ordinal` with the simulator's defaults (16 GiB,
    /// threaded).
    ///
    /// Set `STREAMALLOC_DEVICE=sim` to get the simulator regardless. Why
    /// CUDA was not used is logged (`tracing`, at info level); call
    /// [`Device::cuda`] to get the error instead.
    pub fn open(ordinal: u32, streams: usize) -> Self {
        Self::open_or_sim(ordinal, streams, SimGpu::builder())
    }

    /// As [`Device::open`], with the simulated device, if CUDA cannot be
    /// used, built by `fallback` (its ordinal is set to `ordinal`).
    pub fn open_or_sim(ordinal: u32, streams: usize, fallback: SimGpuBuilder) -> Self {
        if sim_forced() {
            tracing::info!("{DEVICE_ENV}=sim: using the simulated device");
        } else {
            #[cfg(feature = "cuda")]
            match Self::cuda(ordinal, streams) {
                Ok(device) => return device,
                Err(e) => tracing::info!(error = %e, "using the simulated device"),
            }
            #[cfg(not(feature = "cuda"))]
            tracing::info!("built without the `cuda` feature: using the simulated device");
        }
        Self::sim(&fallback.ordinal(ordinal).build(), streams)
    }

    #[cfg(feature = "cuda")]
    /// How many CUDA devices [`Device::open`] can use: 0 without `libcuda`,
    /// or when `STREAMALLOC_DEVICE=sim` is set.
    pub fn cuda_count() -> u32 {
        if sim_forced() || !cuda_present() {
            return 0;
        }
        cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as u32)
    }

    #[cfg(feature = "cuda")]
    /// CUDA device `ordinal` with `streams` new non-blocking streams.
    ///
    /// # Errors
    /// [`ResourceError::DeviceUnavailable`](crate::ResourceError::DeviceUnavailable)
    /// when `libcuda` cannot be loaded or the device cannot be opened;
    /// [`ResourceError::Driver`](crate::ResourceError::Driver) when it has no
    /// stream-ordered memory pools or a stream cannot be created.
    pub fn cuda(ordinal: u32, streams: usize) -> ResourceResult<Self> {
        let (gpu, streams) = cuda_parts(ordinal, streams)?;
        Ok(Device {
            gpu: Arc::new(Backend::Cuda(gpu)),
            streams,
        })
    }

    /// The simulated device `gpu`, with `streams` new streams. Its race
    /// detector and fault injection stay reachable through `gpu`, or
    /// [`Device::simulator`].
    pub fn sim(gpu: &Arc<SimGpu>, streams: usize) -> Self {
        Device {
            gpu: Arc::new(Backend::Sim(gpu.clone())),
            streams: gpu.stream_pool(streams),
        }
    }

    /// The simulated device, when this is one.
    pub fn simulator(&self) -> Option<&Arc<SimGpu>> {
        self.gpu.simulator()
    }
}

#[cfg(feature = "cuda")]
impl Device<CudaGpu> {
    /// The typed device of CUDA device `ordinal`, with `streams` new
    /// non-blocking streams.
    ///
    /// # Errors
    /// As [`Device::cuda`].
    pub fn open_cuda(ordinal: u32, streams: usize) -> ResourceResult<Self> {
        let (gpu, streams) = cuda_parts(ordinal, streams)?;
        Ok(Device {
            gpu: Arc::new(gpu),
            streams,
        })
    }
}

/// Whether `STREAMALLOC_DEVICE=sim` asks for the simulator.
fn sim_forced() -> bool {
    std::env::var(DEVICE_ENV).is_ok_and(|v| v == "sim")
}

#[cfg(feature = "cuda")]
/// Opens the context (checking for `libcuda` first), the memory pool and
/// the streams of CUDA device `ordinal`.
fn cuda_parts(ordinal: u32, streams: usize) -> ResourceResult<(CudaGpu, Arc<StreamPool>)> {
    let ctx = CudaGpu::open(ordinal)?;
    let gpu = CudaGpu::try_new(ctx.clone())?;
    let streams = StreamPool::cuda(&ctx, streams)?;
    Ok((gpu, streams))
}
