//! The process's allocators, one per device, made at their first call.
//!
//! # State
//!
//! One [`Devices`] for the process: the backend every device is opened on
//! (CUDA, or a simulated host), chosen once, and a slot per device ordinal
//! holding its [`DeviceAllocator`], or the error its opening gave.
//!
//! # Who changes it
//!
//! The first C call chooses the backend (CUDA, unless
//! `STREAMALLOC_DEVICE=sim`), unless [`simulate`] chose it before. The
//! first call naming a device opens it; a device that failed to open keeps
//! its error, and every later call reports it without trying again.
//!
//! # Bounded
//!
//! By [`MAX_DEVICES`] ordinals.

use std::cell::Cell;
use std::sync::{Arc, OnceLock};

use streamalloc::DEVICE_ENV;
use streamalloc::gpu::sim::SimGpu;
use streamalloc::{Backend, ResourceError};

use crate::allocator::DeviceAllocator;
use crate::context::KeepCurrentContext;

/// Device ordinals served (a node has at most 16 GPUs today).
pub(crate) const MAX_DEVICES: usize = 64;

/// Where devices are opened.
enum Host {
    /// CUDA device `n`'s primary context.
    Cuda,
    /// Simulated device `n` of this host.
    Sim(Vec<Arc<SimGpu>>),
}

/// The backend choice and the devices opened so far.
struct Devices {
    host: Host,
    slots: Vec<OnceLock<Result<DeviceAllocator, String>>>,
}

static DEVICES: OnceLock<Devices> = OnceLock::new();

fn devices_on(host: Host) -> Devices {
    Devices {
        host,
        slots: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
    }
}

/// Serves every later call on the simulated devices of `host` (device `n`
/// is `host[n]`) instead of CUDA: for tests of the C interface without a
/// GPU. The simulator's addresses are not memory a kernel can touch.
///
/// # Errors
/// `Err(())` when a call came first and the backend is chosen already.
#[allow(clippy::result_unit_err)]
pub fn simulate(host: Vec<Arc<SimGpu>>) -> Result<(), ()> {
    DEVICES.set(devices_on(Host::Sim(host))).map_err(|_| ())
}

fn devices() -> &'static Devices {
    DEVICES.get_or_init(|| {
        if std::env::var(DEVICE_ENV).is_ok_and(|v| v == "sim") {
            devices_on(Host::Sim(SimGpu::builder().build_host(1)))
        } else {
            devices_on(Host::Cuda)
        }
    })
}

fn open(host: &Host, ordinal: usize) -> Result<DeviceAllocator, String> {
    let config = crate::config::cache_config_from_env()?;
    backend(host, ordinal)
        .and_then(|gpu| DeviceAllocator::new(Arc::new(gpu), config))
        .map_err(|e| e.to_string())
}

/// Device `ordinal` of `host`.
fn backend(host: &Host, ordinal: usize) -> Result<Backend, ResourceError> {
    Ok(match host {
        Host::Sim(gpus) => Backend::Sim(
            gpus.get(ordinal)
                .ok_or(ResourceError::DeviceUnavailable {
                    device: ordinal as u32,
                    reason: format!("the simulated host has {} devices", gpus.len()),
                })?
                .clone(),
        ),
        Host::Cuda => {
            // PyTorch captures its streams itself: the crate must ask the
            // driver at each call, not only while a capture of its own runs.
            crate::captures::apply();
            // Opening retains the primary context and makes it current:
            // the thread gets its own back.
            let _keep = streamalloc::gpu::cuda::cuda_present().then(KeepCurrentContext::any);
            let ctx = streamalloc::gpu::cuda::CudaGpu::open(ordinal as u32)?;
            Backend::Cuda(streamalloc::gpu::cuda::CudaGpu::try_new(ctx)?)
        }
    })
}

thread_local! {
    /// The device the calling thread's last call named, and its allocator:
    /// PyTorch calls from a thread name the same device call after call.
    static LAST: Cell<(i32, Option<&'static DeviceAllocator>)> = const { Cell::new((-1, None)) };
}

/// The allocator of device `device`, opened at the first call.
///
/// # Errors
/// The reason the device cannot be served (an ordinal out of range, no
/// driver, no such device), the same at every call.
#[inline]
pub(crate) fn device(device: i32) -> Result<&'static DeviceAllocator, String> {
    match LAST.with(Cell::get) {
        (last, Some(allocator)) if last == device => Ok(allocator),
        _ => {
            let allocator = open_device(device)?;
            LAST.with(|l| l.set((device, Some(allocator))));
            Ok(allocator)
        }
    }
}

/// [`device`] past the thread's last device: the table's slot.
fn open_device(device: i32) -> Result<&'static DeviceAllocator, String> {
    let devices = devices();
    let slot = usize::try_from(device)
        .ok()
        .and_then(|d| devices.slots.get(d))
        .ok_or_else(|| format!("device {device} is out of range (0..{MAX_DEVICES})"))?;
    slot.get_or_init(|| open(&devices.host, device as usize))
        .as_ref()
        .map_err(Clone::clone)
}

/// The allocator of device `device` if a call opened it already.
pub(crate) fn opened(device: i32) -> Option<&'static DeviceAllocator> {
    let slot = DEVICES.get()?.slots.get(usize::try_from(device).ok()?)?;
    slot.get()?.as_ref().ok()
}
