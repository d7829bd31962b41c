//! One resource per device: a per-device registry, in the spirit of RMM's
//! per-device resource map.
//!
//! A service with several GPUs in one host keeps one resource per device
//! (each pinned to its ordinal) and looks the right one up by the device of
//! the stream it works on. The registry is the only shared state: a map from
//! ordinal to resource behind a read-write lock, written at set-up and read on
//! every lookup.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::util::sync::{RwLock, RwLockReadGuard};

use crate::error::{ResourceError, ResourceResult};
use crate::resource::DeviceMemoryResource;
use crate::types::{AllocTag, DeviceBlock, StreamId};

/// The resource of each device.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use streamalloc::gpu::sim::SimGpu;
/// use streamalloc::DeviceRegistry;
/// use streamalloc::{Device, AllocTag, DeviceMemoryResource, SimResource};
///
/// let registry: DeviceRegistry<SimResource> = DeviceRegistry::new();
/// for gpu in SimGpu::builder().build_host(2) {
///     let device = Device::simulated(&gpu, 1);
///     let ordinal = streamalloc::gpu::Gpu::ordinal(&*gpu);
///     registry.set(ordinal, Arc::new(SimResource::new(&device)))?;
/// }
/// assert_eq!(registry.devices(), vec![0, 1]);
/// let on_1 = registry.get(1)?;
/// let stream = on_1.stream_pool().id(0).unwrap();
/// let block = registry.allocate(4096, stream, AllocTag::UNTAGGED)?;
/// assert_eq!(block.device(), 1);
/// registry.deallocate(block)?;
/// # Ok::<(), streamalloc::ResourceError>(())
/// ```
#[derive(Debug)]
pub struct DeviceRegistry<R: ?Sized> {
    resources: RwLock<BTreeMap<u32, Arc<R>>>,
}

impl<R: ?Sized> Default for DeviceRegistry<R> {
    fn default() -> Self {
        DeviceRegistry {
            resources: RwLock::new(BTreeMap::new()),
        }
    }
}

impl<R: DeviceMemoryResource + ?Sized> DeviceRegistry<R> {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<u32, Arc<R>>> {
        self.resources.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the resource of `device`, returning the one it replaces.
    ///
    /// # Errors
    /// [`ResourceError::WrongDevice`] when `resource` serves another device;
    /// the registry is unchanged.
    pub fn set(&self, device: u32, resource: Arc<R>) -> ResourceResult<Option<Arc<R>>> {
        let serves = resource.device_ordinal();
        ResourceError::check_device(device, serves)?;
        Ok(self
            .resources
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(device, resource))
    }

    /// The resource of `device`.
    ///
    /// # Errors
    /// [`ResourceError::DeviceUnavailable`] when none is set.
    pub fn get(&self, device: u32) -> ResourceResult<Arc<R>> {
        self.read()
            .get(&device)
            .cloned()
            .ok_or_else(|| ResourceError::DeviceUnavailable {
                device,
                reason: "no resource is registered for this device".into(),
            })
    }

    /// Removes the resource of `device`, returning it.
    pub fn reset(&self, device: u32) -> Option<Arc<R>> {
        self.resources
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&device)
    }

    /// Ordinals with a resource, ascending.
    pub fn devices(&self) -> Vec<u32> {
        self.read().keys().copied().collect()
    }

    /// Allocates on the resource of `stream`'s device.
    ///
    /// # Errors
    /// As [`get`](Self::get) and [`DeviceMemoryResource::allocate`].
    pub fn allocate(
        &self,
        bytes: usize,
        stream: StreamId,
        tag: AllocTag,
    ) -> ResourceResult<DeviceBlock> {
        self.get(stream.device())?.allocate(bytes, stream, tag)
    }

    /// Deallocates on the resource of `block`'s device.
    ///
    /// # Errors
    /// As [`get`](Self::get) and [`DeviceMemoryResource::deallocate`].
    pub fn deallocate(&self, block: DeviceBlock) -> ResourceResult<()> {
        self.get(block.device())?.deallocate(block)
    }

    /// Bytes outstanding on every device.
    pub fn bytes_outstanding(&self) -> usize {
        self.read().values().map(|r| r.bytes_outstanding()).sum()
    }
}
