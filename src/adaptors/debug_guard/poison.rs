//! [`PoisonFill`]: what the guard writes into a block it quarantines;
//! [`MemsetPoisonFill`], one byte value over the block through the gpu seam.

#![allow(unsafe_code)]

use std::fmt;

use crate::device::Device;
use crate::error::{ResourceError, ResourceResult};
use crate::gpu::Gpu;
use crate::resource::StreamOrderedResource;
use crate::types::DeviceBlock;

/// Fills a block that is being quarantined, so that a reader that should no
/// longer read it sees garbage instead of stale data.
///
/// The guard calls [`fill`](Self::fill) between
/// [`prepare_block_use`](crate::DeviceMemoryResource::prepare_block_use) and
/// [`finish_block_use`](crate::DeviceMemoryResource::finish_block_use) of a
/// write on the block's allocation stream, so the fill is ordered after
/// every recorded use on other streams.
///
/// The guard calls `fill` without its state lock, holding only the lock
/// that orders deallocations: a fill may call the guard's block-use hooks
/// and [`block_state`](crate::DeviceMemoryResource::block_state), but must
/// not deallocate through, or flush, the same guard (that would deadlock).
pub trait PoisonFill: Send + Sync + 'static {
    /// Queues the fill of `block` on its allocation stream.
    ///
    /// # Errors
    /// The driver's error; the guard then leaves the block live.
    fn fill(&self, block: &DeviceBlock) -> ResourceResult<()>;
}

/// Poisons through the gpu seam: a `memset_async` of one byte value over the
/// whole block, on its allocation stream.
///
/// # Examples
/// ```
/// use streamalloc::{DebugGuardResource, MemsetPoisonFill, GuardConfig};
/// use streamalloc::{Device, StreamOrderedResource};
///
/// let device = Device::open(0, 1);
/// let resource = StreamOrderedResource::new(&device);
/// // SAFETY: the guard below is the poison's only user, and it fills only
/// // blocks live in `resource`, a resource of `device`.
/// let poison = unsafe { MemsetPoisonFill::new(&device, 0xA5) };
/// let guard = DebugGuardResource::new(resource, GuardConfig::new().poison(poison));
/// # drop(guard);
/// ```
pub struct MemsetPoisonFill<G: Gpu> {
    device: Device<G>,
    value: u8,
}

impl<G: Gpu> MemsetPoisonFill<G> {
    /// Fills with `value` on `device`.
    ///
    /// # Safety
    /// [`fill`](PoisonFill::fill) queues a `memset_async` over the block it is
    /// given, which no backend can check, so every block it is ever given
    /// (by the [`DebugGuardResource`](super::DebugGuardResource) it is configured into,
    /// which passes only blocks live in its inner resource, or by any other
    /// caller) must be:
    /// 1. an allocation of `device`'s backend whose free is not queued yet;
    /// 2. on a stream of `device`'s pool.
    pub unsafe fn new(device: &Device<G>, value: u8) -> Self {
        MemsetPoisonFill {
            device: device.clone(),
            value,
        }
    }

    /// Fills with `value` on the device of `resource`.
    ///
    /// # Safety
    /// Every block [`fill`](PoisonFill::fill) is ever given is live in
    /// `resource` (or in another resource of the same device): configure it
    /// into a [`DebugGuardResource`](super::DebugGuardResource) whose inner resource
    /// allocates from `resource`, and do not call `fill` with other blocks.
    pub unsafe fn for_resource(resource: &StreamOrderedResource<G>, value: u8) -> Self {
        // SAFETY: the device is `resource`'s; the caller's contract gives
        // `new`'s.
        unsafe { Self::new(&resource.device(), value) }
    }

    /// The poison byte.
    pub fn value(&self) -> u8 {
        self.value
    }
}

impl<G: Gpu> fmt::Debug for MemsetPoisonFill<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemsetPoisonFill")
            .field("device", &self.device.ordinal())
            .field("value", &self.value)
            .finish()
    }
}

impl<G: Gpu> PoisonFill for MemsetPoisonFill<G> {
    fn fill(&self, block: &DeviceBlock) -> ResourceResult<()> {
        let raw = self.device.raw(block.stream())?;
        // SAFETY: the constructor's contract: `block` is a live allocation of
        // the device's backend on a stream of its pool, which the device
        // keeps alive.
        unsafe {
            self.device
                .gpu()
                .memset_async(block.ptr(), self.value, block.size(), raw)
        }
        .map_err(ResourceError::from)
    }
}
