//! Devices: a backend and its streams, held together.
//!
//! A resource allocates on one device, orders its work on that device's
//! streams, and the futures layer records events on the same backend. A
//! [`Device`] holds both halves — the [`Gpu`] backend and the [`StreamPool`]
//! that owns its streams — so that they travel as one value and cannot
//! disagree on the device:
//!
//! ```text
//!  Device<G>        Arc<G: Gpu>  +  Arc<StreamPool>      (cheap to clone)
//!   ├ StreamOrderedResource::new(&device)
//!   ├ AsyncResource::on(&device) / AsyncResource::with_device(stack, &device)
//!   ├ MemsetPoisonFill::new(&device, byte)
//!   └ LaunchRecorder::launch(&device, enqueue)
//! ```
//!
//! # Opening a device
//!
//! Most programs hold a `Device` (that is, `Device<`[`Backend`]`>`), which is
//! CUDA or the simulator behind one type:
//!
//! - [`Device::open`]: CUDA device `n` when `libcuda` loads and the device
//!   opens, else a simulated device (set `STREAMALLOC_DEVICE=sim` to force
//!   the simulator, for instance in CI on a GPU machine);
//! - [`Device::cuda`]: CUDA device `n`, or an error;
//! - [`Device::sim`]: a [`SimGpu`] you built, whose
//!   race detector and fault injection stay reachable through
//!   [`Device::simulator`].
//!
//! [`Backend`] is an enum, not a trait object: each driver call is one
//! `match` on a two-valued tag that never changes, which the branch
//! predictor gets right every time (about a nanosecond, against the
//! microseconds of a CUDA driver call), and no vtable stands between the
//! resource and the backend. Code that wants the backend's type anyway uses
//! the typed path: [`Device::new`] over any [`Gpu`], or
//! [`Device::simulated`], giving a `Device<SimGpu>` for a
//! [`SimResource`](crate::SimResource).
//!
//! # Examples
//! ```
//! use streamalloc::{AllocTag, Device, DeviceMemoryResource, StreamOrderedResource};
//!
//! // CUDA device 0 when there is one, else the simulator.
//! let device = Device::open(0, 2);
//! let resource = StreamOrderedResource::new(&device);
//! let block = resource.allocate(1 << 20, device.stream(0)?, AllocTag("weights"))?;
//! resource.deallocate(block)?;
//! # Ok::<(), streamalloc::ResourceError>(())
//! ```

#![deny(unsafe_code)]

mod backend;
pub(crate) mod deferred_frees;
pub(crate) mod graph_memory;
mod open;
mod stream_handles;
pub(crate) mod stream_pool;

use std::fmt;
use std::sync::Arc;

pub use backend::Backend;
pub use open::DEVICE_ENV;
pub use stream_pool::StreamPool;

use crate::error::{ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::gpu::sim::SimGpu;
use crate::types::{RawStream, StreamId};

/// One device: its [`Gpu`] backend and the [`StreamPool`] of its streams.
///
/// `G` defaults to [`Backend`] (CUDA or the simulator, chosen at run time);
/// [`Device::open`], [`Device::simulated`] and [`Device::new`] make one
/// (the essay of `src/device/` compares them). Cloning
/// shares the backend and the streams.
pub struct Device<G: Gpu = Backend> {
    gpu: Arc<G>,
    streams: Arc<StreamPool>,
}

impl<G: Gpu> Device<G> {
    /// The device of backend `gpu`, with the streams of `streams`.
    ///
    /// The pool must hold `gpu`'s own streams: its device is checked, and
    /// its context where the crate made or checked the streams (every
    /// constructor but the `unsafe` [`StreamPool::from_raw`], whose caller
    /// vouches for it), against [`Gpu::context_id`]. (A simulated device
    /// also refuses another simulated host's streams at every call.)
    ///
    /// # Errors
    /// [`ResourceError::WrongDevice`] when the pool's streams belong to
    /// another device than `gpu`, [`ResourceError::WrongContext`] when they
    /// belong to another context of that device (another `CudaContext`,
    /// another `SimGpu` of the same ordinal).
    pub fn new(gpu: Arc<G>, streams: Arc<StreamPool>) -> ResourceResult<Self> {
        ResourceError::check_device(gpu.ordinal(), streams.device())?;
        if streams.context_id().is_some_and(|c| c != gpu.context_id()) {
            return Err(ResourceError::WrongContext {
                device: gpu.ordinal(),
            });
        }
        Ok(Device { gpu, streams })
    }

    /// The device of parts known to agree (a resource's own).
    pub(crate) fn from_parts(gpu: Arc<G>, streams: Arc<StreamPool>) -> Self {
        Device { gpu, streams }
    }

    /// The backend.
    pub fn gpu(&self) -> &Arc<G> {
        &self.gpu
    }

    /// The device's streams.
    pub fn streams(&self) -> &Arc<StreamPool> {
        &self.streams
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> u32 {
        self.streams.device()
    }

    /// The id of the stream at `index` of the pool.
    ///
    /// # Errors
    /// [`ResourceError::UnknownStream`] when the pool has no stream there.
    pub fn stream(&self, index: usize) -> ResourceResult<StreamId> {
        self.streams.id(index).ok_or(ResourceError::UnknownStream {
            stream: StreamId::new(self.ordinal(), index.try_into().unwrap_or(u32::MAX)),
            pool_len: self.streams.len(),
        })
    }

    /// The backend handle of `stream`, to queue work on it.
    ///
    /// # Errors
    /// As [`StreamPool::raw`].
    pub fn raw(&self, stream: StreamId) -> ResourceResult<RawStream> {
        self.streams.raw(stream)
    }
}

impl Device<SimGpu> {
    /// The typed device of the simulated `gpu`, with `streams` new streams.
    pub fn simulated(gpu: &Arc<SimGpu>, streams: usize) -> Self {
        Device {
            gpu: gpu.clone(),
            streams: gpu.stream_pool(streams),
        }
    }
}

impl<G: Gpu> Clone for Device<G> {
    fn clone(&self) -> Self {
        Device {
            gpu: self.gpu.clone(),
            streams: self.streams.clone(),
        }
    }
}

impl<G: Gpu + fmt::Debug> fmt::Debug for Device<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("gpu", &self.gpu)
            .field("streams", &self.streams.len())
            .finish()
    }
}

impl fmt::Display for Device<Backend> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} streams)", self.gpu, self.streams.len())
    }
}
